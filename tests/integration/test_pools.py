"""Every pool the README lists: election, revocation by the pool's default ``on_loss``, failover.

One test per pool, on real workers: the leader runs every leader task; a
store pause ends the term and its running leader task stops by the pool's
default policy (prefork kills it, the others see ``lease_lost()``) before
the lease could expire in the store, and the task runs again in a later
term; a SIGKILL of the leader hands leader work to the other worker.
"""

from __future__ import annotations

import signal
import time

import pytest

from tests.integration.test_workers import runs

TTL = 2.0
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


@pytest.mark.slow
@pytest.mark.parametrize("pool", list(DEFAULT_POLICY_TASK))
def test_pool_elects_revokes_and_fails_over(cluster_for, pool):
    cluster = cluster_for("redis")
    cluster.start(2, pool=pool)
    leader = cluster.leader_worker()
    (follower,) = [w for w in cluster.workers if w is not leader]
    assert f"({BANNER_NAME.get(pool, pool)})" in leader.text(), "the worker runs that pool"

    # Election: every leader task runs on the leader, under one token.
    for i in range(20):
        cluster.send("leader_record", i)
    rows = cluster.wait_history(lambda r: len(runs(r)) >= 20, 30)
    starts = runs(rows)
    assert sorted(r["i"] for r in starts) == list(range(20))
    assert {r["worker"] for r in starts} == {leader.nodename}
    first_token = starts[0]["token"]

    # Revocation: the store stops answering under a long run of the default policy.
    policy, task = DEFAULT_POLICY_TASK[pool]
    cluster.history_client.delete("history")
    cluster.send(task, 30.0, "R")
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

    # Failover: SIGKILL whoever leads now; the other worker runs leader work.
    current = cluster.leader_worker()
    survivor = follower if current is leader else leader
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
