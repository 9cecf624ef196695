"""How named elections move between balanced workers: a step-down, and a worker's death.

Real ``celery worker`` processes on a real Redis broker and store: three
workers, six elections, ttl 4 s, so that a standby that waited out a lease
or a balancing pass (renew interval 1.33 s) would miss the bounds below.
The scenarios are :mod:`harness.election_moves` (``benchmarks.election_moves``
prints their figures).
"""

from __future__ import annotations

import re
import time

import pytest

from harness.election_moves import (
    SIX,
    TTL,
    kill_one_with_two,
    lease_of,
    start_six,
    step_down_one,
)


@pytest.mark.slow
def test_a_step_down_moves_one_election_at_once_and_nothing_else(cluster_for):
    """step-down --election billing: billing is led again within 1 s of its release (a
    standby woken by the release, not one waiting out the lease or a balancing pass), no
    election changes holder again for 3 ttls (nor billing back), and the logs name the
    worker that took it and call it a release."""
    cluster = cluster_for("redis")
    workers = start_six(cluster)
    # Steady: the start's hand-overs are done, and each election's successor has looked at
    # its lease since its holder took it (it tries at each lease end).
    time.sleep(2 * TTL)
    seen = step_down_one(cluster)
    proc = seen.command
    assert proc.returncode == 0, proc.stdout + proc.stderr
    old_holder, old_token = seen.before["billing"] or ("", 0)
    new_holder, new_token = seen.successor
    assert new_holder != old_holder
    # A tenth of the ttl is plenty here; 1 s leaves room for a loaded machine and still
    # fails a standby that waited for a balancing pass (1.33 s) or the lease (4 s).
    assert seen.gap < 1.0, f"billing was led by nobody for {seen.gap:.2f} s after its release"
    assert f"{old_holder} stepped down (token {old_token})" in proc.stdout
    assert f"now leading: {new_holder} (token {new_token})" in proc.stdout, proc.stdout
    for election in SIX:
        expected = seen.successor if election == "billing" else seen.before[election]
        assert seen.seen_after[election] == {expected}, f"{election} moved after the step-down"

    lease = re.escape(lease_of(cluster, "billing"))
    taker = next(w for w in workers if w.nodename == new_holder)
    assert re.search(
        rf"{re.escape(new_holder)} leads election '{lease}' \(token {new_token}\), after "
        rf"{re.escape(old_holder)} \(token {old_token}\), which released it",
        taker.text(),
    ), taker.text()[-3000:]
    said = next(w for w in workers if w.nodename == old_holder).text()
    assert re.search(rf"steps down from election '{lease}' .*to whichever standby takes it", said)
    gave_up = rf"election '{lease}', which this worker gave up, is led by {new_holder} now"
    assert re.search(gave_up, said), said[-3000:]


@pytest.mark.slow
def test_a_killed_worker_with_two_elections_is_replaced_in_each_within_the_ttl(cluster_for):
    """SIGKILL a worker leading two elections: each election's first task runs on another
    worker within ttl + 0.5 s of the kill (the docs: ttl + a little), and within 0.5 s of the
    moment its lease ran out; no standby waits for the dead worker's announcement to expire."""
    cluster = cluster_for("redis")
    workers = start_six(cluster)
    time.sleep(2)  # the spread is settled: no hand-over is under way
    victim, takeovers = kill_one_with_two(cluster, workers)
    assert len(takeovers) == 2
    for took in takeovers:
        assert took.worker != victim.nodename
        assert took.after_kill < TTL + 0.5, f"{took}: first task {took.after_kill:.2f} s after"
        assert took.after_lease_end < 0.5, f"{took}: {took.after_lease_end:.2f} s after its end"
