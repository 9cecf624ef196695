"""A term ends on time where the work runs: revocation that waits on nothing.

Real ``celery worker`` processes and real redis-servers. Each test pins one
way the end of a term could come late: a stalled main process, a slow store,
a renewal that undoes a step-down, a release before the work stopped.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from celery_leader.elections.procinfo import has_ended
from tests.integration.test_workers import Stream

TTL = 2.0


def runs(rows, kind="start"):
    return [r for r in rows if r["kind"] == kind]


def wait_gone(pid: int, timeout: float) -> float | None:
    """Monotonic time at which *pid* was first seen gone, or None within *timeout*."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if has_ended(pid):
            return time.monotonic()
        time.sleep(0.005)
    return None


def first_start_elsewhere(cluster, node, timeout):
    """The first leader-task start recorded by a worker other than *node*."""
    rows = cluster.wait_history(lambda r: any(x["worker"] != node for x in runs(r)), timeout)
    others = [x for x in runs(rows) if x["worker"] != node]
    assert others, "another worker ran leader work"
    return min(others, key=lambda x: x["at"])


@pytest.mark.slow
@pytest.mark.parametrize(("task", "arg"), [("long_terminate", 30), ("gil_terminate", 30)])
def test_stalled_main_process_child_stops_its_own_leader_work(cluster_for, task, arg):
    """SIGSTOP of the main process alone: the child's run ends by itself, before a new leader's."""
    cluster = cluster_for("redis")
    cluster.start(2)
    old = cluster.leader_worker()
    cluster.send(task, arg)
    rows = cluster.wait_history(lambda r: len(runs(r)) >= 1, 10)
    child = runs(rows)[0]["pid"]
    time.sleep(0.3)  # let a renewal or two pass: the switch must follow them
    os.kill(old.proc.pid, signal.SIGSTOP)  # the main process alone, not its children
    stopped_at = time.monotonic()
    stream = Stream(cluster, interval=0.05)  # leader work for whoever leads next
    try:
        gone_at = wait_gone(child, TTL + 5)
        new_start = first_start_elsewhere(cluster, old.nodename, TTL + 10)
    finally:
        stream.stop()
        os.kill(old.proc.pid, signal.SIGCONT)
    assert gone_at is not None, "the leader task kept running while its main process was stopped"
    assert gone_at - stopped_at < TTL, f"it ran {gone_at - stopped_at:.2f} s after the stop"
    assert gone_at < new_start["at"], "the new leader ran leader work while the old run ran"
    rows = cluster.history()
    assert not [r for r in rows if r["kind"] == "end" and r["worker"] == old.nodename]
    assert new_start["token"] > runs(rows)[0]["token"]


@pytest.mark.slow
def test_main_process_killed_children_stop_at_once(cluster_for):
    """SIGKILL of the main process alone: billiard stops the child within moments (kept)."""
    cluster = cluster_for("redis")
    cluster.start(2)
    old = cluster.leader_worker()
    cluster.send("long_terminate", 30)
    rows = cluster.wait_history(lambda r: len(runs(r)) >= 1, 10)
    child = runs(rows)[0]["pid"]
    os.kill(old.proc.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    gone_at = wait_gone(child, 5)
    assert gone_at is not None and gone_at - killed_at < 1.0


@pytest.mark.slow
def test_step_down_is_not_undone_by_the_next_renewal(cluster_for):
    """A cancel task polling slower than renewals sees the step-down; the new leader waits."""
    cluster = cluster_for("redis")
    cluster.start(2)
    old = cluster.leader_worker()
    cluster.send("poll_cancel", 30, "C", 1.5)  # renew interval is ttl/3 = 0.67 s
    cluster.wait_history(lambda r: len(runs(r)) >= 1, 10)
    time.sleep(0.2)
    stream = Stream(cluster, interval=0.05)
    try:
        proc = cluster.celery("leader", "step-down", "--timeout", "20")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        new_start = first_start_elsewhere(cluster, old.nodename, 15)
    finally:
        stream.stop()
    rows = cluster.history()
    saw = [r for r in rows if r["kind"] == "saw-loss" and r.get("tag") == "C"]
    assert saw, "the cooperative task was never told its term ended"
    assert saw[0]["at"] < new_start["at"], "the new leader started before the old task stopped"


@pytest.mark.slow
def test_slow_store_calls_cannot_delay_the_end_of_the_term(cluster_for):
    """A renewal of several late round trips that then hangs: the old run ends before the next."""
    import redis as redis_lib

    from harness.proxy import FaultProxy

    cluster = cluster_for("redis")
    # ttl 2, renew 0.6, store timeout 1.2: a read may take 0.6 s. The renewal
    # after the switch fails at once (its connection was closed); the retry,
    # started in time, opens a fresh connection (CLIENT SETNAME and two
    # SETINFO, each reply 0.55 s late) and its EVALSHA meets NOSCRIPT, held:
    # 2.25 s in all, none of it applied, where validity leaves it 1.2 s.
    cluster.env.update(LEADER_RENEW="0.6", LEADER_STORE_TIMEOUT="1.2")
    proxy = FaultProxy(cluster.store.port)
    direct = cluster.env["LEADER_STORE"]
    cluster.env["LEADER_STORE"] = f"redis://127.0.0.1:{proxy.port}/0"
    try:
        (old,) = cluster.start(1)
    finally:
        cluster.env["LEADER_STORE"] = direct
    assert cluster.leader_worker() is old
    cluster.start(1)
    cluster.send("long_terminate", 30)
    rows = cluster.wait_history(lambda r: len(runs(r)) >= 1, 10)
    child = runs(rows)[0]["pid"]
    admin = redis_lib.Redis.from_url(direct)
    try:
        # Right after the next renewal: every reply 0.55 s late (just inside the
        # 0.6 s read timeout), the fourth on a connection held; no cached scripts.
        proxy.after_next_reply("trickle", delay=0.55, hang_after=3)
        deadline = time.monotonic() + 5
        while proxy.mode != "trickle" and time.monotonic() < deadline:
            time.sleep(0.001)
        admin.script_flush()
        stream = Stream(cluster, interval=0.05)
        gone_at = wait_gone(child, 15)
        new_start = first_start_elsewhere(cluster, old.nodename, 20)
        stream.stop()
    finally:
        proxy.set_mode("pass")
        proxy.close()
        admin.close()
    assert gone_at is not None, "the old leader's run never ended"
    assert gone_at < new_start["at"], (
        f"the new leader started {gone_at - new_start['at']:.2f} s before the old run ended"
    )


@pytest.mark.slow
def test_warm_shutdown_tells_a_slow_polling_task_before_anyone_else_leads(cluster_for):
    """SIGTERM of the leader: its cancel task sees the loss at its next poll; then the release."""
    cluster = cluster_for("redis")
    cluster.start(2)
    old = cluster.leader_worker()
    cluster.send("poll_cancel", 30, "W", 1.5)
    cluster.wait_history(lambda r: len(runs(r)) >= 1, 10)
    time.sleep(0.2)
    stream = Stream(cluster, interval=0.05)
    try:
        old.proc.send_signal(signal.SIGTERM)
        new_start = first_start_elsewhere(cluster, old.nodename, 15)
    finally:
        stream.stop()
    saw = [r for r in cluster.history() if r["kind"] == "saw-loss" and r.get("tag") == "W"]
    assert saw, "the cooperative task was told its term ended"
    assert saw[0]["at"] < new_start["at"]
    assert new_start["at"] - saw[0]["at"] < TTL, "released as soon as the run stopped"


@pytest.mark.slow
def test_step_down_kills_a_finish_task_after_the_grace_period_in_prefork(cluster_for):
    """A finish task at step-down: prefork kills it after leader_stop_grace, then releases."""
    cluster = cluster_for("redis")
    cluster.start(2)
    old = cluster.leader_worker()
    cluster.send("slow_finish", 30, "F")
    rows = cluster.wait_history(lambda r: len(runs(r)) >= 1, 10)
    started = runs(rows)[0]
    asked_at = time.monotonic()
    stream = Stream(cluster, interval=0.05)
    try:
        proc = cluster.celery("leader", "step-down", "--timeout", "20")
        new_start = first_start_elsewhere(cluster, old.nodename, 15)
    finally:
        stream.stop()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "killing" in old.text() and started["task_id"] in old.text()
    assert new_start["at"] - asked_at >= TTL * 0.9, "the task had its grace period"
    ends = [r for r in cluster.history() if r["kind"] == "end" and r.get("tag") == "F"]
    assert all(r["worker"] != old.nodename for r in ends), "the old run never finished"


@pytest.mark.slow
def test_threads_pool_keeps_the_lease_until_its_unstoppable_run_ends(cluster_for):
    """A finish task in a threads pool: step-down exits 3; the lease goes only when it ended."""
    cluster = cluster_for("redis")
    cluster.start(2, pool="threads")
    old = cluster.leader_worker()
    # 12 s: the run must outlast the command's 3 s timeout also when the command itself
    # takes seconds to start on a loaded machine.
    cluster.send("slow_finish", 12, "K")
    cluster.wait_history(lambda r: len(runs(r)) >= 1, 10)
    stream = Stream(cluster, interval=0.05)
    try:
        proc = cluster.celery("leader", "step-down", "--timeout", "3")
        assert proc.returncode == 3, proc.stdout + proc.stderr
        assert "still run" in proc.stdout
        new_start = first_start_elsewhere(cluster, old.nodename, 25)
    finally:
        stream.stop()
    end = next(r for r in cluster.history() if r["kind"] == "end" and r.get("tag") == "K")
    assert end["worker"] == old.nodename
    assert end["at"] < new_start["at"], "nobody led while the old run still ran"


@pytest.mark.slow
@pytest.mark.parametrize("task", ["long_terminate", "gil_terminate"])
def test_a_healthy_leaders_long_terminate_run_outlives_many_ttls(cluster_for, task):
    """Renewals move the switch: a terminate run lasting 3 ttls on a healthy leader completes."""
    cluster = cluster_for("redis")
    cluster.start(1)
    leader = cluster.leader_worker()
    cluster.send(task, 3 * TTL)
    rows = cluster.wait_history(lambda r: bool(runs(r, "end")), 30)
    ends = runs(rows, "end")
    assert ends and ends[0]["worker"] == leader.nodename
    assert ends[0]["at"] - runs(rows)[0]["at"] > 2 * TTL
    assert "SIGALRM" not in leader.text() and "killing" not in leader.text()
