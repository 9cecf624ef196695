"""Redis store: lifelines (a subscription the server drops when its process dies) and takeovers.

Real redis-server and real processes: the holder of a lifeline is another
Python process, killed or stopped by the test. What each test shows:

* SIGKILL ends the lifeline at once, and a reader sees it gone;
* SIGSTOP does not: a stopped holder is not a dead one;
* ``CLIENT KILL`` of the lifeline's connection ends it while its process
  lives: the holder's next confirmation says so;
* a server restart is a new session of readings (nothing seen before counts);
* a takeover is a compare-and-set on the dead term.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from celery_leader.stores import open_store
from celery_leader.stores.base import Holder, LifelineEndedError
from celery_leader.stores.redis import RedisLeaseStore
from celery_leader.stores.redis_lifeline import lifeline_channel
from harness.servers import RedisServer
from tests.lease.test_election import wait_for

NAME = "job"
TTL = 10.0

#: A process that opens a lifeline, says its key, and confirms it until told to stop.
HOLDER = """
import sys, time
from celery_leader.stores import open_store
store = open_store(sys.argv[1], timeout=1.0)
lifeline = store.open_lifeline()
print(lifeline.key, flush=True)
while True:
    lifeline.confirm(timeout=1.0)
    time.sleep(0.05)
"""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    started = RedisServer(tmp_path).start()
    yield started
    started.stop()


@pytest.fixture
def store(server: RedisServer) -> Iterator[RedisLeaseStore]:
    opened = open_store(server.url, timeout=1.0)
    assert isinstance(opened, RedisLeaseStore)
    yield opened
    opened.close()


@pytest.fixture
def holder_process(server: RedisServer) -> Iterator[tuple[subprocess.Popen[str], str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, server.url], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    key = proc.stdout.readline().strip()
    assert key, "the holder process did not open a lifeline"
    yield proc, key
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
    proc.wait()


def test_sigkill_ends_the_lifeline_at_once(store, holder_process):
    proc, key = holder_process
    first = store.read_lifelines([key])
    assert first.alive == {key}
    killed_at = time.monotonic()
    os.kill(proc.pid, signal.SIGKILL)
    gone = wait_for(lambda: not store.read_lifelines([key]).alive, timeout=2.0, step=0.005)
    latency = time.monotonic() - killed_at
    assert gone, "the lifeline of a killed process is still kept after 2 s"
    assert store.read_lifelines([key]).session == first.session
    print(f"SIGKILL -> lifeline gone: {latency * 1000:.1f} ms")


def test_a_stopped_holder_keeps_its_lifeline(store, holder_process):
    proc, key = holder_process
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        for _ in range(20):
            assert store.read_lifelines([key]).alive == {key}
            time.sleep(0.1)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    assert store.read_lifelines([key]).alive == {key}


def test_client_kill_ends_the_lifeline_and_its_holder_hears_it(store, server):
    lifeline = store.open_lifeline()
    try:
        lifeline.confirm(timeout=1.0)
        admin = redis.Redis.from_url(server.url)
        clients = admin.client_list()
        subscribed = [c for c in clients if lifeline_channel(lifeline.key) and c["sub"] == "1"]
        assert len(subscribed) == 1
        admin.client_kill_filter(_id=subscribed[0]["id"])
        admin.close()
        assert not store.read_lifelines([lifeline.key]).alive
        with pytest.raises(LifelineEndedError):
            lifeline.confirm(timeout=1.0)
    finally:
        lifeline.close()


def test_a_server_restart_is_a_new_session(store, server, holder_process):
    _, key = holder_process
    before = store.read_lifelines([key])
    assert before.alive == {key}
    server.stop()
    server.start()
    after = wait_for(lambda: _reading_or_none(store, key), timeout=5.0, step=0.05)
    assert after is not None
    assert after.session != before.session
    assert not after.alive  # the restarted server never had it: not "ended" in this session


def _reading_or_none(store: RedisLeaseStore, key: str):  # type: ignore[no-untyped-def]
    try:
        return store.read_lifelines([key])
    except Exception:  # noqa: BLE001 - the server is coming back
        return None


def test_take_over_is_a_compare_and_set_on_the_dead_term(store):
    warm = Holder.for_this_process("warm-up")  # a new store's first term holds off
    assert store.acquire(NAME, warm, TTL).acquired
    assert store.release(NAME, warm.lease_id)
    old = Holder.for_this_process("old")
    old = Holder(old.lease_id, old.nodename, old.hostname, old.pid, lifeline="a" * 32)
    first = store.acquire(NAME, old, TTL)
    assert first.acquired
    assert first.token is not None
    record = store.read(NAME)
    assert record is not None
    assert record.lifeline == "a" * 32
    new = Holder.for_this_process("new")

    other_term = store.take_over(
        NAME, new, TTL, _with(record, token=first.token + 1), min_token=first.token
    )
    assert not other_term.acquired
    other_key = store.take_over(NAME, new, TTL, _with(record, lifeline="b" * 32))
    assert not other_key.acquired

    taken = store.take_over(NAME, new, TTL, record)
    assert taken.acquired
    assert taken.token is not None
    assert taken.token > first.token
    assert taken.hold_off == 0.0
    assert not store.renew(NAME, old.lease_id, TTL)
    held = store.read(NAME)
    assert held is not None
    assert held.nodename == "new"
    # The same dead term again: the lease is another term's now.
    assert not store.take_over(NAME, Holder.for_this_process("third"), TTL, record).acquired


def _with(record, **changes):  # type: ignore[no-untyped-def]
    from dataclasses import replace

    return replace(record, **changes)


def test_a_term_taken_over_in_its_hold_off_passes_the_rest_of_it_on(server):
    """The holder the store forgot may act until the dead term's hold-off ends: the new
    term holds off until then too (not a whole ttl more, not less)."""
    fresh = open_store(server.url, timeout=1.0)
    try:
        old = Holder.for_this_process("old")
        old = Holder(old.lease_id, old.nodename, old.hostname, old.pid, lifeline="c" * 32)
        first = fresh.acquire(NAME, old, TTL)  # a new store: the first term holds off
        assert first.acquired
        assert first.hold_off > TTL - 1
        record = fresh.read(NAME)
        assert record is not None
        taken = fresh.take_over(NAME, Holder.for_this_process("new"), TTL, record)
        assert taken.acquired
        assert 0 < taken.hold_off <= first.hold_off
        assert taken.hold_off > TTL - 2
    finally:
        fresh.close()


def test_a_store_that_answers_late_pauses_the_term_and_it_resumes_unchanged(server):
    """Redis stopped for 0.6 s: the holder's confirmations come back late, so its term pauses
    (no token to run under) and resumes under the same token once they come back; the
    lifeline is not given up for an answer that is merely late, so no new term begins."""
    from celery_leader.lease import EventKind, LeaseManager, lifeline
    from celery_leader.lease.timing import LeaseTiming

    warm, first = open_store(server.url, timeout=1.0), Holder.for_this_process("warm-up")
    warm.acquire(NAME, first, 1.0)  # so that the test's term has no first-start hold-off
    warm.release(NAME, first.lease_id)
    warm.close()
    store = open_store(server.url, timeout=1.0)
    manager = LeaseManager(
        store,
        NAME,
        LeaseTiming.create(TTL),
        holder=Holder.for_this_process("h"),
        **lifeline.manager_options(store, server.url, enabled=True, label="the test"),
    )
    events = []
    manager.add_listener(events.append)
    manager.start()
    try:
        assert manager.wait_for_leadership(TTL * 2)
        token = manager.current_token()
        key = manager.state().lifeline
        assert token is not None and key, "the term is tied to a lifeline"
        assert server.proc is not None
        tokens = []
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            stopped = time.monotonic()
            while time.monotonic() - stopped < 0.6:
                tokens.append(manager.current_token())
                time.sleep(0.01)
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        assert None in tokens, "a term whose confirmations are late must pause"
        assert wait_for(lambda: manager.current_token() == token, 2.0), "the term did not resume"
        time.sleep(0.5)
        assert manager.current_token() == token
        assert manager.state().lifeline == key, "the term is still tied to its lifeline"
        ends = [e.kind for e in events if e.kind is not EventKind.RENEWED]
        assert ends == [EventKind.ELECTED], f"the term ended: {events}"
    finally:
        manager.stop()
        store.close()
        lifeline.close_all()
