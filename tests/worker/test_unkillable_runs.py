"""Which leader tasks the start-up warning names: pure logic over task options and the pool."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from celery_leader.term_end import OnLoss
from celery_leader.worker.unkillable_runs import unkillable_runs, warn_about_unkillable_runs


def task(name, overlap="allow", on_loss=None):
    return SimpleNamespace(name=name, leader_overlap=overlap, leader_on_loss=on_loss)


def app(*scheduled):
    schedule = {f"e{i}": {"task": name, "schedule": 60.0} for i, name in enumerate(scheduled)}
    return SimpleNamespace(conf=SimpleNamespace(beat_schedule=schedule))


TASKS = [
    task("a.skip", "skip"),
    task("b.finish", "buffer_one", "finish"),
    task("c.cancel", "skip", "cancel"),
    task("d.scheduled"),
    task("e.plain", on_loss="cancel"),
]


@pytest.mark.parametrize(
    ("pool", "expected"),
    [
        (
            "prefork",
            [("b.finish", ("overlap",), OnLoss.FINISH), ("c.cancel", ("overlap",), OnLoss.CANCEL)],
        ),
        (
            "thread",
            [
                ("a.skip", ("overlap",), OnLoss.CANCEL),
                ("b.finish", ("overlap",), OnLoss.FINISH),
                ("c.cancel", ("overlap",), OnLoss.CANCEL),
                ("d.scheduled", ("occurrence",), OnLoss.CANCEL),
            ],
        ),
    ],
)
def test_tasks_named_per_pool(pool, expected):
    """Keyed tasks whose on_loss in the pool is not terminate; unkeyed ones never."""
    found = unkillable_runs(TASKS, app("d.scheduled", "e.unregistered"), pool)
    assert [(f.task.name, f.guards, f.policy) for f in found] == expected


def test_a_task_with_both_is_named_once_with_both(caplog):
    """Overlap and occurrences in one task: one line naming both; finish says every run."""
    with caplog.at_level(logging.WARNING):
        warn_about_unkillable_runs(app("x.both"), [task("x.both", "skip", "finish")], "prefork")
    (record,) = caplog.records
    message = record.getMessage()
    assert "has overlap='skip' and beat_schedule entries" in message
    assert "every run goes on after its term" in message
    assert "same overlap key or occurrence" in message
    assert "Use on_loss='terminate'" in message
