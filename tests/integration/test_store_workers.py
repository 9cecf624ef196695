"""The worker scenarios on every store beside Redis: real workers on a real server of each.

Redis, the default store, runs them throughout tests/integration; here each
other shared store (tests/store_matrix.py) runs election, step-down, crash
failover, graceful handover and revocation on lease loss in one life of a
cluster.
"""

from __future__ import annotations

import signal
import time

import pytest

from tests.chaos.checker import check
from tests.store_matrix import STORES


def runs(rows, kind="start"):
    return [r for r in rows if r["kind"] == kind]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sentinel", "postgres", "etcd"])
def test_election_step_down_crash_shutdown_and_revocation(kind, cluster_for, tmp_path, monkeypatch):
    """One leader runs the leader task; step-down hands over at once (a release
    notification); SIGKILL of the leader: the next leads after the ttl; SIGTERM: at once;
    the store paused past the ttl: the leader's running terminate task is revoked before
    anyone else leads, and one leader again once the store is back; nothing lost, no two
    terms' runs at once, tokens rising."""
    with STORES[kind].run(tmp_path / "store", monkeypatch) as store:
        assert store.pause is not None and store.resume is not None
        cluster = cluster_for("redis")  # the broker stays a Redis of its own
        cluster.env["LEADER_STORE"] = store.url
        ttl = float(cluster.env["LEADER_TTL"])
        cluster.start(3)
        first = cluster.leader_worker(timeout=20)
        cluster.send("leader_record", 0)
        rows = cluster.wait_history(runs, 10)
        assert [x["worker"] for x in runs(rows)] == [first.nodename]

        proc = cluster.celery("leader", "step-down")
        # From the command's answer: starting the CLI itself takes seconds on a loaded machine.
        stepped_at = time.monotonic()
        assert proc.returncode == 0, proc.stdout + proc.stderr
        second = cluster.leader_worker(timeout=10)
        assert second is not first
        assert time.monotonic() - stepped_at < 5, "handover on release, not after the ttl"

        killed_at = time.monotonic()
        second.signal(signal.SIGKILL)
        second.proc.wait(10)
        third = cluster.leader_worker(timeout=ttl + 15)
        took = time.monotonic() - killed_at
        assert third is not second
        assert ttl - 1.5 < took < ttl + 5, f"takeover {took:.1f} s after a crash (ttl {ttl:g})"

        cluster.start(1)
        stopped_at = time.monotonic()
        third.proc.send_signal(signal.SIGTERM)
        third.proc.wait(20)
        fourth = cluster.leader_worker(timeout=10)
        assert fourth is not third
        assert time.monotonic() - stopped_at < 5, "handover on release, not after the ttl"

        cluster.send("slow_terminate", 60, "revoked")
        cluster.wait_history(lambda r: any(x.get("tag") == "revoked" for x in r), 10)
        paused_at = time.monotonic()
        store.pause()
        try:
            time.sleep(ttl + 2)
        finally:
            store.resume()
        cluster.leader_worker(timeout=ttl + 30)
        cluster.send("leader_record", 1)
        rows = cluster.wait_history(lambda r: len([x for x in runs(r, "end") if "i" in x]) >= 2, 30)
        revoked = [r for r in rows if r.get("tag") == "revoked"]
        assert not runs(revoked, "end"), "the terminate run outlived its term"
        starts = [r for r in runs(rows) if "i" in r]
        assert starts[-1]["at"] > paused_at and starts[-1]["token"] > starts[0]["token"]
        summary = check([r for r in rows if "i" in r], 2)
        assert summary.violations() == [] and summary.lost == [], summary.table()
