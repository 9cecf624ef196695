"""Real workers on a PostgreSQL lease store: crash failover, graceful handover, server restart."""

from __future__ import annotations

import signal
import time

import pytest

from harness.servers import PostgresServer
from tests.chaos.checker import check


def runs(rows, kind="start"):
    return [r for r in rows if r["kind"] == kind]


@pytest.fixture
def postgres_cluster(cluster_for):
    server = PostgresServer().start()
    cluster = cluster_for("redis")
    cluster.env["LEADER_STORE"] = server.url
    yield cluster, server
    cluster.close()
    server.stop()


@pytest.mark.slow
def test_two_workers_on_postgres_crash_shutdown_and_a_server_kill(postgres_cluster):
    """SIGKILL of the leader: another leads after the ttl; SIGTERM: at once (NOTIFY); kill -9
    of PostgreSQL and a restart: one leader again, tokens rising, no stale start."""
    cluster, server = postgres_cluster
    ttl = float(cluster.env["LEADER_TTL"])
    cluster.start(2)
    first = cluster.leader_worker(timeout=20)
    cluster.send("leader_record", 0)
    rows = cluster.wait_history(runs, 10)
    assert [x["worker"] for x in runs(rows)] == [first.nodename]

    cluster.start(1)
    killed_at = time.monotonic()
    first.signal(signal.SIGKILL)
    first.proc.wait(10)
    second = cluster.leader_worker(timeout=ttl + 15)
    took = time.monotonic() - killed_at
    assert second is not first
    assert took < ttl + 5, f"takeover after the lease expired: {took:.1f} s"

    stopped_at = time.monotonic()
    second.proc.send_signal(signal.SIGTERM)
    second.proc.wait(20)
    third = cluster.leader_worker(timeout=10)
    assert third not in (first, second)
    assert time.monotonic() - stopped_at < 5, "handover on release, not after the ttl"
    cluster.send("leader_record", 1)
    rows = cluster.wait_history(lambda r: len(runs(r)) >= 2, 10)

    server.kill()  # kill -9: the leader cannot renew; the rows survive in the WAL
    time.sleep(1.0)
    server.start()
    cluster.leader_worker(timeout=ttl + 20)
    cluster.send("leader_record", 2)
    rows = cluster.wait_history(lambda r: len(runs(r, "end")) >= 3, 20)  # its end row too
    tokens = [r["token"] for r in runs(rows)]
    assert tokens == sorted(tokens) and tokens[-1] > tokens[0], tokens
    summary = check(rows, 3)
    assert summary.violations() == [] and summary.lost == [], summary.table()
