"""A term's end when ``/proc`` cannot answer: unknown counts as running, and is asked again.

Real child processes of this test stand in for pool children; ``/proc``
reads fail through ``procinfo``'s test-only fault file.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from celery_leader import clock
from celery_leader.elections import procinfo
from celery_leader.elections.shared_lease import SharedLease
from celery_leader.term_end.in_worker import kill_recorded_runs
from celery_leader.term_end.watchdog import WATCH_INTERVAL, enforce_deadlines, watch_pass
from tests.proc_fault import ProcFault


@pytest.fixture
def proc_fault(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ProcFault:
    return ProcFault.in_this_process(tmp_path, monkeypatch)


@pytest.fixture
def child():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def record(shared: SharedLease, index: int, proc: subprocess.Popen, token: int) -> None:
    """Write a terminate run of *token* in slot *index* as the child *proc* would."""
    deadline = time.monotonic() + 5
    while (started := procinfo.start_time(proc.pid)) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    shared.runs._write(index, proc.pid, token, 1, started or 0)


def test_watchdog_judges_an_unknown_run_again_at_the_next_pass(proc_fault, child):
    """A revoked run met while /proc fails is not done with: a later pass kills it."""
    shared = SharedLease()
    record(shared, 0, child, 6)
    shared.revoke(6)
    done: set[tuple[int, int]] = set()
    proc_fault.fail(60_000)
    try:
        assert enforce_deadlines(shared, os.getpid(), done) == []
        now = clock.now()
        assert watch_pass(shared.group, os.getpid(), done, now) == now + WATCH_INTERVAL, (
            "the next pass comes within one watch interval"
        )
        assert proc_fault.opened() == [os.getpid()]
    finally:
        proc_fault.heal()
    assert child.poll() is None
    assert enforce_deadlines(shared, os.getpid(), done) == [child.pid]
    assert child.wait(5) == -signal.SIGKILL
    assert shared.runs.was_killed(child.pid, 6)


def test_parent_kill_asks_again_until_proc_answers(proc_fault, child):
    """The parent's kill on loss asks again about a run /proc cannot tell about, then kills it."""
    shared = SharedLease()
    record(shared, 0, child, 4)
    shared.revoke(4)
    proc_fault.fail(150)
    began = time.monotonic()
    assert kill_recorded_runs(shared, 4, "lease lost") == [child.pid]
    assert time.monotonic() - began < 1.0 + 0.5, "within the release guard's own wait"
    assert proc_fault.opened() == [os.getpid()], "the first look met the failure"
    assert child.wait(5) == -signal.SIGKILL


def test_parent_kill_gives_up_at_its_bound_and_still_counts_the_run(proc_fault, child, caplog):
    """/proc silent past the bound: nothing is killed blind, a warning, and the run still counts."""
    shared = SharedLease()
    record(shared, 0, child, 4)
    shared.revoke(4)
    proc_fault.fail(60_000)
    try:
        with caplog.at_level(logging.WARNING, logger="celery_leader.term_end.in_worker"):
            assert kill_recorded_runs(shared, 4, "lease lost", retry_for=0.1) == []
        assert f"/proc does not answer for pool child pid(s) {child.pid}" in caplog.text
        assert [run.pid for run in shared.runs.running(4)] == [child.pid], "the guard still waits"
    finally:
        proc_fault.heal()
    assert child.poll() is None, "not killed without a definite answer"
