"""PostgreSQL store: lifelines (a session lock the server drops with its process) and takeovers.

A real PostgreSQL server and real processes: the holder of a lifeline is
another Python process, killed or stopped by the test. What each test shows:

* SIGKILL ends the lifeline at once, and a reader sees it gone within a second;
* SIGSTOP does not: a stopped holder is not a dead one;
* ``pg_terminate_backend`` of the lifeline's session ends it while its process
  lives: the holder's next confirmation says so, and so does a session that
  lost its lock while its connection lives (what a pooler in transaction mode does);
* a server restart is a new session of readings (nothing seen before counts);
* a takeover is a compare-and-set on the dead term, and the term's lifeline
  key goes through acquire and read;
* a schema of the previous version that the role may not update works as before.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest

from celery_leader.exceptions import StoreError
from celery_leader.stores import Holder, open_store
from celery_leader.stores.base import LeaseRecord, LifelineEndedError, LifelineReading
from celery_leader.stores.postgres import PostgresLeaseStore
from harness.servers import PostgresServer
from tests.lease.test_election import wait_for

NAME = "job"
TTL = 10.0

#: A process that opens a lifeline, says its key, and confirms it until it ends (exit 3).
HOLDER = """
import sys, time
from celery_leader.stores import open_store
from celery_leader.stores.base import LifelineEndedError
store = open_store(sys.argv[1], timeout=1.0)
lifeline = store.open_lifeline()
print(lifeline.key, flush=True)
while True:
    try:
        lifeline.confirm(timeout=1.0)
    except LifelineEndedError:
        sys.exit(3)
    time.sleep(0.05)
"""


@pytest.fixture
def server() -> Iterator[PostgresServer]:
    running = PostgresServer().start()
    yield running
    running.stop()


@pytest.fixture
def store(server: PostgresServer) -> Iterator[PostgresLeaseStore]:
    opened = open_store(server.url, timeout=1.0)
    assert isinstance(opened, PostgresLeaseStore)
    yield opened
    opened.close()


@pytest.fixture
def holder_process(server: PostgresServer) -> Iterator[tuple[subprocess.Popen[str], str]]:
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


def test_sigkill_ends_the_lifeline_within_a_second(store, holder_process):
    """A holder process killed: another connection reads its lifeline gone, in the same session."""
    proc, key = holder_process
    first = store.read_lifelines([key])
    assert first.alive == {key}
    killed_at = time.monotonic()
    os.kill(proc.pid, signal.SIGKILL)
    gone = wait_for(lambda: not store.read_lifelines([key]).alive, timeout=2.0, step=0.005)
    latency = time.monotonic() - killed_at
    assert gone, "the lifeline of a killed process is still kept after 2 s"
    assert latency < 1.0, f"seen gone {latency:.3f} s after the SIGKILL"
    assert store.read_lifelines([key]).session == first.session
    print(f"PostgreSQL: SIGKILL -> lifeline read gone: {latency * 1000:.1f} ms")


def test_a_stopped_holder_keeps_its_lifeline(store, holder_process):
    """SIGSTOP for 3 s: the lifeline reads kept all along; after SIGCONT the holder confirms on."""
    proc, key = holder_process
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        stopped_until = time.monotonic() + 3.0
        while time.monotonic() < stopped_until:
            assert store.read_lifelines([key]).alive == {key}
            time.sleep(0.1)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    time.sleep(0.5)
    assert proc.poll() is None, "the holder's confirmation failed after SIGCONT"
    assert store.read_lifelines([key]).alive == {key}


def test_terminating_the_lifelines_session_ends_it_for_its_holder(store, server):
    """pg_terminate_backend of the lifeline's session: readers see it gone, its holder's
    next confirmation raises LifelineEndedError, and so does every one after it."""
    lifeline = store.open_lifeline()
    try:
        lifeline.confirm(timeout=1.0)
        assert store.read_lifelines([lifeline.key]).alive == {lifeline.key}
        with psycopg.connect(server.url, autocommit=True) as admin:
            (ended,) = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE application_name = 'celery-leader-lifeline'"
            ).fetchone()
        assert ended == 1
        assert wait_for(lambda: not store.read_lifelines([lifeline.key]).alive, timeout=2.0)
        with pytest.raises(LifelineEndedError):
            lifeline.confirm(timeout=1.0)
        with pytest.raises(LifelineEndedError):
            lifeline.confirm(timeout=1.0)
        assert lifeline.fileno() == -1
    finally:
        lifeline.close()


def test_a_session_that_lost_its_lock_is_an_ended_lifeline(store):
    """The connection lives but its session no longer holds the lock (what a pooler in
    transaction mode does when it moves a client): the confirmation says it ended."""
    lifeline = store.open_lifeline()
    try:
        lifeline.confirm(timeout=1.0)
        # The lifeline's own session lets go of its locks, as another session would see it.
        lifeline._conn.execute("SELECT pg_advisory_unlock_all()")
        with pytest.raises(LifelineEndedError, match="no longer holds its advisory lock"):
            lifeline.confirm(timeout=1.0)
    finally:
        lifeline.close()


def test_a_paused_server_times_a_confirmation_out(store, server):
    """No answer at all (the server stopped): confirm gives up near its timeout, with a
    StoreError that is not LifelineEndedError, and the lifeline is closed."""
    lifeline = store.open_lifeline()
    try:
        server.pause()
        started = time.monotonic()
        with pytest.raises(StoreError) as raised:
            lifeline.confirm(timeout=0.25)
        took = time.monotonic() - started
        assert not isinstance(raised.value, LifelineEndedError)
        assert 0.2 < took < 1.0, took
    finally:
        server.resume()
        lifeline.close()
    with pytest.raises(LifelineEndedError):
        lifeline.confirm(timeout=1.0)


def test_two_lifelines_have_two_keys_and_end_apart(store):
    """Each lifeline reads on its own; one closed leaves the other kept, and unknown keys
    (another store's, or junk) read as not kept."""
    one, two = store.open_lifeline(), store.open_lifeline()
    try:
        assert one.key != two.key
        keys = [one.key, two.key, "f" * 32, "not-a-key"]
        assert store.read_lifelines(keys).alive == {one.key, two.key}
        one.close()
        # The server ends the session (and its lock) once its backend has read the close:
        # milliseconds, more on a loaded machine.
        deadline = time.monotonic() + 5
        while store.read_lifelines(keys).alive != {two.key} and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store.read_lifelines(keys).alive == {two.key}
    finally:
        one.close()
        two.close()


def _reading_or_none(store: PostgresLeaseStore, key: str) -> LifelineReading | None:
    try:
        return store.read_lifelines([key])
    except StoreError:  # the server is coming back
        return None


def test_a_server_restart_is_a_new_session(store, server, holder_process):
    """Readings after a restart come from another session: what was seen before proves nothing."""
    _, key = holder_process
    before = store.read_lifelines([key])
    assert before.alive == {key}
    assert store.read_lifelines([key]).session == before.session, "one connection, one session"
    server.kill()
    server.start()
    after = wait_for(lambda: _reading_or_none(store, key), timeout=10.0, step=0.05)
    assert after is not None
    assert after.session != before.session
    assert not after.alive  # the restarted server never had it


def _held_by(store: PostgresLeaseStore, tag: str, lifeline: str) -> tuple[Holder, LeaseRecord]:
    """A term of holder *tag* tied to *lifeline*, with no hold-off, and its record."""
    holder = Holder(f"id-{tag}", f"node-{tag}", "host", 100, lifeline=lifeline)
    result = store.acquire(NAME, holder, TTL)
    assert result.acquired and result.hold_off == 0, result
    record = store.read(NAME)
    assert record is not None
    return holder, record


@pytest.fixture
def used_store(store: PostgresLeaseStore) -> PostgresLeaseStore:
    """The store after a first term (a new store holds its first holder off one ttl)."""
    assert store.acquire(NAME, Holder("first", "n", "h", 1), TTL).acquired
    assert store.release(NAME, "first")
    return store


def test_the_record_carries_the_lifeline_key(used_store):
    """The key of the holder's lifeline is written at acquire and read back by read and by a
    refused acquire; a holder without one is recorded with none."""
    store = used_store
    holder, record = _held_by(store, "old", "a" * 32)
    assert record.lifeline == "a" * 32
    refused = store.acquire(NAME, Holder("id-b", "node-b", "host", 1, lifeline="b" * 32), TTL)
    assert not refused.acquired and refused.holder is not None
    assert refused.holder.lifeline == "a" * 32
    assert store.release(NAME, holder.lease_id)
    _, bare = _held_by(store, "bare", "")
    assert bare.lifeline == ""


def test_take_over_is_a_compare_and_set_on_the_dead_term(used_store):
    """Refused while the lease is another term (token or lifeline); granted from the dead
    term itself, with a greater token and no hold-off; the old holder's renew then fails."""
    store = used_store
    old, record = _held_by(store, "old", "a" * 32)
    new = Holder("id-new", "node-new", "host", 200, lifeline="c" * 32)

    other_token = store.take_over(NAME, new, TTL, replace(record, token=record.token + 1))
    assert not other_token.acquired
    assert other_token.holder is not None and other_token.holder.nodename == "node-old"
    assert not store.take_over(NAME, new, TTL, replace(record, lifeline="b" * 32)).acquired
    assert not store.take_over(NAME, new, TTL, replace(record, lifeline="")).acquired

    taken = store.take_over(NAME, new, TTL, record)
    assert taken.acquired and taken.token is not None and taken.token > record.token
    assert taken.hold_off == 0.0, "freeing the dead term is no loss of data"
    assert not store.renew(NAME, old.lease_id, TTL)
    held = store.read(NAME)
    assert held is not None and held.nodename == "node-new" and held.lifeline == "c" * 32
    # The same dead term again: the lease is another term's now.
    third = Holder("id-third", "node-third", "host", 300)
    assert not store.take_over(NAME, third, TTL, record).acquired
    # A free lease: a takeover answers as an acquire.
    assert store.release(NAME, new.lease_id)
    assert store.take_over(NAME, third, TTL, record).acquired


def test_a_takeover_keeps_what_is_left_of_the_dead_terms_hold_off(store):
    """A term held off (the store had no record of earlier terms) that died: its successor
    waits out the rest of that hold-off, since a leader the store forgot may still act."""
    dead = Holder("id-dead", "node-dead", "host", 1, lifeline="a" * 32)
    first = store.acquire(NAME, dead, TTL)
    assert first.acquired and first.hold_off == TTL
    record = store.read(NAME)
    assert record is not None
    taken = store.take_over(NAME, Holder("id-next", "node-next", "host", 2), TTL, record)
    assert taken.acquired
    assert TTL - 1.0 < taken.hold_off <= TTL, taken


def test_a_takeover_after_a_restart_follows_the_acquire_rules(used_store, server):
    """A dead term of before a restart: taken over, held off until one ttl after the start."""
    store = used_store
    _, record = _held_by(store, "old", "a" * 32)
    server.kill()
    server.start()
    taken = wait_for(
        lambda: _taken_or_none(store, Holder("id-n", "node-n", "host", 2), record),
        timeout=10.0,
        step=0.05,
    )
    assert taken is not None and taken.acquired, taken
    assert taken.restarted_ago is not None and taken.hold_off > TTL - 2.0, taken


def _taken_or_none(store, holder, record):
    try:
        return store.take_over(NAME, holder, TTL, record)
    except StoreError:
        return None


SCHEMA_2 = (Path(__file__).parent / "postgres_schema_2.sql").read_text()


def test_a_schema_of_version_2_that_the_role_may_not_update_works_without_lifelines(server, caplog):
    """The previous version's schema, kept by its owner: the store's role acquires, reads and
    takes over as that version would (no lifeline recorded, no takeover of a held lease)."""
    caplog.set_level(logging.WARNING)
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute(SCHEMA_2)
        conn.execute("CREATE ROLE app LOGIN")
        conn.execute(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON celery_leader_lease, celery_leader_state,"
            " celery_leader_member TO app"
        )
        conn.execute("GRANT USAGE, UPDATE ON SEQUENCE celery_leader_token_seq TO app")
        conn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    app = open_store(server.url.replace("postgres@", "app@"), timeout=2)
    try:
        old = Holder("id-old", "node-old", "host", 1, lifeline="a" * 32)
        assert app.acquire(NAME, old, TTL).acquired
        record = app.read(NAME)
        assert record is not None and record.lifeline == ""
        dead = replace(record, lifeline="a" * 32)
        refused = app.take_over(NAME, Holder("id-new", "node-new", "host", 2), TTL, dead)
        assert not refused.acquired and refused.holder is not None
        assert refused.holder.nodename == "node-old"
    finally:
        app.close()
    assert [r for r in caplog.records if "from an earlier version" in r.getMessage()]
    owner = open_store(server.url, timeout=2)  # may update it: it does, keeping the term
    try:
        record = owner.read(NAME)
        assert record is not None and record.nodename == "node-old" and record.lifeline == ""
        # A term tied to no lifeline is never taken over: it ends at its expiry.
        assert not owner.take_over(
            NAME, Holder("id-new", "node-new", "host", 2), TTL, record
        ).acquired
        assert owner.release(NAME, "id-old")
        tied = Holder("id-new", "node-new", "host", 2, lifeline="c" * 32)
        assert owner.acquire(NAME, tied, TTL).acquired
        record = owner.read(NAME)
        assert record is not None and record.lifeline == "c" * 32
    finally:
        owner.close()


#: A leader: a LeaseManager tied to this process's lifeline; says "leading" once it leads.
LEADER = """
import sys, time
from celery_leader.lease import LeaseManager
from celery_leader.lease import lifeline
from celery_leader.lease.timing import LeaseTiming
from celery_leader.stores import open_store
timing = LeaseTiming.create(float(sys.argv[2]))
store = open_store(sys.argv[1], timeout=timing.op_timeout)
holder, monitor = lifeline.for_store(store, store.url)
holder.start()
assert holder.wait_opened(10)  # a term acquired before it is tied to no lifeline
manager = LeaseManager(store, "job", timing, lifeline=holder, lifelines=monitor)
manager.start()
assert manager.wait_for_leadership(30)
print("leading", flush=True)
time.sleep(600)
"""


def test_a_killed_leader_is_taken_over_long_before_its_lease_ends(store, server):
    """The lease managers' fast path on PostgreSQL: a leader process SIGKILLed is followed
    by a leader of another process within about a second, its 10 s lease still running."""
    from celery_leader.lease import LeaseManager, lifeline
    from celery_leader.lease.timing import LeaseTiming

    # Past a new store's first hold-off, so that the leader leads at once.
    assert store.acquire(NAME, Holder("first", "n", "h", 1), 1.0).acquired
    assert store.release(NAME, "first")
    proc = subprocess.Popen(
        [sys.executable, "-c", LEADER, server.url, str(TTL)], stdout=subprocess.PIPE, text=True
    )
    timing = LeaseTiming.create(TTL)
    follower_store = open_store(server.url, timeout=timing.op_timeout)
    holder, monitor = lifeline.for_store(follower_store, follower_store.url)
    follower = LeaseManager(follower_store, NAME, timing, lifeline=holder, lifelines=monitor)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "leading"
        record = store.read(NAME)
        assert record is not None and record.lifeline, "the leader's term is tied to its lifeline"
        follower.start()
        time.sleep(1.0)  # the follower sees the holder and reads its lifeline kept
        assert not follower.is_leader()
        killed_at = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)
        assert follower.wait_for_leadership(TTL / 2), "not taken over before half the ttl"
        took = time.monotonic() - killed_at
        print(f"PostgreSQL: leader SIGKILL -> next leader: {took * 1000:.0f} ms")
        assert took < 2.0, took
    finally:
        proc.kill()
        proc.wait()
        follower.stop()
        lifeline.close_all()
        follower_store.close()


def test_a_process_of_the_previous_version_acquires_on_through_the_upgrade(server):
    """A rolling upgrade: a process of version 2 calls the seven-argument acquire, which
    psycopg prepares after five calls; once a new process updated the schema, its prepared
    statement still answers (same columns), and the term it takes is tied to no lifeline."""
    acquire_2 = (
        "SELECT * FROM celery_leader_acquire(%s::text, %s::text, %s::text, %s::text,"
        " %s::integer, %s::bigint, %s::bigint)"
    )
    args = (NAME, "id-old", "node-old", "host", 1, int(TTL * 1e6), 0)
    with psycopg.connect(server.url, autocommit=True) as old:
        old.execute(SCHEMA_2)
        for _ in range(6):
            assert old.execute(acquire_2, args).fetchone()[0], "version 2 acquires"
        columns = len(old.execute(acquire_2, args).fetchone())
        new = open_store(server.url, timeout=2)  # brings the schema to version 3
        try:
            refused = new.acquire(NAME, Holder("id-new", "node-new", "host", 2, "a" * 32), TTL)
            assert not refused.acquired
            row = old.execute(acquire_2, args).fetchone()
            assert row[0] and len(row) == columns
            record = new.read(NAME)
            assert record is not None and record.nodename == "node-old" and record.lifeline == ""
        finally:
            new.close()
