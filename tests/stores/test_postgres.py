"""The PostgreSQL store beyond the contract suite: connections per process, its schema."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psycopg
import pytest

from celery_leader.stores import Holder, open_store
from celery_leader.stores.postgres import DDL
from harness.servers import PostgresServer


@pytest.fixture
def server():
    running = PostgresServer().start()
    yield running
    running.stop()


def connections(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        (count,) = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'celery-leader%'"
        ).fetchone()
    return int(count)


def test_two_hundred_followers_in_one_process_use_two_connections(server):
    """PostgreSQL's default max_connections is 100: 200 followers of one process share one
    connection for their calls and one to listen, and every one hears the release."""
    stores = [open_store(server.url, timeout=2) for _ in range(200)]
    try:
        assert stores[0].acquire("job", Holder("lead", "n0", "h", 1), 5.0).acquired
        heard = threading.Semaphore(0)
        watches = []
        for i, store in enumerate(stores[1:], start=1):
            assert not store.acquire("job", Holder(f"f{i}", f"n{i}", "h", 1), 5.0).acquired
            watches.append(store.watch("job", heard.release))
        time.sleep(0.5)
        assert connections(server.url) <= 2
        while heard.acquire(blocking=False):
            pass  # the calls back every watch gets once it listens
        assert stores[0].release("job", "lead")
        deadline = time.monotonic() + 5
        for _ in range(199):
            assert heard.acquire(timeout=max(0.0, deadline - time.monotonic())), "not heard"
        for watch in watches:
            watch.close()
    finally:
        for store in stores:
            store.close()


def test_the_documented_schema_is_the_one_the_store_creates(server):
    """Teams that manage schemas run DDL themselves; the store then works without CREATE."""
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute(DDL)
        conn.execute("CREATE ROLE app LOGIN")
        conn.execute(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON celery_leader_lease, celery_leader_state,"
            " celery_leader_member TO app"
        )
        conn.execute("GRANT USAGE, UPDATE ON SEQUENCE celery_leader_token_seq TO app")
        conn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    url = server.url.replace("postgres@", "app@")
    store = open_store(url, timeout=2)
    try:
        first = store.acquire("job", Holder("a", "n", "h", 1), 5.0)
        assert first.acquired and first.hold_off > 0, "first use: held off one ttl"
        assert store.renew("job", "a", 5.0)
        assert store.release("job", "a")
        again = store.acquire("job", Holder("b", "n", "h", 1), 5.0)
        assert again.acquired and again.hold_off == 0
        assert again.token is not None and first.token is not None and again.token > first.token
    finally:
        store.close()


def test_a_paused_server_ends_a_call_at_its_deadline_and_the_store_recovers(server):
    """SIGSTOP of every PostgreSQL process: TCP keeps the connection open and no
    statement_timeout can fire, so the client's own deadline must end the call."""
    from celery_leader.exceptions import StoreError

    store = open_store(server.url, timeout=1.0)
    try:
        assert store.acquire("job", Holder("a", "n", "h", 1), 5.0).acquired
        server.pause()
        started = time.monotonic()
        with pytest.raises(StoreError):
            store.renew("job", "a", 5.0)
        assert time.monotonic() - started < 3.0, "the call outlived its deadline"
        server.resume()
        assert store.renew("job", "a", 5.0), "a new connection after the deadline"
    finally:
        server.resume()
        store.close()


def test_no_password_in_an_error_even_when_libpq_quotes_the_url():
    from celery_leader.exceptions import StoreError

    store = open_store("postgresql://u:p%zzS3CRET@127.0.0.1:1/db", timeout=1.0)
    try:
        with pytest.raises(StoreError) as found:
            store.read("job")
        assert "S3CRET" not in str(found.value) and "S3CRET" not in store.url
    finally:
        store.close()


def test_a_call_after_close_is_refused(server):
    from celery_leader.exceptions import StoreError

    store = open_store(server.url, timeout=1.0)
    store.close()
    with pytest.raises(StoreError, match="after close"):
        store.read("job")


def test_a_schema_of_an_earlier_version_gets_the_acquire_function(server):
    """An install whose schema lacks celery_leader_acquire(): a role that may create it
    adds it on connect (and the live lease is kept); one that may not is told what to run."""
    from celery_leader.exceptions import StoreError

    earlier = DDL.split("-- The acquire, in one statement")[0]
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute(earlier)
        conn.execute(
            "INSERT INTO celery_leader_lease (name, lease_id, nodename, hostname, pid, token,"
            " acquired_at, expires_at_us, ttl_us, lease_end_us, incarnation)"
            " SELECT 'job', 'a', 'n', 'h', 1, 7, 0, celery_leader_now_us() + 60000000,"
            " 60000000, celery_leader_now_us() + 60000000, celery_leader_incarnation()"
        )
        conn.execute("CREATE ROLE app LOGIN")
        conn.execute(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON celery_leader_lease, celery_leader_state,"
            " celery_leader_member TO app"
        )
        conn.execute("GRANT USAGE, UPDATE ON SEQUENCE celery_leader_token_seq TO app")
        conn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    app = open_store(server.url.replace("postgres@", "app@"), timeout=2)
    try:
        with pytest.raises(StoreError, match=r"celery_leader\.stores\.postgres\.DDL"):
            app.acquire("job", Holder("b", "n", "h", 1), 5.0)
    finally:
        app.close()
    owner = open_store(server.url, timeout=2)
    try:
        refused = owner.acquire("job", Holder("b", "n", "h", 1), 5.0)
        assert not refused.acquired and refused.holder is not None and refused.holder.token == 7
    finally:
        owner.close()


def test_the_docs_print_the_schema_the_store_creates():
    """Teams that manage schemas copy the PostgreSQL page's SQL: it must be DDL, word for word."""
    docs = Path(__file__).parents[2] / "docs"
    printed = (docs / "examples" / "postgres" / "schema.sql").read_text()
    assert printed.split() == DDL.split()
    assert "examples/postgres/schema.sql" in (docs / "stores" / "postgresql.md").read_text()
