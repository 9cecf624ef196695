"""The PostgreSQL store beyond the contract suite: connections per process, its schema."""

from __future__ import annotations

import threading
import time

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
