"""Redis store: noticing that the data under a lease changed, and what it needs from the ACL.

The next holder must hold off one ttl whenever the data it reads may be
older than the latest term: after a restart, and also when the same server
process loads other data (a dataset flushed and restored, ``SWAPDB``,
``DEBUG RELOAD``) or is promoted back after a failover round trip. A user
without ``INFO`` (the common ``-@dangerous`` rule) still leads, holds off on
every acquire (it cannot tell), and is told in one line what is missing.
Real redis-server processes, no mocks.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
import redis

from celery_leader.stores import open_store
from celery_leader.stores.base import Holder
from celery_leader.stores.redis import RedisLeaseStore, lease_key, meta_key, token_key
from harness.servers import RedisServer
from tests.lease.test_election import wait_for

NAME = "job"
TTL = 3.0


@pytest.fixture
def server(tmp_path: Path):
    """A redis-server with DEBUG enabled (off by default since Redis 7)."""
    started = RedisServer(tmp_path, extra=["--enable-debug-command", "yes"]).start()
    yield started
    started.stop()


@pytest.fixture
def stores():
    opened: list[RedisLeaseStore] = []
    yield opened
    for store in opened:
        store.close()


def _open(url: str, stores: list[RedisLeaseStore]) -> RedisLeaseStore:
    store = open_store(url, timeout=1.0)
    assert isinstance(store, RedisLeaseStore)
    stores.append(store)
    return store


def _warm(store: RedisLeaseStore) -> None:
    """A released first term: the next acquire on unchanged data needs no hold-off."""
    warm = Holder.for_this_process("warm-up")
    assert store.acquire(NAME, warm, TTL).acquired
    assert store.release(NAME, warm.lease_id)


def _clean_handover_needs_no_hold_off(store: RedisLeaseStore) -> None:
    """The control: on data nobody touched, a released lease passes at once."""
    probe = Holder.for_this_process("probe")
    result = store.acquire(NAME, probe, TTL)
    assert result.acquired and result.hold_off == 0.0
    assert store.release(NAME, probe.lease_id)


KEYS = (lease_key(NAME), token_key(NAME), meta_key(NAME))


def test_flushall_then_restoring_older_keys_makes_the_next_holder_hold_off(server, stores):
    """The lease keys as they were before A's term, restored into the same process."""
    store = _open(server.url, stores)
    _warm(store)
    _clean_handover_needs_no_hold_off(store)
    admin = server.client()
    raw = redis.Redis(host="127.0.0.1", port=server.port)  # DUMP payloads are bytes
    dumps = {key: raw.dump(key) for key in KEYS if raw.exists(key)}
    assert meta_key(NAME) in dumps and token_key(NAME) in dumps
    a = Holder.for_this_process("a")
    assert store.acquire(NAME, a, TTL).acquired  # A leads, trusting its lease for a ttl
    admin.flushall()
    for key, value in dumps.items():
        raw.restore(key, 0, value)
    b = Holder.for_this_process("b")
    result = store.acquire(NAME, b, TTL)
    assert result.acquired
    assert result.hold_off >= TTL * 0.9, "A may still act: B must hold off one ttl"


def test_swapdb_with_an_older_copy_makes_the_next_holder_hold_off(server, stores):
    """Database 1 holds a copy from before A's term; SWAPDB puts it under the lease."""
    store = _open(server.url, stores)
    _warm(store)
    _clean_handover_needs_no_hold_off(store)
    admin = server.client()
    for key in KEYS:
        if admin.exists(key):
            admin.copy(key, key, destination_db=1)
    a = Holder.for_this_process("a")
    assert store.acquire(NAME, a, TTL).acquired
    admin.swapdb(0, 1)
    result = store.acquire(NAME, Holder.for_this_process("b"), TTL)
    assert result.acquired
    assert result.hold_off >= TTL * 0.9


def test_debug_reload_of_an_older_file_makes_the_next_holder_hold_off(server, stores):
    """The RDB on disk predates A's term; DEBUG RELOAD NOSAVE loads it into the same process."""
    store = _open(server.url, stores)
    _warm(store)
    admin = server.client()
    admin.save()  # the older file
    _clean_handover_needs_no_hold_off(store)
    a = Holder.for_this_process("a")
    assert store.acquire(NAME, a, TTL).acquired
    admin.execute_command("DEBUG", "RELOAD", "NOSAVE")
    assert not admin.exists(lease_key(NAME)), "the older data has no lease"
    result = store.acquire(NAME, Holder.for_this_process("b"), TTL)
    assert result.acquired
    assert result.hold_off >= TTL * 0.9


def _synced(replica: RedisServer) -> bool:
    info = replica.client().info("replication")
    return (
        info.get("master_link_status") == "up" and int(info.get("master_sync_in_progress", 1)) == 0
    )


@pytest.mark.slow
def test_failover_back_to_a_node_that_missed_the_renewals_holds_off(tmp_path, stores):
    """P1 -> P2 -> P1: A renews on P2, P1 misses it and is promoted back; B must hold off."""
    ttl = 2.0
    p1 = RedisServer(tmp_path).start()
    p2 = RedisServer(tmp_path).start()
    try:
        p2.client().replicaof("127.0.0.1", p1.port)
        assert wait_for(lambda: _synced(p2), 10)
        on_p1, on_p2 = _open(p1.url, stores), _open(p2.url, stores)
        _warm(on_p1)
        a = Holder.for_this_process("a")
        assert on_p1.acquire(NAME, a, ttl).acquired
        assert wait_for(lambda: p2.client().exists(lease_key(NAME)) == 1, 5)
        # Failover: P2 is promoted, P1 follows it.
        p2.client().replicaof("no", "one")
        p1.client().replicaof("127.0.0.1", p2.port)
        assert wait_for(lambda: _synced(p1), 10)
        # Failover back, while A can still reach P2 (a partition): P1 is promoted
        # again, then A renews on P2, which is lost afterwards. P1 never sees it.
        p1.client().replicaof("no", "one")
        # Late in A's term, so that B's acquire on P1 (when P1's copy of the
        # lease expires) certainly falls within the validity A renewed on P2.
        time.sleep(ttl * 0.4)
        assert on_p2.renew(NAME, a.lease_id, ttl)  # A now trusts its lease until ~ttl from here
        renewed = time.monotonic()
        p2.stop()
        b = Holder.for_this_process("b")
        results = []

        def b_acquires() -> bool:
            results.append(on_p1.acquire(NAME, b, ttl))
            return results[-1].acquired

        assert wait_for(b_acquires, ttl + 2, step=0.05)
        acquired = time.monotonic()
        assert acquired - renewed < ttl, "B got the lease while A's renewal was still trusted"
        assert results[-1].hold_off >= ttl * 0.9, "A's renewal on P2 may still be trusted"
    finally:
        p1.stop()
        p2.stop()


def _least_privilege_server(tmp_path: Path, *rules: str) -> RedisServer:
    server = RedisServer(tmp_path).start()
    admin = server.client()
    admin.execute_command("ACL", "SETUSER", "leader", "on", ">s3cr3t-pass", "~*", "&*", *rules)
    admin.close()
    return server


def test_a_user_without_info_leads_holds_off_and_says_what_is_missing(tmp_path, stores, caplog):
    """+@all -@dangerous: acquire works, every acquire holds off, one warning names +info."""
    server = _least_privilege_server(tmp_path, "+@all", "-@dangerous")
    try:
        url = f"redis://leader:s3cr3t-pass@127.0.0.1:{server.port}/0"
        store = _open(url, stores)
        with caplog.at_level(logging.WARNING, logger="celery_leader.stores.redis"):
            first = Holder.for_this_process("first")
            result = store.acquire(NAME, first, TTL)
            assert result.acquired and result.hold_off == pytest.approx(TTL, abs=0.01)
            assert store.renew(NAME, first.lease_id, TTL)
            assert store.release(NAME, first.lease_id)
            # Without INFO a restart cannot be told from a clean handover: hold off again.
            second = store.acquire(NAME, Holder.for_this_process("second"), TTL)
            assert second.acquired and second.hold_off == pytest.approx(TTL, abs=0.01)
        warnings = [r.getMessage() for r in caplog.records if "+info" in r.getMessage()]
        assert len(warnings) == 1, warnings
        assert "\n" not in warnings[0] and "s3cr3t-pass" not in warnings[0]
        assert "leader:***@" in warnings[0]
    finally:
        server.stop()


def test_a_user_granted_info_hands_over_without_hold_off(tmp_path, stores, caplog):
    """+@all -@dangerous +info: what the Redis page asks for; a clean handover is immediate."""
    server = _least_privilege_server(tmp_path, "+@all", "-@dangerous", "+info")
    try:
        store = _open(f"redis://leader:s3cr3t-pass@127.0.0.1:{server.port}/0", stores)
        with caplog.at_level(logging.WARNING, logger="celery_leader.stores.redis"):
            _warm(store)
            _clean_handover_needs_no_hold_off(store)
        assert not [r for r in caplog.records if "+info" in r.getMessage()]
    finally:
        server.stop()
