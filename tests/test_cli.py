"""``celery -A app leader status|step-down`` as real subprocesses against a real Redis."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from celery_leader.stores import open_store
from celery_leader.stores.base import Holder
from tests.servers import RedisServer, free_port

ROOT = Path(__file__).resolve().parent.parent
PASSWORD = "s3cretpw"

APP_MODULE = """\
import os

from celery import Celery

import celery_leader

app = Celery("cliapp", broker=os.environ["CLIAPP_BROKER"])
app.conf.leader_backend_url = os.environ["CLIAPP_STORE"]
if os.environ.get("CLIAPP_TTL"):
    app.conf.leader_lease_ttl = float(os.environ["CLIAPP_TTL"])
app.steps["worker"].add(celery_leader.LeaderElection)
"""

Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def leader_cli(tmp_path: Path, redis_server: RedisServer) -> Run:
    """Run ``celery -A cliapp leader ...``; the store defaults to the test's server."""
    (tmp_path / "cliapp.py").write_text(APP_MODULE)

    def run(
        *args: str, store: str | None = None, ttl: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(tmp_path), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        env["CLIAPP_BROKER"] = redis_server.url
        env["CLIAPP_STORE"] = store or redis_server.url
        env.pop("CLIAPP_TTL", None)
        if ttl is not None:
            env["CLIAPP_TTL"] = ttl
        return subprocess.run(
            [sys.executable, "-m", "celery", "-A", "cliapp", "leader", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    return run


def hold(url: str, name: str, holder: Holder, ttl: float = 30.0) -> int:
    """Take the lease *name* for *holder* (after one earlier term, so no hold-off); its token."""
    store = open_store(url, timeout=1)
    try:
        warm = store.acquire(name, Holder("id0", "w0@h", "h", 7), ttl=ttl)
        assert warm.acquired
        assert store.release(name, "id0")
        result = store.acquire(name, holder, ttl=ttl)
        assert result.acquired and result.token is not None
        assert result.hold_off == 0
        return result.token
    finally:
        store.close()


def one_json_object(stdout: str) -> dict:
    lines = stdout.strip().splitlines()
    assert len(lines) == 1, stdout
    payload = json.loads(lines[0])
    assert isinstance(payload, dict)
    return payload


def test_status_without_holder_exits_1(leader_cli: Run, redis_server: RedisServer) -> None:
    """status with nobody holding the lease exits 1 and says so, naming election and store."""
    proc = leader_cli("status")
    assert proc.returncode == 1, proc.stderr
    assert "cliapp" in proc.stdout
    assert redis_server.url in proc.stdout
    assert "leader:     none" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_status_json_without_holder(leader_cli: Run, redis_server: RedisServer) -> None:
    """status --json with no holder prints one object with name, store and leader null; exit 1."""
    proc = leader_cli("status", "--json")
    assert proc.returncode == 1, proc.stderr
    payload = one_json_object(proc.stdout)
    assert {"name", "store", "leader"} <= set(payload)
    assert payload["name"] == "cliapp"
    assert payload["store"] == redis_server.url
    assert payload["leader"] is None


def test_step_down_without_holder_exits_1(leader_cli: Run) -> None:
    """step-down with nobody holding the lease exits 1 and says no leader holds it."""
    proc = leader_cli("step-down")
    assert proc.returncode == 1, proc.stderr
    assert "no leader holds election 'cliapp'" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_status_json_describes_the_holder(leader_cli: Run, redis_server: RedisServer) -> None:
    """status --json with a holder exits 0 with its nodename, host, pid, token, times."""
    before = time.time()
    token = hold(redis_server.url, "cliapp", Holder("id1", "w1@h", "h", 42))
    proc = leader_cli("status", "--json")
    assert proc.returncode == 0, proc.stderr
    payload = one_json_object(proc.stdout)
    assert payload["name"] == "cliapp"
    assert payload["store"] == redis_server.url
    leader = payload["leader"]
    assert leader["nodename"] == "w1@h"
    assert leader["hostname"] == "h"
    assert leader["pid"] == 42
    assert type(leader["token"]) is int
    assert leader["token"] == token
    assert isinstance(leader["acquired_at"], float)
    assert before - 5 <= leader["acquired_at"] <= time.time() + 5
    assert isinstance(leader["expires_in"], float)
    assert 0 < leader["expires_in"] <= 30


def test_status_human_names_holder_and_token(leader_cli: Run, redis_server: RedisServer) -> None:
    """Plain status with a holder exits 0 and names the holder's nodename, pid and token."""
    token = hold(redis_server.url, "cliapp", Holder("id1", "w1@h", "h", 42))
    proc = leader_cli("status")
    assert proc.returncode == 0, proc.stderr
    assert "w1@h" in proc.stdout
    assert "pid 42" in proc.stdout
    assert str(token) in proc.stdout
    assert "holding off" not in proc.stdout


def test_status_beat_reads_the_beat_election(leader_cli: Run, redis_server: RedisServer) -> None:
    """--beat reads election "cliapp.beat", separate from the workers' "cliapp"."""
    token = hold(redis_server.url, "cliapp.beat", Holder("b1", "beat1@h", "h", 43))
    beat = leader_cli("status", "--beat", "--json")
    assert beat.returncode == 0, beat.stderr
    payload = one_json_object(beat.stdout)
    assert payload["name"] == "cliapp.beat"
    assert payload["leader"]["nodename"] == "beat1@h"
    assert payload["leader"]["pid"] == 43
    assert payload["leader"]["token"] == token
    workers = leader_cli("status", "--json")
    assert workers.returncode == 1, workers.stderr
    assert one_json_object(workers.stdout)["leader"] is None


def test_status_masks_the_store_password(leader_cli: Run, tmp_path: Path) -> None:
    """A store URL with a password is shown as :***@ in both outputs; the password never."""
    server = RedisServer(tmp_path, extra=["--requirepass", PASSWORD]).start()
    try:
        url = f"redis://:{PASSWORD}@127.0.0.1:{server.port}/0"
        token = hold(url, "cliapp", Holder("id1", "w1@h", "h", 42))
        masked = f"redis://:***@127.0.0.1:{server.port}/0"
        human = leader_cli("status", store=url)
        as_json = leader_cli("status", "--json", store=url)
    finally:
        server.stop()
    assert human.returncode == 0, human.stderr
    assert masked in human.stdout
    assert str(token) in human.stdout
    assert as_json.returncode == 0, as_json.stderr
    payload = one_json_object(as_json.stdout)
    assert payload["store"] == masked
    assert payload["leader"]["token"] == token
    for proc in (human, as_json):
        assert PASSWORD not in proc.stdout + proc.stderr


def test_status_wrong_password_exits_2_masked(leader_cli: Run, tmp_path: Path) -> None:
    """A store refusing the password: exit 2, one stderr line, the given password masked."""
    server = RedisServer(tmp_path, extra=["--requirepass", PASSWORD]).start()
    try:
        proc = leader_cli("status", store=f"redis://:wrong-{PASSWORD}@127.0.0.1:{server.port}/0")
    finally:
        server.stop()
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert PASSWORD not in proc.stdout + proc.stderr
    assert f"redis://:***@127.0.0.1:{server.port}/0" in lines[0]


@pytest.mark.parametrize("args", [("status",), ("status", "--json"), ("step-down",)], ids=" ".join)
def test_unreachable_store_exits_2_with_one_line(leader_cli: Run, args: tuple[str, ...]) -> None:
    """Nothing listening at the store: exit 2, exactly one stderr line, no traceback, masked."""
    port = free_port()
    proc = leader_cli(*args, store=f"redis://:{PASSWORD}@127.0.0.1:{port}/0")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"127.0.0.1:{port}" in lines[0]
    assert "***" in lines[0]
    assert PASSWORD not in proc.stdout + proc.stderr
    assert proc.stdout == ""


def test_bad_ttl_exits_2_naming_the_setting(leader_cli: Run) -> None:
    """leader_lease_ttl = 0: status exits 2 with one stderr line naming leader_lease_ttl."""
    proc = leader_cli("status", ttl="0")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "leader_lease_ttl" in lines[0]
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_step_down_unanswered_keeps_the_lease_and_exits_1(
    leader_cli: Run, redis_server: RedisServer
) -> None:
    """step-down to a holder with no live worker: exit 1 after --timeout, lease untouched."""
    token = hold(redis_server.url, "cliapp", Holder("id1", "w1@h", "h", 42))
    started = time.monotonic()
    proc = leader_cli("step-down", "--timeout", "0.5")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "w1@h did not release within 0.5 s" in proc.stdout
    assert time.monotonic() - started < 20
    store = open_store(redis_server.url, timeout=1)
    try:
        record = store.read("cliapp")
    finally:
        store.close()
    assert record is not None
    assert record.nodename == "w1@h"
    assert record.token == token
