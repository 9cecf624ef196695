"""``overlap`` on a worker that runs one task at a time: what happens, and the start-up warning.

Real ``celery worker`` processes: ``keyedapp`` for the warning (its tasks
differ only in their options), ``leaderapp`` for the behaviour.
"""

from __future__ import annotations

import re
import time

import pytest

from tests.integration.test_overlap import TASK, runs, state_of

KEYED = "tests.integration.keyedapp"
WARNED = re.compile(
    r"WARNING.*celery-leader: tests\.integration\.(\w+)\.(\w+) has overlap='(\w+)', "
    r"but this worker runs one task at a time"
)


def one_slot_lines(worker) -> list[tuple[str, str, str]]:
    return WARNED.findall(worker.text())


@pytest.mark.parametrize(
    ("pool", "extra", "why"),
    [
        ("prefork", ["-c", "1"], "only 3 reach the gate in time"),  # keyedapp: multiplier 4
        ("prefork", ["-c", "1", "--prefetch-multiplier", "1"], "holds the only prefetch slot"),
        ("threads", ["-c", "1"], "only 3 reach the gate in time"),
        ("solo", [], "blocks the worker's loop"),
        ("prefork", ["-c", "2"], None),
    ],
    ids=["prefork-c1", "prefork-c1-prefetch1", "threads-c1", "solo", "prefork-c2"],
)
def test_start_up_warns_once_per_overlap_task_on_one_slot(cluster_for, pool, extra, why):
    """-c 1 and solo: one line per task with skip or buffer_one, saying why and the remedy;
    -c 2: none."""
    cluster = cluster_for("redis")
    (worker,) = cluster.start(1, pool, extra=extra, app=KEYED)
    found = one_slot_lines(worker)
    if why is None:
        assert found == [], worker.text()[-3000:]
        return
    expected = [
        ("keyedapp", "buffer_terminate", "buffer_one"),
        ("keyedapp", "skip_cancel", "skip"),
        ("keyedapp", "skip_default", "skip"),
    ]
    assert found == expected, worker.text()[-3000:]
    lines = [line for line in worker.text().splitlines() if WARNED.search(line)]
    remedy = "-P prefork -c 2" if pool == "solo" else "-c 2 or more"
    assert all(why in line and remedy in line for line in lines), lines


@pytest.mark.slow
@pytest.mark.parametrize(
    ("pool", "extra"), [("prefork", ["-c", "1"]), ("solo", [])], ids=["prefork-c1", "solo"]
)
def test_on_one_slot_messages_sent_during_a_run_run_after_it(cluster_for, pool, extra):
    """What the docs say of -c 1 with a prefetch multiplier of 1 (leaderapp's) and of
    solo: overlap="skip" skips nothing there; the two messages sent while a run goes on each
    run after it, one at a time."""
    cluster = cluster_for("redis")
    cluster.env["LEADER_RESULTS"] = cluster.env["LEADER_HISTORY"]
    (worker,) = cluster.start(1, pool, extra=extra)
    assert ("leaderapp", "overlap_skip", "skip") in one_slot_lines(worker)
    cluster.leader_worker()
    first = cluster.send("overlap_skip", 2.0, "first")
    cluster.wait_history(runs, 10)
    sent_during = time.monotonic()
    later = [cluster.send("overlap_skip", 0.3, tag) for tag in ("second", "third")]
    rows = cluster.wait_history(lambda r: len(runs(r, "end")) >= 3, 20)
    starts, ends = runs(rows), runs(rows, "end")
    assert [r["task_id"] for r in starts] == [first.id, *(r.id for r in later)], rows
    assert runs(rows)[0]["at"] < sent_during < ends[0]["at"], "sent while the first one ran"
    for before, after in zip(ends, starts[1:], strict=False):
        assert before["at"] <= after["at"], "one at a time: each started after the one before"
    for result in (first, *later):
        assert state_of(cluster, result.id)[0] != "SKIPPED"
    assert f"{TASK}.overlap_skip" in worker.text()
