"""Every pool the docs list: election, revocation by the pool's default ``on_loss``, failover.

One test per pool, on real workers: the leader runs every leader task; a
store pause ends the term and its running leader task stops by the pool's
default policy (prefork kills it, the others see ``lease_lost()``) before
the lease could expire in the store, and the task runs again in a later
term; a step-down hands leader work over at once; a SIGKILL of the leader
hands it to the other worker.
"""

from __future__ import annotations

import signal
import time

import pytest

from tests.integration.test_workers import runs

TTL = 2.0
#: Pools whose consumer runs Celery's blocking loop, with remote control on its own connection.
GREEN_POOLS = ("gevent", "eventlet")
#: How Celery's start-up banner names each pool ("concurrency: 2 (gevent)").
BANNER_NAME = {"threads": "thread"}
#: The pool's default on_loss, and the leader task that runs under it.
DEFAULT_POLICY_TASK = {
    "prefork": ("terminate", "slow_terminate"),
    "threads": ("cancel", "slow_cancel"),
    "solo": ("cancel", "slow_cancel"),
    "gevent": ("cancel", "slow_cancel"),
    "eventlet": ("cancel", "slow_cancel"),
}


def other_than(cluster, worker):  # type: ignore[no-untyped-def]
    (other,) = [w for w in cluster.workers if w is not worker and w.proc.poll() is None]
    return other


def elect(cluster):  # type: ignore[no-untyped-def]
    """Every leader task runs on the leader, under one token; returns (leader, token)."""
    leader = cluster.leader_worker()
    for i in range(20):
        cluster.send("leader_record", i)
    rows = cluster.wait_history(lambda r: len(runs(r)) >= 20, 30)
    starts = runs(rows)
    assert sorted(r["i"] for r in starts) == list(range(20))
    assert {r["worker"] for r in starts} == {leader.nodename}
    return leader, starts[0]["token"]


def revoke(cluster, leader, pool: str, first_token: int) -> None:
    """The store stops answering under a long run: it stops by the pool's default policy."""
    policy, task = DEFAULT_POLICY_TASK[pool]
    cluster.history_client.delete("history")
    # Shorter than the broker's visibility timeout (4 s here), or kombu would hand the
    # re-run's message out a second time while it still runs.
    cluster.send(task, 3.5, "R")
    rows = cluster.wait_history(lambda r: len(runs(r)) >= 1, 15)
    assert runs(rows)[0]["worker"] == leader.nodename
    cluster.store.pause()
    paused_at = time.monotonic()
    try:
        if policy == "terminate":
            deadline = paused_at + TTL + 2
            while "killing" not in leader.text() and time.monotonic() < deadline:
                time.sleep(0.05)
            stopped_after = time.monotonic() - paused_at
            assert "killing" in leader.text(), leader.text()[-3000:]
        else:
            rows = cluster.wait_history(lambda r: any(x["kind"] == "saw-loss" for x in r), TTL + 2)
            saw = [x for x in rows if x["kind"] == "saw-loss"]
            assert saw, leader.text()[-3000:]
            stopped_after = saw[0]["at"] - paused_at
    finally:
        cluster.store.resume()
    # The last renewal landed at most renew_interval before the pause, and the
    # lease lives ttl from it: the run stopped before the store could expire it.
    assert stopped_after < TTL, stopped_after
    rows = cluster.wait_history(lambda r: len(runs(r)) >= 2, 30)
    assert len(runs(rows)) >= 2, "the stopped run went back to the broker and ran again"
    assert runs(rows)[1]["token"] > first_token
    assert not [r for r in rows if r["kind"] == "end" and r["token"] == first_token]
    rows = cluster.wait_history(lambda r: any(x["kind"] == "end" for x in r), 20)
    assert [r for r in rows if r["kind"] == "end"], "the run of the later term ran to its end"


def hand_over(cluster, pool: str) -> None:
    """A step-down releases; the other worker takes leader work at once."""
    other = other_than(cluster, cluster.leader_worker())
    cluster.history_client.delete("history")
    proc = cluster.celery("leader", "step-down")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sent_at = time.monotonic()
    cluster.send("leader_record", 50)
    rows = cluster.wait_history(
        lambda r: any(x["kind"] == "start" and x.get("i") == 50 for x in r), 20
    )
    (released,) = [r for r in rows if r["kind"] == "signal-released"]
    (run,) = [r for r in runs(rows) if r.get("i") == 50]
    assert run["worker"] == other.nodename
    # gevent and eventlet run Celery's blocking loop, which nothing can wake from outside:
    # their new leader may take up to its 2 s drain_events wait (see worker/wakeup.py).
    waited = run["at"] - max(released["at"], sent_at)
    assert waited < (2.5 if pool in GREEN_POOLS else TTL / 4), waited


def fail_over(cluster) -> None:  # type: ignore[no-untyped-def]
    """SIGKILL whoever leads now; the other worker runs leader work."""
    current = cluster.leader_worker()
    survivor = other_than(cluster, current)
    cluster.history_client.delete("history")
    current.signal(signal.SIGKILL)
    killed_at = time.monotonic()
    current.proc.wait(10)
    assert cluster.leader_worker(timeout=TTL + 10) is survivor
    cluster.send("leader_record", 100)
    rows = cluster.wait_history(
        lambda r: any(x["kind"] == "start" and x.get("i") == 100 for x in r), 20
    )
    (run,) = [r for r in runs(rows) if r.get("i") == 100]
    assert run["worker"] == survivor.nodename
    assert run["at"] - killed_at < TTL + 5


@pytest.mark.slow
@pytest.mark.parametrize("pool", list(DEFAULT_POLICY_TASK))
def test_pool_elects_revokes_hands_over_and_fails_over(cluster_for, pool):
    cluster = cluster_for("redis")
    cluster.start(2, pool=pool)
    assert all(f"({BANNER_NAME.get(pool, pool)})" in w.text() for w in cluster.workers)
    leader, first_token = elect(cluster)
    revoke(cluster, leader, pool, first_token)
    hand_over(cluster, pool)
    fail_over(cluster)
