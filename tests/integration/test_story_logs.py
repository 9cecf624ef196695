"""The logs tell who leads, since when, and instead of whom; inspect agrees during a hold-off.

Real workers on a real Redis broker and store.
"""

from __future__ import annotations

import json
import re
import signal
import time

from harness.cluster import Worker


def wait_for(worker: Worker, pattern: str, timeout: float = 20) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(pattern, worker.text())
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(
        f"{pattern!r} not in the log of {worker.nodename}:\n{worker.text()[-3000:]}"
    )


def test_followers_name_the_leader_and_a_new_leader_names_whom_it_replaced_and_how(cluster_for):
    """A SIGKILLed leader's lease expires; a stopped one's is released: the successor says which."""
    cluster = cluster_for("redis")
    first, second = cluster.start(2)
    leader = cluster.leader_worker()
    follower = second if leader is first else first
    token = wait_for(leader, r"leads election '[^']+' \(token (\d+)\)").group(1)
    wait_for(
        follower,
        rf"election '{cluster.name}' is led by {re.escape(leader.nodename)} \(token {token}\)",
    )

    leader.signal(signal.SIGKILL)
    taken = wait_for(
        follower,
        rf"{re.escape(follower.nodename)} leads election '{cluster.name}' \(token (\d+)\), "
        rf"after {re.escape(leader.nodename)} \(token {token}\), whose lease expired",
    )
    (third,) = cluster.start(1, wait=False)
    third.wait_ready()
    wait_for(third, rf"is led by {re.escape(follower.nodename)} \(token {taken.group(1)}\)")
    follower.stop()
    wait_for(
        third,
        rf"{re.escape(third.nodename)} leads election '{cluster.name}' \(token \d+\), "
        rf"after {re.escape(follower.nodename)} \(token {taken.group(1)}\), which released it",
    )


def test_inspect_says_holding_off_during_the_first_start_hold_off(cluster_for):
    """On a new store the holder waits one ttl: inspect says so, with the time left."""
    cluster = cluster_for("redis")
    cluster.env["LEADER_TTL"] = "8"
    (worker,) = cluster.start(1, wait=False)
    wait_for(worker, r"no record of earlier terms \(a new store, or one that lost its data\)")
    proc = cluster.celery("inspect", "leader", "--json", "--timeout", "3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    view = json.loads(proc.stdout)[worker.nodename]
    assert view["role"] == "follower", view
    assert 0 < view["holding_off"] <= 8, view
    assert view["token"] is None, "no leader work runs under it yet"
    wait_for(worker, r"leads election", timeout=15)
    assert "previous leader" not in worker.text()
