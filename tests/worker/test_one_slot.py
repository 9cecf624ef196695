"""When the one-slot warning is said, and what it says: pure logic over the pool and its size."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from celery_leader.worker.one_slot import pool_slots, warn_about_one_slot


def task(name, overlap="allow"):
    return SimpleNamespace(name=name, leader_overlap=overlap)


TASKS = [task("b.buffer", "buffer_one"), task("a.skip", "skip"), task("c.plain")]


@pytest.mark.parametrize(
    ("pool", "concurrency", "autoscale", "slots"),
    [
        ("prefork", 1, 0, 1),
        ("prefork", 2, 0, 2),
        ("prefork", 1, 4, 4),  # --autoscale 4,1: the pool grows when messages wait
        ("thread", 1, 0, 1),
        ("gevent", 1, 0, 1),
        ("solo", 8, 0, 1),  # solo runs one task at a time, whatever -c says
    ],
)
def test_pool_slots(pool, concurrency, autoscale, slots):
    """Solo is one slot; any other pool is its largest size."""
    assert pool_slots(pool, concurrency, autoscale) == slots


def test_one_line_per_overlap_task_on_one_slot(caplog):
    """-c 1, prefetch multiplier 1: one WARNING per task with skip or buffer_one, by name,
    with the policy, why, and the remedy."""
    with caplog.at_level(logging.WARNING):
        warn_about_one_slot(TASKS, "prefork", 1, prefetch_multiplier=1)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert all(r.levelno == logging.WARNING for r in caplog.records)
    assert messages[0].startswith("celery-leader: a.skip has overlap='skip'")
    assert messages[1].startswith("celery-leader: b.buffer has overlap='buffer_one'")
    for message in messages:
        assert "(pool prefork, concurrency 1)" in message
        assert "the run holds the only prefetch slot" in message
        assert "instead of being skipped" in message
        assert message.endswith("Start the worker with -c 2 or more (--concurrency)")


def test_a_larger_prefetch_is_counted(caplog):
    """Multiplier 4: three messages sent during a run reach the gate in time, no more."""
    with caplog.at_level(logging.WARNING):
        warn_about_one_slot(TASKS, "thread", 1, prefetch_multiplier=4)
    assert len(caplog.records) == 2
    assert all(
        "one of the 4 prefetch slots" in r.getMessage()
        and "only 3 reach the gate" in r.getMessage()
        for r in caplog.records
    )


def test_solo_is_told_to_use_another_pool(caplog):
    """Solo: its run blocks the loop whatever the prefetch; -c does not help."""
    with caplog.at_level(logging.WARNING):
        warn_about_one_slot(TASKS, "solo", 4, prefetch_multiplier=0)
    assert len(caplog.records) == 2
    for record in caplog.records:
        assert "(pool solo)" in record.getMessage()
        assert "blocks the worker's loop" in record.getMessage()
        assert record.getMessage().endswith("e.g. -P prefork -c 2")


@pytest.mark.parametrize(
    ("pool", "concurrency", "autoscale", "multiplier"),
    [("prefork", 2, 0, 1), ("thread", 1, 3, 1), ("prefork", 1, 0, 0)],
    ids=["c2", "autoscale-3", "unlimited-prefetch"],
)
def test_nothing_said_when_the_gate_sees_the_messages(
    caplog, pool, concurrency, autoscale, multiplier
):
    """Two slots or more (or an autoscale maximum of two or more), or a prefetch without
    limit: no warning."""
    with caplog.at_level(logging.WARNING):
        warn_about_one_slot(TASKS, pool, concurrency, autoscale, prefetch_multiplier=multiplier)
    assert caplog.records == []
