"""Real workers on etcd: three members that lose their leader, then quorum; etcd's minimum TTL."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from harness.cluster import ROOT
from harness.servers import EtcdCluster
from tests.chaos.checker import check
from tests.integration.streaming import streaming

#: etcd's own raft timings (heartbeat 100 ms, election timeout 1 s): leases of 2 s at least.
DEFAULT_RAFT = ["--heartbeat-interval", "100", "--election-timeout", "1000"]


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


def _start_command(tmp_path, what: str) -> list[str]:
    app = ["-m", "celery", "-A", "tests.integration.leaderapp"]
    if what == "worker":
        return [sys.executable, *app, "worker", "-l", "info"]
    return [sys.executable, *app, "beat", "-l", "info", "-s", str(tmp_path / "schedule")]


@pytest.mark.parametrize("what", ["worker", "beat"])
@pytest.mark.parametrize("ttl", ["0.5", "1.5"])
def test_a_ttl_below_etcds_minimum_stops_worker_and_beat_with_one_line(
    cluster_for, tmp_path, what, ttl
):
    """etcd at its default raft timings grants leases of 2 s at least: a ttl below that
    stops the worker (and beat) at start with one line naming the setting and the minimum."""
    servers = EtcdCluster(tmp_path / "etcd", 1, extra=DEFAULT_RAFT).start()
    try:
        cluster = cluster_for("redis")
        proc = subprocess.run(
            _start_command(tmp_path, what),
            cwd=ROOT,
            env={
                **cluster.env,
                "LEADER_STORE": servers.url,
                "LEADER_TTL": ttl,
                "LEADER_BEAT_EVERY": "1",
            },
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        servers.close()
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-2000:]
    assert "Traceback" not in output, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("Error: celery-leader:")]
    assert len(errors) == 1, output[-2000:]
    assert f"leader_lease_ttl={ttl} is not allowed with the etcd store" in errors[0]
    assert "leader_lease_ttl >= 2" in errors[0]


def test_a_ttl_at_etcds_minimum_starts_and_leads(cluster_for, tmp_path):
    """ttl 2 on the same etcd: the workers start and one of them leads."""
    servers = EtcdCluster(tmp_path / "etcd", 1, extra=DEFAULT_RAFT).start()
    try:
        cluster = cluster_for("redis")
        cluster.env.update({"LEADER_STORE": servers.url, "LEADER_TTL": "2"})
        cluster.start(2)
        assert cluster.leader_worker(timeout=20) is not None
    finally:
        cluster.close()
        servers.close()
