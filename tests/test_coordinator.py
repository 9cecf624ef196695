"""The coordinator's pure parts: request snapshots that fail closed, what may be handed back."""

from __future__ import annotations

import threading
import weakref

import pytest

from celery_leader.worker import coordinator as coordinator_module
from celery_leader.worker.coordinator import SnapshotError, _snapshot, never_dispatched


class Task:
    def __init__(self, leader_only: bool) -> None:
        self.leader_only = leader_only


class Req:
    """Stands for a Celery request: only the attributes the selection reads."""

    def __init__(self, leader=True, dispatched=False, acknowledged=False):
        self.task = Task(leader)
        self._apply_result = (lambda: None) if dispatched else None  # as Celery sets it
        self.acknowledged = acknowledged


def test_snapshot_copies_a_weakset_while_another_thread_changes_it():
    """Copies taken while the set changes never fail and hold only live members."""
    members = weakref.WeakSet()
    keep = [Req() for _ in range(50)]
    for item in keep:
        members.add(item)
    stop = threading.Event()

    def churn():
        while not stop.is_set():
            extra = Req()
            members.add(extra)
            members.discard(extra)
            del extra

    thread = threading.Thread(target=churn, daemon=True)
    thread.start()
    try:
        for _ in range(20000):
            copied = _snapshot(members)
            assert set(map(id, keep)) <= set(map(id, copied))
    finally:
        stop.set()
        thread.join(5)


class Unreadable:
    """A request set whose copy always fails, as a set changing mid-copy would."""

    def __iter__(self):
        raise RuntimeError("Set changed size during iteration")


def test_snapshot_fails_closed_instead_of_answering_nothing_runs():
    """When the set cannot be copied, the snapshot raises: it never claims no run exists."""
    with pytest.raises(SnapshotError):
        _snapshot(Unreadable())


def test_runs_ended_answers_no_when_runs_cannot_be_listed(monkeypatch):
    """The release guard cannot confirm that work stopped when the runs cannot be listed."""
    from celery_leader.settings import load_settings

    settings = load_settings({"leader_backend_url": "memory://snapshot"}, "t")
    coordinator = coordinator_module.Coordinator(
        settings, _memory_store(), nodename="n@h", pool_kind="prefork"
    )
    monkeypatch.setattr(coordinator_module.worker_state, "active_requests", Unreadable())
    assert coordinator.runs_ended(7, timeout=0.05) is False


def _memory_store():
    from celery_leader.stores import open_store

    return open_store("memory://snapshot", timeout=1)


def test_only_messages_that_never_reached_the_pool_are_handed_back():
    """Dispatched, acknowledged and plain requests are left alone; each waiting one once."""
    waiting = Req()
    dispatched = Req(dispatched=True)  # in the pool, maybe started but not yet acknowledged
    acked = Req(acknowledged=True)
    plain = Req(leader=False)
    chosen = never_dispatched([waiting, dispatched, acked, plain, waiting])
    assert chosen == [waiting]
