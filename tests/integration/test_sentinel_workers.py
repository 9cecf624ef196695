"""Real workers on a Sentinel-managed Redis: a primary, a replica, three sentinels."""

from __future__ import annotations

import time

import pytest

from harness.servers import SentinelRedis
from tests.chaos.checker import check
from tests.integration.streaming import streaming


@pytest.fixture
def sentinel_cluster(cluster_for, tmp_path):
    servers = SentinelRedis(tmp_path / "sentinel").start()
    cluster = cluster_for("redis")  # the broker stays a Redis of its own
    cluster.env["LEADER_STORE"] = servers.url
    yield cluster, servers
    cluster.close()
    servers.stop()


@pytest.mark.slow
def test_workers_keep_one_leader_through_a_sentinel_failover(sentinel_cluster):
    """SIGKILL the primary while a worker leads: the sentinels promote the replica, a leader
    runs again within ttl + the failover + a little, tokens never go back, no run of an
    older term starts after a newer one, nothing is lost."""
    cluster, servers = sentinel_cluster
    cluster.start(2)
    cluster.leader_worker(timeout=20)
    with streaming(cluster) as sent:
        time.sleep(2.0)
        primary = servers.primary_port()
        assert primary is not None
        servers.server_on(primary).stop()  # SIGKILL
        killed_at = time.monotonic()
        servers.wait_failover(primary)
        failover = time.monotonic() - killed_at
        ttl = float(cluster.env["LEADER_TTL"])
        rows = cluster.wait_history(
            lambda r: any(x["kind"] == "start" and x["at"] > killed_at + failover for x in r),
            ttl + 15,
        )
        resumed = min(r["at"] for r in rows if r["kind"] == "start" and r["at"] > killed_at)
        assert resumed - killed_at < ttl + failover + 6, (resumed - killed_at, failover)
        time.sleep(2.0)
    # Every message ran, and every run wrote its end row (it comes just after the start).
    rows = cluster.wait_history(
        lambda r: {x["i"] for x in r if x["kind"] == "end"} >= set(range(sent[0])), 30
    )
    summary = check(rows, sent[0])
    assert summary.violations() == [], summary.table()
    assert summary.lost == [], summary.lost
