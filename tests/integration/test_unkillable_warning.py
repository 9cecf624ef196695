"""One start-up warning per leader task whose key assumes runs that can be stopped.

Real ``celery worker`` processes of ``keyedapp`` on the threads, solo and
prefork pools.
"""

from __future__ import annotations

import re

import pytest

APP = "tests.integration.keyedapp"
WARNED = re.compile(r"celery-leader: tests\.integration\.keyedapp\.(\w+) has (.*?), but its runs")
#: The tasks warned about per pool, with what assumes their runs end with the term.
EXPECTED = {
    "threads": {
        "buffer_terminate": "overlap='buffer_one'",
        "scheduled": "beat_schedule entries (each occurrence runs once)",
        "skip_cancel": "overlap='skip'",
        "skip_default": "overlap='skip'",
    },
    "solo": {
        "buffer_terminate": "overlap='buffer_one'",
        "scheduled": "beat_schedule entries (each occurrence runs once)",
        "skip_cancel": "overlap='skip'",
        "skip_default": "overlap='skip'",
    },
    # terminate kills at the term's end: only the task that asked for cancel.
    "prefork": {"skip_cancel": "overlap='skip'"},
}


@pytest.mark.parametrize("pool", ["threads", "solo", "prefork"])
def test_start_up_warns_once_per_task_whose_runs_may_outlive_the_term(cluster_for, pool):
    """Overlap and occurrence tasks a pool cannot stop are named once each, with the remedy."""
    cluster = cluster_for("redis")
    (worker,) = cluster.start(1, pool, app=APP)
    text = worker.text()
    found = WARNED.findall(text)
    assert sorted(name for name, _ in found) == sorted(EXPECTED[pool]), text[-3000:]
    assert dict(found) == EXPECTED[pool]
    lines = [line for line in text.splitlines() if WARNED.search(line)]
    assert all("WARNING" in line for line in lines), lines
    remedy = "Use on_loss='terminate'" if pool == "prefork" else "Use the prefork pool with on_loss"
    assert all(remedy in line for line in lines)
    assert all("poll celery_leader.lease_lost()" in line for line in lines)
    assert all(f"pool {'thread' if pool == 'threads' else pool}" in line for line in lines)
