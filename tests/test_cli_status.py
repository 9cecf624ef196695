"""What ``celery -A app leader status`` tells about the holder, against a real Redis.

The holder here is a lease taken through the store, as a worker's lease manager
takes it; the same views with real worker processes are in
tests/integration/test_leader_status.py.
"""

from __future__ import annotations

import re
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from celery_leader.stores import open_store
from celery_leader.stores.base import Holder
from harness.servers import RedisServer
from tests.test_cli import Run, celery_runner, hold, one_json_object

#: The CLI app's ttl in these tests, and so its renew interval (a third of it).
TTL = 3.0
RENEW = TTL / 3
#: What the hint names: the two ways to add the worker step.
STEP_LINE = 'app.steps["worker"].add(LeaderElection)'
INSTALL_CALL = "celery_leader.install(app)"


@pytest.fixture
def status_cli(tmp_path: Path, redis_server: RedisServer) -> Run:
    """``celery -A cliapp leader ...`` on the test's Redis, with a ttl of TTL seconds."""
    run = celery_runner(tmp_path, redis_server.url, redis_server.url)

    def with_ttl(*args: str) -> subprocess.CompletedProcess[str]:
        return run(*args, ttl=f"{TTL:g}")

    return with_ttl


def take_new(url: str, name: str, holder: Holder, ttl: float = 30.0) -> float:
    """The first acquire of *name* on a store that never had it: its hold-off (seconds)."""
    store = open_store(url, timeout=2)
    try:
        result = store.acquire(name, holder, ttl=ttl)
    finally:
        store.close()
    assert result.acquired
    assert result.hold_off > 0, "a new store holds off the first holder"
    return result.hold_off


# -- 1. the first holder of a new store holds off: it does not lead yet -----------


def test_status_during_hold_off_says_not_leading_yet(
    status_cli: Run, redis_server: RedisServer
) -> None:
    """A holder in its hold-off: 'holding off, not leading', until when; exit 0 (it holds)."""
    hold_off = take_new(redis_server.url, "cliapp", Holder("id1", "w1@h", "h", 42))
    before = time.time()
    proc = status_cli("status")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "leader:     none yet (its holder is holding off, not leading)" in out, out
    assert "holder:     w1@h (host h, pid 42)" in out, out
    until = re.search(r"holds off:  until (\S+ \S+) UTC \(([\d.]+) s from now\)", out)
    assert until, out
    end = datetime.strptime(until.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)
    assert before - 2 <= end.timestamp() <= before + hold_off + 2
    assert 0 < float(until.group(2)) <= hold_off
    assert "new or emptied store" in out


def test_status_json_during_hold_off_names_the_holder_not_leading(
    status_cli: Run, redis_server: RedisServer
) -> None:
    """--json in a hold-off: leader is the holder, with leading false and hold_off_until."""
    hold_off = take_new(redis_server.url, "cliapp", Holder("id1", "w1@h", "h", 42))
    before = time.time()
    proc = status_cli("status", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    payload = one_json_object(proc.stdout)
    assert payload["leader"] == payload["holder"]
    holder = payload["holder"]
    assert holder["nodename"] == "w1@h"
    assert holder["leading"] is False
    assert 0 < holder["hold_off"] <= hold_off
    assert before <= holder["hold_off_until"] <= before + hold_off + 2


def test_status_of_a_leading_holder_names_it_leader_and_exits_0(
    status_cli: Run, redis_server: RedisServer
) -> None:
    """Past the hold-off the holder leads: exit 0, leader == holder, leading true."""
    hold(redis_server.url, "cliapp", Holder("id1", "w1@h", "h", 42))
    proc = status_cli("status", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    payload = one_json_object(proc.stdout)
    assert payload["leader"] == payload["holder"]
    assert payload["leader"]["leading"] is True
    assert payload["leader"]["hold_off"] == 0
    assert payload["leader"]["hold_off_until"] is None


# -- 2. how long ago the holder renewed, and whether that is overdue ------------------


def test_status_shows_the_last_renewal_and_marks_a_silent_holder_overdue(
    status_cli: Run, redis_server: RedisServer
) -> None:
    """A holder that stops renewing: 'renewed: N s ago (overdue: renews every R s)', exit 0."""
    hold(redis_server.url, "cliapp", Holder("id1", "w1@h", "h", 42))
    fresh = status_cli("status")
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    line = re.search(r"renewed:    ([\d.]+) s ago \(renews every ([\d.]+) s\)", fresh.stdout)
    assert line, fresh.stdout
    assert float(line.group(1)) < 1.5 * RENEW + 2, "just acquired (the command takes a moment)"
    assert float(line.group(2)) == pytest.approx(RENEW, abs=0.05)
    time.sleep(1.5 * RENEW + 0.5)  # nobody renews the lease: its holder has stopped
    stale = status_cli("status")
    assert stale.returncode == 0, "the lease is still held until it expires"
    line = re.search(
        r"renewed:    ([\d.]+) s ago \(overdue: renews every ([\d.]+) s\)", stale.stdout
    )
    assert line, stale.stdout
    assert float(line.group(1)) >= 1.5 * RENEW + 0.5
    assert "stopped renewing" in stale.stdout


def test_status_json_has_renewed_ago_and_overdue(
    status_cli: Run, redis_server: RedisServer
) -> None:
    """--json: renewed_ago (seconds, the store's clock) and overdue, beside renew_interval."""
    hold(redis_server.url, "cliapp", Holder("id1", "w1@h", "h", 42))
    time.sleep(1.5 * RENEW + 0.5)
    payload = one_json_object(status_cli("status", "--json").stdout)
    assert payload["renew_interval"] == pytest.approx(RENEW, abs=0.001)
    assert payload["leader"]["renewed_ago"] >= 1.5 * RENEW + 0.5
    assert payload["leader"]["overdue"] is True


def test_status_of_a_renewing_holder_is_not_overdue(
    status_cli: Run, redis_server: RedisServer
) -> None:
    """A holder renewing as it should: renewed_ago below the interval, overdue false."""
    hold(redis_server.url, "cliapp", Holder("id1", "w1@h", "h", 42))
    store = open_store(redis_server.url, timeout=2)
    try:
        time.sleep(1.5 * RENEW + 0.5)
        assert store.renew("cliapp", "id1", 30.0)
        payload = one_json_object(status_cli("status", "--json").stdout)
    finally:
        store.close()
    assert payload["leader"]["renewed_ago"] < 1.5 * RENEW + 2
    assert payload["leader"]["renewed_ago"] < payload["leader"]["expires_in"]


# -- 3. nobody holds the lease: what can be told -------------------------------------


def test_status_on_a_store_no_worker_ever_used_hints_the_step(status_cli: Run) -> None:
    """No record at all: 'nobody holds the lease' and how a worker joins the election."""
    proc = status_cli("status")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "leader:     none: nobody holds the lease" in proc.stdout
    assert "no worker has ever held it in this store (new or emptied)" in proc.stdout
    assert STEP_LINE in proc.stdout and INSTALL_CALL in proc.stdout
    payload = one_json_object(status_cli("status", "--json").stdout)
    assert payload["leader"] is None and payload["holder"] is None
    assert payload["ever_held"] is False


def test_status_after_a_release_says_nobody_holds_it_without_the_step_hint(
    status_cli: Run, redis_server: RedisServer
) -> None:
    """Held once, released: 'nobody holds the lease', no hint about adding the step."""
    hold(redis_server.url, "cliapp", Holder("id1", "w1@h", "h", 42))
    store = open_store(redis_server.url, timeout=2)
    try:
        assert store.release("cliapp", "id1")
    finally:
        store.close()
    proc = status_cli("status")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "leader:     none: nobody holds the lease" in proc.stdout
    assert "held before" in proc.stdout
    assert STEP_LINE not in proc.stdout
    assert one_json_object(status_cli("status", "--json").stdout)["ever_held"] is True


def test_beat_status_on_a_store_no_beat_ever_used_hints_the_scheduler(status_cli: Run) -> None:
    """--beat with no record: the hint names LeaderScheduler, not the worker step."""
    proc = status_cli("status", "--beat")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "no beat has ever held it in this store (new or emptied)" in proc.stdout
    assert "celery_leader.beat:LeaderScheduler" in proc.stdout
    assert STEP_LINE not in proc.stdout
