"""The coordinator's pure parts: request snapshots that fail closed, what may be handed back."""

from __future__ import annotations

import threading
import weakref

import pytest

from celery_leader.term_end.in_worker import SnapshotError, never_dispatched
from celery_leader.term_end.in_worker import snapshot as _snapshot
from celery_leader.worker import coordinator as coordinator_module


class Task:
    def __init__(self, leader_only: bool) -> None:
        self.leader_only = leader_only


class Req:
    """Stands for a Celery request: only the attributes the selection reads."""

    def __init__(self, leader=True, dispatched=False, acknowledged=False):
        self.task = Task(leader)
        self.leader_dispatched = dispatched  # as the gate sets it
        self._apply_result = None  # what eventlet's pool leaves, dispatched or not
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


class Admitting:
    """Stands for the worker's coordinator at the gate: it admits under token 5."""

    class settings:  # noqa: N801 - stands for LeaderSettings
        name = "gate"

    #: The election's lease name and leader queue (stands for a WorkerElection).
    name = "gate"
    queue = "gate.leader"

    def election_for(self, task):
        return self

    def gate_profile(self, task):
        from celery_leader.worker.coordinator import GateProfile

        return GateProfile(self, "cancel", overlap=False)

    def admit(self):
        return 5

    def policy_for(self, task):
        from celery_leader.term_end import OnLoss

        return OnLoss.CANCEL

    def admit_overlap(self, request):
        return True  # no overlap policy on these tasks

    def admit_occurrence(self, request):
        return True  # no occurrence header on these messages

    def claim_occurrence(self, request):
        return None

    def admit_delivery(self, request):
        return True  # no copy of a running message here

    def run_settled(self, request, outcome):
        return None

    @property
    def gate(self):
        return self  # the gate's verdicts, as the coordinator's Gate gives them


class EventletLikePool:
    """A pool whose apply_async returns None, as eventlet's does."""

    def __init__(self):
        self.jobs = []

    def apply_async(self, target, args=None, **options):
        self.jobs.append(args)


def test_a_request_sent_to_a_pool_that_returns_nothing_is_never_handed_back(monkeypatch):
    """The gate marks what it sends to the pool, also where Celery keeps no apply result.

    A request Celery's strategy asks on receipt (a message with an expiry)
    is admitted but not yet sent: it stays one to hand back.
    """
    from celery import Celery
    from celery.contrib.testing.mocks import TaskMessage

    from celery_leader import leader_only
    from celery_leader.worker.request import LeaderRequest

    app = Celery("gate", set_as_current=False)

    @leader_only
    @app.task(name="gate.job", shared=False)
    def job():
        return None

    app.finalize()
    monkeypatch.setattr(coordinator_module, "_current", Admitting())
    received = LeaderRequest(TaskMessage("gate.job", id="a"), app=app, task=app.tasks["gate.job"])
    sent = LeaderRequest(TaskMessage("gate.job", id="b"), app=app, task=app.tasks["gate.job"])
    assert received.revoked() is False  # as the strategy asks on receipt
    pool = EventletLikePool()
    sent.execute_using_pool(pool)
    assert pool.jobs and sent._apply_result is None
    assert sent.leader_dispatched and sent.leader_token == 5
    assert never_dispatched([received, sent]) == [received]


def test_release_guard_waits_for_a_run_the_parent_has_not_seen_start():
    """A pool child that started a job before the parent read its acknowledgement holds the lease.

    The child recorded the run in the run table; the guard waits for it
    whatever its policy, and a killed child no longer counts.
    """
    import subprocess
    import sys
    import time

    from celery_leader.elections import procinfo
    from celery_leader.settings import load_settings

    settings = load_settings({"leader_backend_url": "memory://guard"}, "t")
    coordinator = coordinator_module.Coordinator(
        settings, _memory_store(), nodename="n@h", pool_kind="prefork"
    )
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 5
        while (started := procinfo.start_time(child.pid)) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        coordinator.shared.runs._write(0, child.pid, 7, 0, started)  # a cancel run of term 7
        assert coordinator.runs_ended(7, timeout=0.1) is False
        assert coordinator.runs_ended(6, timeout=0.1) is True, "an older term's guard ignores it"
        child.kill()
        child.wait()
        assert coordinator.runs_ended(7, timeout=0.5) is True
    finally:
        child.kill()
        child.wait()


def test_a_dead_watchdog_is_replaced_before_a_renewal_and_fails_health_until_then(monkeypatch):
    """is_live() (asked before every renewal) replaces a dead watchdog; /healthz says it died."""
    import os
    import signal
    import time

    from celery_leader.observe.health import verdict
    from celery_leader.settings import load_settings
    from celery_leader.term_end.watchdog import Watchdog

    settings = load_settings({"leader_backend_url": "memory://watchdog"}, "t")
    coordinator = coordinator_module.Coordinator(
        settings, _memory_store(), nodename="n@h", pool_kind="prefork"
    )
    coordinator.watchdog.start()
    coordinator.loop.start()  # the lease thread is not started: only this test renews
    try:
        first = coordinator.watchdog.pid
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while coordinator.watchdog.alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        answer = verdict(coordinator, 60)
        assert (answer.healthy, answer.status) == (False, "watchdog-dead")
        assert coordinator.is_live()
        assert coordinator.watchdog.alive() and coordinator.watchdog.pid != first
        assert verdict(coordinator, 60).status != "watchdog-dead"

        os.kill(coordinator.watchdog.pid, signal.SIGKILL)
        while coordinator.watchdog.alive() and time.monotonic() < deadline + 5:
            time.sleep(0.01)

        def cannot_fork(self):
            raise OSError("fork failed")

        monkeypatch.setattr(Watchdog, "start", cannot_fork)
        assert coordinator.is_live() is False, "no renewal while no watchdog runs"
    finally:
        monkeypatch.undo()
        coordinator.watchdog.stop()


def test_a_reconnect_forgets_what_waited_for_a_key_also_in_the_redelivery_record():
    """A message admitted by the redelivery record that then waited for an overlap key never
    ran; after a reconnect the broker delivers it again (on AMQP under a new delivery tag).
    That delivery must run, not wait behind a run that will never settle."""
    from celery_leader.settings import load_settings
    from celery_leader.tasks.overlap import Overlap
    from celery_leader.worker.redelivery import RUN, WAIT

    class Message:
        def __init__(self, tag):
            self.delivery_tag = tag

    class Request:
        def __init__(self, task_id, tag, parent_id=None):
            self.id, self.parent_id, self.acknowledged = task_id, parent_id, False
            self._message = Message(tag)
            self.leader_recorded = False

        def humaninfo(self):
            return f"task[{self.id}]"

    settings = load_settings({"leader_backend_url": "memory://reconnect"}, "t")
    coordinator = coordinator_module.Coordinator(
        settings, _memory_store(), nodename="n@h", pool_kind="prefork"
    )
    running, waiting = Request("a", "tag-a"), Request("b", "tag-b")
    for request in (running, waiting):
        assert coordinator.gate.redeliveries.admit(request) == RUN
        request.leader_recorded = True
    assert coordinator.gate.overlaps.admit(running, "key", Overlap.BUFFER_ONE) == RUN
    assert coordinator.gate.overlaps.admit(waiting, "key", Overlap.BUFFER_ONE) == WAIT
    again = Request("b", "tag-b2")  # the broker's delivery after the reconnect
    assert coordinator.gate.redeliveries.admit(again) == WAIT, "before: held behind 'b'"
    coordinator.detach()
    assert coordinator.gate.redeliveries.admit(Request("b", "tag-b3")) == RUN
