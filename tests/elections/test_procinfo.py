"""Who a process is: three answers from ``/proc``, checked on real processes.

``/proc`` reads are made to fail with the module's test-only fault file
(``procinfo._Fault``), which raises the errno a loaded host gives
(``EMFILE``, ``ENFILE``, ``ENOMEM``) from the read itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from celery_leader.elections import procinfo
from celery_leader.elections.procinfo import Liveness, ProcUnreadableError, liveness
from celery_leader.elections.shared_lease import SharedLease
from tests.proc_fault import ProcFault


@pytest.fixture
def proc_fault(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ProcFault:
    return ProcFault.in_this_process(tmp_path, monkeypatch)


@pytest.fixture
def child():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    deadline = time.monotonic() + 5
    while procinfo.start_time(proc.pid) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    yield proc
    proc.kill()
    proc.wait()


def test_definite_answers_on_real_processes(child):
    """Running, another start time, another parent, a zombie, a reaped pid: each definite."""
    started = procinfo.start_time(child.pid)
    assert started
    assert liveness(child.pid) is Liveness.RUNNING
    assert liveness(child.pid, started, parent=os.getpid()) is Liveness.RUNNING
    assert liveness(child.pid, started + 1) is Liveness.GONE, "the pid names another process"
    assert liveness(child.pid, started, parent=1) is Liveness.GONE, "not our child"
    child.kill()
    deadline = time.monotonic() + 5
    while not procinfo.has_ended(child.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert liveness(child.pid, started) is Liveness.GONE, "a zombie has ended"
    child.wait()
    assert liveness(child.pid, started) is Liveness.GONE
    assert procinfo.start_time(child.pid) is None
    assert liveness(0) is Liveness.GONE


@pytest.mark.parametrize("name", ["EMFILE", "ENFILE", "ENOMEM"])
def test_an_unreadable_proc_is_unknown_never_gone(proc_fault, child, name):
    """While /proc fails, a live child and a reaped one are both UNKNOWN; readers raise."""
    started = procinfo.start_time(child.pid)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    proc_fault.fail(60_000, name)
    try:
        assert liveness(child.pid, started, parent=os.getpid()) is Liveness.UNKNOWN
        assert liveness(dead.pid) is Liveness.UNKNOWN
        for reader in (procinfo.parent_of, procinfo.start_time, procinfo.has_ended):
            with pytest.raises(ProcUnreadableError):
                reader(child.pid)
        assert proc_fault.opened() == [os.getpid()]
    finally:
        proc_fault.heal()
    assert liveness(child.pid, started, parent=os.getpid()) is Liveness.RUNNING
    assert liveness(dead.pid) is Liveness.GONE


def test_liveness_has_no_truth_value():
    """A caller cannot test UNKNOWN as a bool (and so take it for gone)."""
    for state in Liveness:
        with pytest.raises(TypeError):
            bool(state)


def test_run_table_counts_an_unknown_run_as_running(proc_fault, child):
    """The run table's readers keep a run /proc cannot tell about, however stale it may be."""
    shared = SharedLease()
    shared.runs._write(0, child.pid, 5, 1, procinfo.start_time(child.pid) or 0)
    child.kill()
    child.wait()  # gone, but nobody can tell while /proc fails
    proc_fault.fail(60_000)
    try:
        assert [run.pid for run in shared.runs.running(5)] == [child.pid]
    finally:
        proc_fault.heal()
    assert shared.runs.running(5) == [], "a definite answer drops it"


def test_own_start_time_is_not_cached_while_unknown(proc_fault):
    """An unreadable start time reads as 0 and is read again once /proc answers."""
    proc_fault.fail(60_000)
    saved = procinfo._own_start
    procinfo._own_start = None
    try:
        assert procinfo.own_start_time() == 0
        proc_fault.heal()
        assert procinfo.own_start_time() == procinfo.start_time(os.getpid()) != 0
    finally:
        procinfo._own_start = saved
