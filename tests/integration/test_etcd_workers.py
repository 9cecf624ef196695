"""Real workers on a cluster of three etcd members that loses its leader member, then quorum."""

from __future__ import annotations

import time

import pytest

from harness.servers import EtcdCluster
from tests.chaos.checker import check
from tests.integration.streaming import streaming


def runs(rows, kind="start"):
    return [r for r in rows if r["kind"] == kind]


@pytest.fixture
def etcd_cluster(cluster_for, tmp_path, request):
    size = getattr(request, "param", 1)
    servers = EtcdCluster(tmp_path / "etcd", size=size).start()
    cluster = cluster_for("redis")  # the broker stays a Redis of its own
    cluster.env["LEADER_STORE"] = servers.url
    yield cluster, servers
    cluster.close()
    servers.close()


@pytest.mark.slow
@pytest.mark.parametrize("etcd_cluster", [3], indirect=True)
def test_workers_on_three_members_through_a_leader_loss_and_a_quorum_loss(etcd_cluster):
    """Kill etcd's leader member: the workers keep leading through the other two. Kill a
    second: without quorum the holder stops before its ttl ends and nobody leads; both
    back: one leader again with a greater token; nothing lost, no two at once."""
    cluster, servers = etcd_cluster
    ttl = float(cluster.env["LEADER_TTL"])
    cluster.start(2)
    cluster.leader_worker(timeout=20)
    with streaming(cluster) as sent:
        time.sleep(1.5)
        leader = servers.wait_leader()
        leader.kill()
        time.sleep(2.0)
        second = next(m for m in servers.members if m is not leader and m.running)
        second.kill()
        lost_at = time.monotonic()
        time.sleep(ttl + 3)
        silent_from = time.monotonic() - 2.5
        leader.restart()
        second.restart()
        back_at = time.monotonic()
        servers.wait_leader(timeout=20)
        rows = cluster.wait_history(
            lambda r: any(x["kind"] == "start" and x["at"] > back_at for x in r), ttl + 20
        )
        time.sleep(1.0)
    rows = cluster.wait_history(
        lambda r: {x["i"] for x in r if x["kind"] == "end"} >= set(range(sent[0])), 30
    )
    before_loss = [r for r in runs(rows) if r["at"] < lost_at]
    after_loss = [r for r in runs(rows) if lost_at <= r["at"] < back_at]
    assert before_loss, "nothing ran before the quorum was lost"
    assert all(r["at"] < lost_at + ttl for r in after_loss), "a run after the holder's ttl"
    assert not [r for r in after_loss if r["at"] > silent_from], "someone led without quorum"
    tokens_before = {r["token"] for r in before_loss}
    tokens_after = {r["token"] for r in runs(rows) if r["at"] > back_at}
    assert min(tokens_after) > max(tokens_before)
    summary = check(rows, sent[0])
    assert summary.violations() == [] and summary.lost == [], summary.table()
