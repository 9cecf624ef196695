"""Redis store against what a real server's persistence and memory limits do to a lease.

An append-only file restored from an older copy, and the lease key evicted
under ``maxmemory``: the store must notice that it forgot, make the next holder
hold off one ttl, and keep tokens rising. Real redis-server processes.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

import celery_leader.clock
from celery_leader.lease.timing import LeaseTiming
from celery_leader.stores.redis import lease_key, meta_key, token_key
from harness.servers import RedisServer
from tests.history import History
from tests.lease.test_election import Cluster, wait_for

TTL = 1.0
TIMING = LeaseTiming.create(TTL)


@pytest.fixture
def clusters():
    made: list[Cluster] = []
    yield made
    for cluster in made:
        cluster.stop()


@pytest.fixture
def aof_server(tmp_path: Path):
    """A redis-server that logs every write to its append-only file before answering."""
    server = RedisServer(tmp_path, extra=["--appendonly", "yes", "--appendfsync", "always"]).start()
    yield server
    server.stop()


def check_after(history: History, event_at: float, before: list[int]) -> None:
    """No overlap; the first term after *event_at* waited one ttl; tokens only rose."""
    assert history.overlaps() == []
    terms = history.terms()
    tokens = [t.token for t in terms]
    assert len(set(tokens)) == len(tokens), f"a token was handed out twice: {tokens}"
    assert tokens == sorted(tokens)
    after = [t for t in terms if t.start > event_at]
    assert after, "someone leads afterwards"
    assert after[0].start - event_at >= TTL * 0.9, "the store that forgot held off"
    assert min(t.token for t in after) > max(before)


@pytest.mark.slow
def test_restart_from_an_older_append_only_file_never_repeats_a_token(aof_server, clusters):
    """The AOF is copied after the first term and put back after a later one (a restore)."""
    aof_dir = aof_server.workdir / "appendonlydir"
    copy = aof_server.workdir / "aof-copy"
    cluster = Cluster(aof_server.url, 3, timing=TIMING).start()
    clusters.append(cluster)
    first = cluster.wait_leader(TTL * 2 + 5)
    aof_server.client().execute_command("BGREWRITEAOF")  # a self-contained base file
    assert wait_for(
        lambda: aof_server.client().info("persistence")["aof_rewrite_in_progress"] == 0, 5
    )
    shutil.copytree(aof_dir, copy)  # the old copy: the counter at the first term's token
    first.stop()  # hand over: the next term (and token) is newer than the copy
    second = cluster.wait_leader(TTL * 2 + 5, exclude=first)
    time.sleep(0.2)
    before = [t.token for t in cluster.history.terms()]
    assert len(before) >= 2, "a term newer than the copy"
    aof_server.kill()  # kill -9: the AOF has every write up to here
    shutil.rmtree(aof_dir)
    shutil.copytree(copy, aof_dir)
    aof_server.start()
    restored_at = celery_leader.clock.now()
    counter = int(aof_server.client().get(token_key(cluster.name)))
    assert counter < max(before), "the restored counter is behind the latest term"
    assert wait_for(lambda: not second.is_leader(), TTL + 0.5)
    cluster.wait_leader(TTL * 3 + 5)
    time.sleep(TTL)
    check_after(cluster.history, restored_at, before)


@pytest.mark.slow
def test_lease_key_evicted_under_maxmemory_makes_the_next_holder_wait(redis_server, clusters):
    """maxmemory with volatile-ttl evicts the lease key (shortest TTL) first: hold off one ttl."""
    client = redis_server.client()
    cluster = Cluster(redis_server.url, 3, timing=TIMING).start()
    clusters.append(cluster)
    old = cluster.wait_leader(TTL * 2 + 5)
    time.sleep(0.2)
    before = [t.token for t in cluster.history.terms()]
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory-policy", "volatile-ttl")
    client.config_set("maxmemory", used + 512 * 1024)
    evicted_at = None
    value = "x" * 64 * 1024
    try:
        for i in range(200):
            client.set(f"filler:{i}", value, ex=3600)  # volatile, with a long TTL
            if not client.exists(lease_key(cluster.name)):
                evicted_at = celery_leader.clock.now()
                break
    finally:
        client.config_set("maxmemory", 0)  # one eviction is the event under test
    assert evicted_at is not None, "the lease key was never evicted"
    assert int(client.info("stats")["evicted_keys"]) >= 1
    assert client.exists(token_key(cluster.name)) and client.exists(meta_key(cluster.name))
    assert wait_for(lambda: not old.is_leader(), TTL + 0.5)
    cluster.wait_leader(TTL * 3 + 5)
    time.sleep(TTL)
    check_after(cluster.history, evicted_at, before)
