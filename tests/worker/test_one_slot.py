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
    """-c 1: one WARNING per task with skip or buffer_one, by name, with policy and remedy."""
    with caplog.at_level(logging.WARNING):
        warn_about_one_slot(TASKS, "prefork", 1)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert all(r.levelno == logging.WARNING for r in caplog.records)
    assert messages[0].startswith("celery-leader: a.skip has overlap='skip'")
    assert "instead of being skipped" in messages[0]
    assert messages[1].startswith("celery-leader: b.buffer has overlap='buffer_one'")
    assert "none skipped" in messages[1]
    assert all("(pool prefork, concurrency 1)" in m for m in messages)
    assert all("-c 2 or more" in m for m in messages)


def test_solo_is_told_to_use_another_pool(caplog):
    """Solo: -c does not help; the remedy names a pool that runs two tasks at once."""
    with caplog.at_level(logging.WARNING):
        warn_about_one_slot(TASKS, "solo", 4)
    assert len(caplog.records) == 2
    assert all("(pool solo)" in r.getMessage() for r in caplog.records)
    assert all("-P prefork -c 2" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("pool", "concurrency", "autoscale"), [("prefork", 2, 0), ("thread", 1, 3)]
)
def test_nothing_said_with_a_second_slot(caplog, pool, concurrency, autoscale):
    """Two slots or more (or an autoscale maximum of two or more): no warning."""
    with caplog.at_level(logging.WARNING):
        warn_about_one_slot(TASKS, pool, concurrency, autoscale)
    assert caplog.records == []
