"""Lifelines behind a real PgBouncer (Debian's ``pgbouncer``), in each of its pooling modes.

A lifeline must end when its process dies. Behind a pooler in transaction or
statement mode it would not: the pooler keeps the server session, and the
session's advisory lock with it, for its next client. Opening a lifeline
checks that a session ends with its connection (a probe connection's lock
must go when it closes) and refuses, with one line that names the cause,
when it does not; the store says so again at once on the next try, without
a second probe. In session mode PgBouncer releases a leaving client's locks
(``DISCARD ALL``): lifelines work, and a killed holder's is seen ended.
The leases themselves work through every mode once the schema is there (a
statement-mode pooler refuses the transaction that creates it).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from celery_leader.exceptions import StoreError
from celery_leader.stores import Holder, open_store, postgres_lifeline
from celery_leader.stores.postgres import PostgresLeaseStore
from celery_leader.stores.postgres_lifeline import ERR_SESSION_OUTLIVES
from harness.pgbouncer import PgBouncer
from harness.servers import PostgresServer
from tests.lease.test_election import wait_for
from tests.stores.test_postgres_lifeline import HOLDER

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server() -> Iterator[PostgresServer]:
    running = PostgresServer().start()
    yield running
    running.stop()


def _through(bouncer: PgBouncer) -> PostgresLeaseStore:
    opened = open_store(bouncer.url, timeout=2.0)
    assert isinstance(opened, PostgresLeaseStore)
    return opened


def _schema_installed(server: PostgresServer) -> None:
    """Install the store's tables straight on the server (a statement-mode pooler refuses the
    transaction that creates them)."""
    direct = open_store(server.url, timeout=2.0)
    try:
        assert direct.acquire("setup", Holder("setup", "w0", "h", 1), 1.0).acquired
    finally:
        direct.close()


@pytest.mark.parametrize("mode", ["transaction", "statement"])
def test_a_pooler_that_keeps_sessions_is_refused_with_one_line(server, mode):
    _schema_installed(server)
    bouncer = PgBouncer(server, mode).start()
    store = _through(bouncer)
    try:
        # The leases work through the pooler once the schema is there (one statement a call).
        assert store.acquire(f"job-{mode}", Holder("a", "w1", "h", 1), 10.0).acquired
        with pytest.raises(StoreError) as refused:
            store.open_lifeline()
        message = str(refused.value)
        assert ERR_SESSION_OUTLIVES in message
        assert "\n" not in message, "one line"
        assert "pooler" in message and "session-mode" in message
        started = time.monotonic()
        with pytest.raises(StoreError, match="outlived"):
            store.open_lifeline()
        assert time.monotonic() - started < 0.5, "the refusal is remembered, not probed again"
    finally:
        store.close()
        bouncer.stop()


def test_a_session_mode_pooler_passes_and_a_killed_holder_is_seen_ended(server):
    bouncer = PgBouncer(server, "session").start()
    store = _through(bouncer)
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, bouncer.url], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        key = proc.stdout.readline().strip()
        assert key, "the holder process did not open a lifeline through the session pooler"
        assert store.read_lifelines([key]).alive == {key}
        os.kill(proc.pid, signal.SIGKILL)
        gone = wait_for(lambda: not store.read_lifelines([key]).alive, timeout=3.0, step=0.01)
        assert gone, "a killed holder's lifeline is still kept behind a session-mode pooler"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        store.close()
        bouncer.stop()


def test_a_direct_connection_passes_the_check(server):
    """Straight to the server, a closed probe's session ends at once: lifelines open."""
    store = open_store(server.url, timeout=2.0)
    assert isinstance(store, PostgresLeaseStore)
    try:
        first = store.open_lifeline()
        first.confirm(timeout=1.0)
        first.close()
        second = store.open_lifeline()
        second.confirm(timeout=1.0)
        second.close()
    finally:
        store.close()


class _SeenHeld:
    """A look's answer that still saw the probe's lock (sent while its session was ending)."""

    status = psycopg.pq.ExecStatus.TUPLES_OK

    def get_value(self, row: int, column: int) -> bytes:
        return b"t"


def test_a_stall_after_a_look_that_saw_the_probe_is_not_a_pooler(server, monkeypatch):
    """The process stalled (the GIL, a starved CPU) past the wait right after a look that still
    saw the closing probe's lock: it looks once more before it refuses, and the session had
    ended by then. Refusing would have turned lifelines off for the process's whole life."""
    monkeypatch.setattr(postgres_lifeline, "SESSION_END_WAIT", 0.3)
    real = postgres_lifeline._round_trip
    looks = []

    def round_trip(pgconn, query, params, timeout):
        result = real(pgconn, query, params, timeout)
        if query == postgres_lifeline._HELD:
            looks.append(result)
            if len(looks) == 1:
                time.sleep(postgres_lifeline.SESSION_END_WAIT + 0.1)
                return _SeenHeld()
        return result

    monkeypatch.setattr(postgres_lifeline, "_round_trip", round_trip)
    store = open_store(server.url, timeout=2.0)
    assert isinstance(store, PostgresLeaseStore)
    try:
        lifeline = store.open_lifeline()
        lifeline.confirm(timeout=1.0)
        lifeline.close()
        assert len(looks) == 2, "one more look after the stall"
    finally:
        store.close()


def test_a_lock_of_the_same_ids_in_another_database_is_not_the_probes(server, monkeypatch):
    """Advisory locks are per database: another database's lifeline that drew the probe's
    31 bits holds another lock, and the probe's session still ended."""
    admin = psycopg.connect(server.url, autocommit=True)
    try:
        if not admin.execute("SELECT 1 FROM pg_database WHERE datname = 'other'").fetchone():
            admin.execute("CREATE DATABASE other")
    finally:
        admin.close()
    fixed = uuid.UUID("5eed0000000000000000000000000001")
    other = psycopg.connect(server.url.rsplit("/", 1)[0] + "/other", autocommit=True)
    try:
        other.execute(
            "SELECT pg_advisory_lock(%s::int4, %s::int4)",
            (postgres_lifeline.LOCK_SPACE, postgres_lifeline.lock_of(fixed.hex)),
        )
        monkeypatch.setattr(postgres_lifeline.uuid, "uuid4", lambda: fixed)
        monkeypatch.setattr(postgres_lifeline, "SESSION_END_WAIT", 0.3)
        store = open_store(server.url, timeout=2.0)
        assert isinstance(store, PostgresLeaseStore)
        try:
            lifeline = store.open_lifeline()
            lifeline.confirm(timeout=1.0)
            lifeline.close()
        finally:
            store.close()
    finally:
        other.close()
