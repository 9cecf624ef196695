"""A PostgreSQL restart that kept its data, and a store that really lost it.

A real cluster the test starts, restarted with its data (``kill -9`` and a
start, which recovers from the WAL) and recreated empty (tables dropped, or a
new data directory). After a restart the rows prove the earlier terms: the
next holder is held off only until one ttl after the server started (what a
holder that renewed just before the restart may still trust), nothing once
that passed, and nobody says the store lost its data. A store that lost it
still holds the next holder off one whole ttl, and says so.
"""

from __future__ import annotations

import logging
import shutil
import time

import psycopg
import pytest

from celery_leader.lease import LeaseManager
from celery_leader.lease.timing import LeaseTiming
from celery_leader.stores import Holder, open_store
from celery_leader.stores.postgres import WARN_SCHEMA_OUTDATED
from harness.servers import PostgresServer

LOST = "no record of earlier terms"
ACQUIRE = "celery_leader_acquire(text, text, text, text, integer, bigint, bigint)"


@pytest.fixture
def server():  # type: ignore[no-untyped-def]
    running = PostgresServer().start()
    yield running
    running.stop()


def started_at(server: PostgresServer) -> float:
    """The server's start time (unix, its clock)."""
    with psycopg.connect(server.url, autocommit=True) as conn:
        (started,) = conn.execute(
            "SELECT extract(epoch FROM pg_postmaster_start_time())::float8"
        ).fetchone()
    return float(started)


def test_a_restart_holds_off_only_until_one_ttl_after_the_start(server: PostgresServer) -> None:
    """The rows are there after the restart: the next holder waits what is left of one ttl
    from the server's start, says it was a restart, and a later one waits nothing."""
    store = open_store(server.url, timeout=2.0)
    try:
        assert store.acquire("job", Holder("a", "n", "h", 1), 1.0).acquired
        assert store.release("job", "a")
        before = store.acquire("job", Holder("b", "n", "h", 1), 1.0)
        assert before.acquired and before.hold_off == 0
        server.kill()
        server.start()
        start = started_at(server)
        time.sleep(1.1)  # b's lease ran out
        after = store.acquire("job", Holder("c", "n", "h", 1), 10.0)
        now = time.time()
        assert after.acquired and after.token is not None and before.token is not None
        assert after.token > before.token, "the sequence and the row came back"
        assert after.restarted_ago is not None, after
        assert 1.1 <= after.restarted_ago <= now - start + 0.05, after
        # Until one ttl (10 s) after the start, not 10 s after the acquire.
        assert after.hold_off == pytest.approx(10.0 - after.restarted_ago, abs=0.01), after
        assert store.release("job", "c")
        # Once a ttl from the start has passed, nothing is left to wait for.
        time.sleep(max(0.0, start + 1.1 - time.time()))
        later = store.acquire("job", Holder("d", "n", "h", 1), 1.0)
        assert later.acquired and later.hold_off == 0, later
    finally:
        store.close()


@pytest.mark.parametrize("how", ["tables dropped", "new data directory"])
def test_a_store_that_lost_its_data_still_holds_off_one_ttl(server: PostgresServer, how) -> None:  # type: ignore[no-untyped-def]
    """No row of the election after the loss: one whole ttl, and no restart named."""
    store = open_store(server.url, timeout=2.0)
    try:
        assert store.acquire("job", Holder("a", "n", "h", 1), 1.0).acquired
        assert store.release("job", "a")
        assert store.acquire("job", Holder("b", "n", "h", 1), 1.0).hold_off == 0
        if how == "tables dropped":
            with psycopg.connect(server.url, autocommit=True) as conn:
                conn.execute(
                    "DROP TABLE celery_leader_lease, celery_leader_state, celery_leader_member;"
                    " DROP SEQUENCE celery_leader_token_seq"
                )
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE application_name = 'celery-leader'"
                )
        else:
            server.kill()
            shutil.rmtree(server.data, ignore_errors=True)
            server.start()  # a new cluster in a new data directory
        time.sleep(1.1)
        after = store.acquire("job", Holder("c", "n", "h", 1), 2.0)
        assert after.acquired and after.hold_off == 2.0, after
        assert after.restarted_ago is None, after
    finally:
        store.close()


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_the_leader_after_a_restart_says_restart_and_after_a_loss_says_lost(
    server: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The lease manager's own words: after a restart that kept the rows, nothing of lost
    data; after the tables were dropped, the store has no record of earlier terms."""
    caplog.set_level(logging.WARNING)
    timing = LeaseTiming.create(2.0)
    store = open_store(server.url, timeout=timing.op_timeout)
    manager = LeaseManager(store, "job", timing)
    try:
        manager.start()
        assert manager.wait_for_leadership(10)  # a new store: held off one ttl, said so
        assert sum(LOST in line for line in _warnings(caplog)) == 1
        caplog.clear()
        server.kill()
        time.sleep(2.5)  # down past the lease: the leader declares loss
        assert not manager.is_leader()
        server.start()
        assert manager.wait_for_leadership(10)
        said = _warnings(caplog)
        assert not [line for line in said if LOST in line or "lost its data" in line], said
        # Held off (unless it came back a ttl after the start), and told why.
        held = [line for line in said if "before leading" in line]
        assert len(held) <= 1 and all("server restarted" in line for line in held), said

        caplog.clear()
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute("DROP TABLE celery_leader_lease")
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = 'celery-leader'"
            )
        deadline = time.monotonic() + 15
        while not [line for line in _warnings(caplog) if LOST in line]:
            assert time.monotonic() < deadline, _warnings(caplog)
            time.sleep(0.1)
    finally:
        manager.stop()
        store.close()


def test_an_earlier_versions_schema_is_brought_up_to_date_or_used_as_it_is(
    server: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A schema without this version's mark: its owner's store runs DDL again on connect; a
    role that may not works with it as it is and is told once what to run."""
    caplog.set_level(logging.WARNING)
    owner = open_store(server.url, timeout=2)
    try:
        assert owner.acquire("job", Holder("a", "n", "h", 1), 5.0).acquired  # the schema
    finally:
        owner.close()
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute(f"COMMENT ON FUNCTION {ACQUIRE} IS NULL")  # as an earlier version left it
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                     " WHERE application_name = 'celery-leader'")  # fmt: skip
        conn.execute("CREATE ROLE app LOGIN")
        conn.execute(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON celery_leader_lease, celery_leader_state,"
            " celery_leader_member TO app"
        )
        conn.execute("GRANT USAGE, UPDATE ON SEQUENCE celery_leader_token_seq TO app")
        conn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    app = open_store(server.url.replace("postgres@", "app@"), timeout=2)
    try:
        refused = app.acquire("job", Holder("b", "n", "h", 1), 5.0)
        assert not refused.acquired and refused.holder is not None, "it works as it is"
        assert app.read("job") is not None
    finally:
        app.close()
    outdated = [line for line in _warnings(caplog) if "from an earlier version" in line]
    assert len(outdated) == 1, _warnings(caplog)
    assert outdated[0] == WARN_SCHEMA_OUTDATED % server.url.replace("postgres@", "app@")
    owner = open_store(server.url, timeout=2)
    try:
        assert owner.read("job") is not None
    finally:
        owner.close()
    with psycopg.connect(server.url, autocommit=True) as conn:
        (comment,) = conn.execute(
            f"SELECT obj_description(to_regprocedure('{ACQUIRE}'), 'pg_proc')"
        ).fetchone()
    assert comment == "celery-leader schema 3", "the owner's store brought it up to date"
