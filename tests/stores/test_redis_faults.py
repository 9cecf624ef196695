"""Redis store under faults: restarts that lose data, pauses, lost replies, bad values."""

from __future__ import annotations

import logging
import time

import pytest

from celery_leader.exceptions import StoreError
from celery_leader.lease import EventKind, LeaseManager
from celery_leader.lease.timing import LeaseTiming
from celery_leader.stores import open_store
from celery_leader.stores.base import Holder
from celery_leader.stores.redis import lease_key, token_key
from harness.servers import RedisServer, free_port
from tests.history import History
from tests.lease.test_election import Cluster, wait_for, warm_store

TTL = 1.0


@pytest.fixture
def clusters():
    made: list[Cluster] = []
    yield made
    for cluster in made:
        cluster.stop()


@pytest.mark.slow
def test_restart_empty_twenty_times_never_two_leaders(redis_server, clusters):
    """Redis restarted empty 20 times under a leader: no overlap, tokens rise, hold-off kept."""
    timing = LeaseTiming.create(TTL)
    cluster = Cluster(redis_server.url, 3, timing=timing)
    clusters.append(cluster)
    for manager in cluster.managers:
        manager.start()
    restarts: list[float] = []
    for _ in range(20):
        leader = cluster.wait_leader(TTL * 2 + 5)
        time.sleep(0.1)
        restarts.append(time.monotonic())
        redis_server.restart_empty()
        # The old leader must stop believing no later than its validity.
        assert wait_for(lambda leader=leader: not leader.is_leader(), TTL + 0.5)
    cluster.wait_leader(TTL * 2 + 5)
    history = cluster.history
    assert history.overlaps() == []
    terms = history.terms()
    tokens = [t.token for t in terms]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
    # Every term that began after a restart began at least one ttl after it
    # (the new holder cannot know whether the old one still acts).
    for restart in restarts:
        after = [t for t in terms if t.start > restart]
        assert after, "someone leads after every restart"
        assert after[0].start - restart >= TTL * 0.9


def test_acquire_with_lost_reply_is_adopted(redis_server):
    """An acquire applied after its client timed out is recognised: no ttl-long gap."""
    timing = LeaseTiming.create(3.0, op_timeout=0.2)
    warm_store(redis_server.url)
    store = open_store(redis_server.url, timeout=timing.op_timeout)
    store.read("job")  # a live connection, so the acquire is sent, not stuck in connect
    history = History()
    manager = LeaseManager(store, "job", timing, listeners=(history.listener("m"),))
    redis_server.pause()
    try:
        manager.start()
        time.sleep(0.6)  # the first acquire is sent and times out on the client
        assert not manager.is_leader()
    finally:
        redis_server.resume()
    resumed = time.monotonic()
    try:
        assert manager.wait_for_leadership(2.5)
        took = time.monotonic() - resumed
        assert took < 1.5, f"took {took:.2f} s: the applied acquire was not recognised"
        record = open_store(redis_server.url, timeout=0.5).read("job")
        assert record is not None and record.token == manager.current_token()
    finally:
        manager.stop()
        store.close()


def test_store_paused_past_ttl_leader_steps_down_in_time(redis_server, clusters):
    """SIGSTOP the store past the ttl: loss declared before validity ends; leads after."""
    cluster = Cluster(redis_server.url, 1)
    clusters.append(cluster)
    manager = cluster.start().managers[0]
    cluster.wait_leader(TTL + 3)
    redis_server.pause()
    paused = time.monotonic()
    try:
        assert wait_for(lambda: not manager.is_leader(), TTL + 0.5)
        time.sleep(TTL)
        assert manager.running, "no exception may end the manager thread"
    finally:
        redis_server.resume()
    lost = [e for _, e in cluster.history.events if e.kind is EventKind.LOST]
    assert lost, "the leader reports the loss"
    assert lost[0].at <= lost[0].term.valid_until, "loss declared before local validity ended"
    assert lost[0].at - paused < TTL
    assert cluster.wait_leader(TTL + 3) is manager
    assert cluster.history.overlaps() == []


def test_garbage_value_with_ttl_blocks_until_it_expires(redis_server, clusters):
    """A foreign value in the lease key means "not leader" until it expires; no crash."""
    client = redis_server.client()
    warm_store(redis_server.url)
    client.set(lease_key("job"), "not json at all", px=1500)
    set_at = time.monotonic()
    cluster = Cluster(redis_server.url, 1)
    clusters.append(cluster)
    manager = cluster.start(warm=False).managers[0]
    time.sleep(0.5)
    assert not manager.is_leader()
    cluster.wait_leader(3)
    assert time.monotonic() - set_at >= 1.4
    assert manager.running


def test_garbage_value_without_ttl_is_reported_and_never_overwritten(
    redis_server, clusters, caplog
):
    """A foreign value with no expiry is logged as an error and left alone."""
    client = redis_server.client()
    warm_store(redis_server.url)
    client.set(lease_key("job"), '{"lease_id": "someone else"}')
    cluster = Cluster(redis_server.url, 1)
    clusters.append(cluster)
    manager = cluster.start(warm=False).managers[0]
    time.sleep(1.0)
    assert not manager.is_leader()
    assert client.get(lease_key("job")) == '{"lease_id": "someone else"}'
    assert any(
        "did not write" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR
    )
    client.delete(lease_key("job"))
    assert manager.wait_for_leadership(TTL + 2)


def test_garbage_token_counter_does_not_crash(redis_server):
    """A non-numeric token counter gives a store error, not a crashed thread."""
    client = redis_server.client()
    client.set(token_key("job"), "garbage")
    store = open_store(redis_server.url, timeout=0.5)
    try:
        with pytest.raises(StoreError, match=r"lease store .* acquire failed"):
            store.acquire("job", Holder.for_this_process(), 1.0)
    finally:
        store.close()


def test_unreachable_store_logs_once_and_leads_when_it_comes_up(tmp_path, caplog):
    """Nothing listens on the port: one clear error, no exception; a leader once Redis starts."""
    port = free_port()
    url = f"redis://:hunter2secret@127.0.0.1:{port}/0"
    timing = LeaseTiming.create(TTL)
    store = open_store(url, timeout=timing.op_timeout)
    manager = LeaseManager(store, "job", timing)
    manager.start()
    try:
        time.sleep(1.5)
        assert manager.running and not manager.is_leader()
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1, [r.getMessage() for r in errors]
        assert "127.0.0.1" in errors[0].getMessage()
        assert "hunter2secret" not in caplog.text
        server = RedisServer(tmp_path, port=port, extra=["--requirepass", "hunter2secret"]).start()
        try:
            assert manager.wait_for_leadership(TTL * 2 + 3)
            assert "reachable again" in caplog.text
        finally:
            manager.stop()
            server.stop()
    finally:
        manager.stop()
        store.close()


def test_wrong_password_logs_masked_error_and_keeps_trying(tmp_path, caplog):
    """A rejected password is one clear error naming the store; the password never shows."""
    server = RedisServer(tmp_path, extra=["--requirepass", "rightpass"]).start()
    url = f"redis://:wrongpass99@127.0.0.1:{server.port}/0"
    timing = LeaseTiming.create(TTL)
    store = open_store(url, timeout=timing.op_timeout)
    manager = LeaseManager(store, "job", timing)
    manager.start()
    try:
        time.sleep(1.5)
        assert manager.running and not manager.is_leader()
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1
        assert "credentials" in errors[0] and f":{server.port}" in errors[0]
        assert "wrongpass99" not in caplog.text
    finally:
        manager.stop()
        store.close()
        server.stop()


@pytest.mark.slow
def test_restart_from_an_older_snapshot_never_repeats_a_token(redis_server, clusters):
    """Redis killed and restarted at once from a snapshot older than the last term.

    It comes back with the token counter behind and the latest term gone, as
    redis-server's default persistence does. The next term must still get a
    greater token than every earlier one, and wait one ttl before acting.
    """
    timing = LeaseTiming.create(TTL)
    cluster = Cluster(redis_server.url, 3, timing=timing).start()
    clusters.append(cluster)
    first = cluster.wait_leader(TTL * 2 + 5)
    redis_server.client().save()  # the snapshot: counter at the first term's token
    first.stop()  # hand over: the next term (and token) is newer than the snapshot
    second = cluster.wait_leader(TTL * 2 + 5, exclude=first)
    time.sleep(0.2)
    redis_server.kill()
    restarted_at = time.monotonic()
    redis_server.start()  # loads the older snapshot
    assert wait_for(lambda: not second.is_leader(), TTL + 0.5)
    cluster.wait_leader(TTL * 3 + 5)
    time.sleep(TTL)
    terms = cluster.history.terms()
    tokens = [t.token for t in terms]
    assert len(set(tokens)) == len(tokens), f"a token was handed out twice: {tokens}"
    assert tokens == sorted(tokens)
    assert cluster.history.overlaps() == []
    after = [t for t in terms if t.start > restarted_at]
    assert after and after[0].start - restarted_at >= TTL * 0.9, "the store that forgot held off"


@pytest.mark.slow
def test_lease_key_deleted_alone_makes_the_next_holder_wait(redis_server, clusters):
    """The lease key vanishes before its expiry (eviction, an operator's DEL): hold off one ttl."""
    timing = LeaseTiming.create(TTL)
    cluster = Cluster(redis_server.url, 3, timing=timing).start()
    clusters.append(cluster)
    old = cluster.wait_leader(TTL * 2 + 5)
    redis_server.client().delete(lease_key(cluster.name))
    deleted_at = time.monotonic()
    assert wait_for(lambda: not old.is_leader(), TTL + 0.5)
    time.sleep(TTL * 2)
    cluster.wait_leader(TTL * 3 + 5)
    assert cluster.history.overlaps() == []
    after = [t for t in cluster.history.terms() if t.start > deleted_at]
    assert after and after[0].start - deleted_at >= TTL * 0.9
