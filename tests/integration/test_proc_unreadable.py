"""A run whose term ends is killed though ``/proc`` fails to answer then (real workers).

Each process of the leader's worker (main process, watchdog, pool children)
fails its ``/proc`` reads for a window that opens at its first read after the
test arms the fault file: the reads of the end of the term itself.
"""

from __future__ import annotations

import time

import pytest

from tests.integration.test_term_end import TTL, runs, wait_gone
from tests.proc_fault import FAULT_ENV, ProcFault


@pytest.mark.slow
@pytest.mark.parametrize("millis", [30, 100])
def test_run_is_killed_at_lease_loss_while_proc_fails(cluster_for, tmp_path, millis):
    """Store paused under a long terminate run, /proc failing as the term ends: the run dies."""
    fault = ProcFault(tmp_path / "proc-fault")
    cluster = cluster_for("redis")
    (worker,) = cluster.start(1, env={FAULT_ENV: str(fault.path)})
    cluster.leader_worker()
    cluster.send("long_terminate", 30)
    rows = cluster.wait_history(lambda r: len(runs(r)) >= 1, 10)
    child = runs(rows)[0]["pid"]
    fault.fail(millis, "EMFILE")
    cluster.store.pause()
    paused_at = time.monotonic()
    try:
        gone_at = wait_gone(child, TTL + 5)
    finally:
        cluster.store.resume()
    assert fault.opened(), "the worker met the failing reads"
    assert gone_at is not None, "the run outlived its term: /proc's failure was taken for gone"
    assert gone_at - paused_at < TTL + 1.0, f"it ran {gone_at - paused_at:.2f} s after the pause"
    assert not [r for r in cluster.history() if r["kind"] == "end"], "the run never finished"
    assert "killing" in worker.text() or "watchdog" in worker.text()
