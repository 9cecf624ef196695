"""The kill layers stay on after faults inside the worker, and a long run is never run twice.

Real ``celery worker`` processes (prefork) and real redis-servers:

* a pool child killed mid-write of its run-table slot must not switch off
  the parent's kill and the watchdog for the next runs of that pool index;
* a watchdog that died is noticed at the next renewal, not the next election,
  and one that was only stopped with its worker (a frozen container, a
  suspended host) is not taken for dead;
* a leader task that runs longer than the Redis broker's visibility timeout
  is not started again while it runs, nor after it completed.
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from celery_leader.elections.procinfo import parent_of
from tests.integration.test_term_end import TTL, first_start_elsewhere, runs, wait_gone
from tests.integration.test_workers import Stream


def leader_queue(cluster) -> str:
    return f"{cluster.name}.leader"


@pytest.mark.slow
def test_a_torn_run_table_slot_leaves_both_kill_layers_on(cluster_for):
    """A child dies mid-write of its slot; the next terminate run of that index ends on loss."""
    cluster = cluster_for("redis")
    (worker,) = cluster.start(1, extra=["-c", "1"])  # one pool index: the torn one is reused
    assert cluster.leader_worker() is worker
    cluster.send("tear_own_slot", queue=leader_queue(cluster))
    rows = cluster.wait_history(lambda r: any(x["kind"] == "tear" for x in r), 10)
    torn_by = next(x["pid"] for x in rows if x["kind"] == "tear")
    assert wait_gone(torn_by, 10) is not None
    cluster.send("long_terminate", 30)
    rows = cluster.wait_history(lambda r: len(runs(r)) >= 1, 15)
    assert runs(rows), worker.text()[-3000:]
    child = runs(rows)[0]["pid"]
    time.sleep(0.3)
    cluster.store.pause()  # no renewal can succeed: the term ends within the ttl
    paused_at = time.monotonic()
    try:
        gone_at = wait_gone(child, TTL + 5)
    finally:
        cluster.store.resume()
    assert gone_at is not None, "the run outlived its term: a torn slot hid it"
    assert gone_at - paused_at < TTL + 1.0, f"it ran {gone_at - paused_at:.2f} s after the pause"


def watchdog_pids(worker) -> list[int]:
    return [int(pid) for pid in re.findall(r"run watchdog started \(pid (\d+)\)", worker.text())]


@pytest.mark.slow
def test_a_dead_watchdog_is_replaced_before_the_next_renewal(cluster_for):
    """SIGKILL the leader's watchdog, then stall its main process: the run still ends in time."""
    cluster = cluster_for("redis")
    cluster.start(2)
    old = cluster.leader_worker()
    (first,) = watchdog_pids(old)
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + 5  # a renewal comes every ttl/3 s
    while len(watchdog_pids(old)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(watchdog_pids(old)) == 2, "the dead watchdog was not noticed:\n" + old.text()[-2000:]
    assert "the run watchdog died" in old.text()
    cluster.send("long_terminate", 30)
    rows = cluster.wait_history(lambda r: len(runs(r)) >= 1, 10)
    child = runs(rows)[0]["pid"]
    os.kill(old.proc.pid, signal.SIGSTOP)  # the main process alone: only the watchdog acts
    stopped_at = time.monotonic()
    stream = Stream(cluster, interval=0.05)
    try:
        gone_at = wait_gone(child, TTL + 5)
        new_start = first_start_elsewhere(cluster, old.nodename, TTL + 10)
    finally:
        stream.stop()
        os.kill(old.proc.pid, signal.SIGCONT)
    assert gone_at is not None, "the run kept running: no watchdog ended it"
    assert gone_at - stopped_at < TTL
    assert gone_at < new_start["at"], "the new leader ran leader work while the old run ran"


@pytest.mark.slow
def test_a_watchdog_stopped_with_its_worker_is_not_taken_for_dead(cluster_for):
    """The whole worker is stopped past the watchdog's staleness limit, then continued.

    As after ``docker pause``/``unpause`` or a host suspend: the watchdog
    resumes with its worker. The main process is continued first (the order
    the scheduler may pick), the watchdog 0.1 s later: it is not reported
    dead nor replaced, and the worker still leads. (A ttl of 6 s leaves the
    term valid through the stop, so the wait for the watchdog has room; a
    renewal is due every 0.5 s, so one is due the moment the worker goes on.)
    """
    from celery_leader.term_end.watchdog import STALE_AFTER

    ttl = 6.0
    cluster = cluster_for("redis")
    env = {"LEADER_TTL": str(ttl), "LEADER_RENEW": "0.5", "LEADER_VISIBILITY": "30"}
    (worker,) = cluster.start(1, env=env)
    assert cluster.leader_worker(timeout=ttl + 10) is worker  # a new store: one ttl first
    (first,) = watchdog_pids(worker)
    worker.signal(signal.SIGSTOP)
    try:
        time.sleep(STALE_AFTER + 0.3)
        for pid in [worker.proc.pid, *pool_children(worker.proc.pid, besides=first)]:
            os.kill(pid, signal.SIGCONT)
        time.sleep(0.1)
    finally:
        worker.signal(signal.SIGCONT)
    time.sleep(1.0)  # renewals, each of which asks whether the watchdog lives
    assert watchdog_pids(worker) == [first], worker.text()[-2000:]
    assert "the run watchdog died" not in worker.text()
    assert "lost the lead" not in worker.text(), "the term did not last through the stop"
    assert cluster.leader_worker() is worker


def pool_children(parent: int, besides: int) -> list[int]:
    """The child processes of *parent*, but *besides*."""
    return [
        int(entry)
        for entry in os.listdir("/proc")
        if entry.isdigit() and int(entry) != besides and parent_of(int(entry)) == parent
    ]


@pytest.mark.slow
def test_a_run_longer_than_the_visibility_timeout_runs_once(cluster_for):
    """Redis restores the message of a 9 s run after 4 s: the copy waits, then is dropped.

    Other leader work keeps flowing meanwhile, and nothing is left in the
    queue or unacknowledged afterwards.
    """
    cluster = cluster_for("redis")
    (worker,) = cluster.start(1)  # two pool processes, prefetch 2
    assert cluster.leader_worker() is worker
    long_id = cluster.send("long_terminate", 9).id
    cluster.wait_history(lambda r: len(runs(r)) >= 1, 10)
    time.sleep(5)  # past the visibility timeout (4 s): the message was restored
    others = [cluster.send("leader_record", i).id for i in range(3)]
    rows = cluster.wait_history(
        lambda r: {x["task_id"] for x in r if x["kind"] == "end"} >= set(others), 10
    )
    ended = {x["task_id"] for x in rows if x["kind"] == "end"}
    assert set(others) <= ended, "other leader work waited behind the long run"
    assert long_id not in ended, "the long run was still running"
    rows = cluster.wait_history(lambda r: any(x["task_id"] == long_id for x in runs(r, "end")), 15)
    time.sleep(6)  # a copy restored again would start by now
    rows = cluster.history()
    starts = [x for x in runs(rows) if x["task_id"] == long_id]
    ends = [x for x in runs(rows, "end") if x["task_id"] == long_id]
    assert len(starts) == 1, f"started {len(starts)} times: {starts}"
    assert len(ends) == 1
    broker = cluster.data.client()
    assert broker.llen(leader_queue(cluster)) == 0
    assert broker.hlen("unacked") == 0, "a copy was left unacknowledged"
    assert "runs longer than" in worker.text() or "visibility" in worker.text()


@pytest.mark.slow
def test_a_long_run_that_retries_runs_once_per_try(cluster_for):
    """A copy delivered while a run retries is dropped: the retry's own message runs, once."""
    cluster = cluster_for("redis")
    (worker,) = cluster.start(1)
    assert cluster.leader_worker() is worker
    task_id = cluster.send("long_retry", 6, queue=leader_queue(cluster)).id
    rows = cluster.wait_history(lambda r: any(x["task_id"] == task_id for x in runs(r, "end")), 30)
    time.sleep(6)  # a copy restored again would start by now
    rows = cluster.history()
    starts = [x for x in runs(rows) if x["task_id"] == task_id]
    assert [x["retries"] for x in starts] == [0, 1], starts
    broker = cluster.data.client()
    assert broker.llen(leader_queue(cluster)) == 0
    assert broker.hlen("unacked") == 0, "a copy was left unacknowledged"
