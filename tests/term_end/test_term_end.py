"""The end of a term, piece by piece: policies, the run table, the watchdog's pass.

The watchdog is exercised against real child processes of this test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import suppress

import pytest

from celery_leader import clock
from celery_leader.elections import procinfo
from celery_leader.elections.procinfo import process_ended
from celery_leader.elections.run_table import RUN_SLOTS, Run
from celery_leader.elections.shared_lease import SharedLease
from celery_leader.exceptions import ConfigurationError
from celery_leader.term_end import OnLoss, effective_policy
from celery_leader.term_end.in_worker import ended_by_term
from celery_leader.term_end.watchdog import Watchdog, enforce_deadlines


@pytest.mark.parametrize(
    ("declared", "pool", "expected"),
    [
        (None, "prefork", OnLoss.TERMINATE),
        (None, "threads", OnLoss.CANCEL),
        (None, "solo", OnLoss.CANCEL),
        (None, "gevent", OnLoss.CANCEL),
        ("terminate", "threads", OnLoss.CANCEL),
        ("cancel", "prefork", OnLoss.CANCEL),
        ("finish", "prefork", OnLoss.FINISH),
        (OnLoss.FINISH, "solo", OnLoss.FINISH),
    ],
)
def test_effective_policy_per_pool(declared, pool, expected):
    """terminate is the prefork default and becomes cancel where runs cannot be killed."""
    assert effective_policy(declared, pool) is expected


def test_unknown_policy_names_the_allowed_ones():
    """A bad on_loss value is one clear error listing the policies."""
    with pytest.raises(ConfigurationError, match="terminate, cancel, finish"):
        OnLoss.parse("explode")


def test_revocation_is_sticky():
    """A revoked term cannot be published again; a newer one can."""
    shared = SharedLease()
    assert shared.publish(5, clock.now() + 60)
    shared.revoke(5)
    assert not shared.valid_for(5)
    assert shared.publish(5, clock.now() + 60) is False
    assert not shared.valid_for(5), "a renewal after the revocation does not undo it"
    assert shared.publish(6, clock.now() + 60)
    assert shared.valid_for(6)


def test_validity_ends_by_itself():
    """A term is valid only until the validity last published for it."""
    shared = SharedLease()
    shared.publish(3, clock.now() + 0.05)
    assert shared.valid_for(3)
    time.sleep(0.1)
    assert not shared.valid_for(3)


def test_revoking_an_old_term_late_leaves_a_newer_one_valid():
    """A LOST of term 5 handled after term 6 was published does not end term 6."""
    shared = SharedLease()
    shared.publish(6, clock.now() + 60)
    shared.revoke(5)
    assert shared.valid_for(6)
    assert shared.publish(5, clock.now() + 60) is False
    shared.revoke()
    assert not shared.valid_for(6)


def test_run_table_slots():
    """Slots record pid, token, policy and start time per pool index; leave() empties one."""
    table = SharedLease().runs
    table.enter(0, 11, terminate=True)
    table.enter(RUN_SLOTS - 1, 12, terminate=False)
    me, started = os.getpid(), procinfo.own_start_time()
    assert table.busy() == [
        Run(0, me, 11, True, started),
        Run(RUN_SLOTS - 1, me, 12, False, started),
    ]
    assert [run.token for run in table.running(11)] == [11]
    assert table.running(12, exclude_pid=me) == []
    table.leave(0)
    assert table.slot(0) is None


def sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def record(shared, index, proc, token, terminate=True, started=None):
    """Write slot *index* as the child *proc* would (the tests stand in for pool children)."""
    if started is None:
        deadline = time.monotonic() + 5
        while (started := procinfo.start_time(proc.pid)) is None and time.monotonic() < deadline:
            time.sleep(0.01)
    shared.runs._write(index, proc.pid, token, int(terminate), started)


def test_watchdog_pass_kills_a_child_whose_term_was_revoked_and_spares_a_valid_one():
    """One pass: the revoked term's run is killed and the kill recorded; the valid one lives."""
    shared = SharedLease()
    doomed, spared = sleeper(), sleeper()
    try:
        shared.publish(7, clock.now() + 60)
        record(shared, 0, doomed, 6)  # an older, revoked term
        record(shared, 1, spared, 7)
        shared.revoke(6)
        assert enforce_deadlines(shared, os.getpid()) == [doomed.pid]
        assert doomed.wait(5) == -signal.SIGKILL
        assert spared.poll() is None
        assert shared.runs.was_killed(doomed.pid, 6)
        assert not shared.runs.was_killed(spared.pid, 7)
        assert shared.runs.running(6) == [], "a killed child's slot no longer counts as a run"
    finally:
        for proc in (doomed, spared):
            proc.kill()
            proc.wait()


def test_watchdog_pass_kills_at_the_deadline_without_any_revocation():
    """Nobody revokes (the main process is stuck): the run is killed once validity passed."""
    shared = SharedLease()
    child = sleeper()
    try:
        shared.publish(9, clock.now() + 0.2)
        record(shared, 3, child, 9)
        assert enforce_deadlines(shared, os.getpid()) == []
        time.sleep(0.25)
        assert enforce_deadlines(shared, os.getpid()) == [child.pid]
        assert child.wait(5) == -signal.SIGKILL
    finally:
        child.kill()
        child.wait()


def test_watchdog_leaves_cancel_and_finish_runs_to_their_policy():
    """A run recorded without terminate is seen by the guard but never killed by the watchdog."""
    shared = SharedLease()
    child = sleeper()
    try:
        record(shared, 2, child, 4, terminate=False)
        shared.revoke(4)
        assert enforce_deadlines(shared, os.getpid()) == []
        assert child.poll() is None
        assert [run.pid for run in shared.runs.running(4)] == [child.pid]
    finally:
        child.kill()
        child.wait()


def test_watchdog_never_kills_a_process_that_is_not_the_workers_child():
    """A slot naming a pid the worker does not own is never acted on."""
    shared = SharedLease()
    shared.runs._write(4, 1, 2, 1, procinfo.start_time(1) or 0)  # pid 1, a term not valid
    assert enforce_deadlines(shared, os.getpid()) == []


def test_watchdog_never_kills_a_reused_pid():
    """A stale slot whose pid now names another process (other start time) is left alone."""
    shared = SharedLease()
    child = sleeper()
    try:
        record(shared, 5, child, 3, started=procinfo.start_time(child.pid) or 1)
        shared.runs._write(5, child.pid, 3, 1, 12345)  # the slot of an earlier process
        assert enforce_deadlines(shared, os.getpid()) == []
        assert child.poll() is None
        assert shared.runs.running(3) == []
    finally:
        child.kill()
        child.wait()


def test_watchdog_process_ends_runs_and_exits_with_its_worker():
    """The forked watchdog kills a revoked run within moments; it is gone after stop()."""
    shared = SharedLease()
    watchdog = Watchdog(shared)
    watchdog.start()
    child = sleeper()
    try:
        shared.publish(21, clock.now() + 60)
        record(shared, 0, child, 21)
        time.sleep(0.1)
        assert child.poll() is None, "a valid term's run is left alone"
        revoked_at = time.monotonic()
        shared.revoke(21)
        assert child.wait(5) == -signal.SIGKILL
        assert time.monotonic() - revoked_at < 0.5
        assert watchdog.alive()
    finally:
        watchdog.stop()
        child.kill()
        child.wait()
    assert not watchdog.alive()


def test_a_watchdog_that_died_is_reaped_and_replaced():
    """restart() reaps the dead watchdog (no zombie left) and a new one takes over."""
    shared = SharedLease()
    watchdog = Watchdog(shared)
    watchdog.start()
    first = watchdog.pid
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while watchdog.alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not watchdog.alive()
    watchdog.restart()
    try:
        assert watchdog.alive() and watchdog.pid != first
        assert procinfo.start_time(first) is None, "the dead watchdog was reaped"
    finally:
        watchdog.stop()


class Request:
    def __init__(self, token, revoked=False, pid=None):
        self.leader_token, self.leader_killed, self.worker_pid = token, revoked, pid


def test_a_lost_worker_is_a_hand_back_only_when_its_term_ended():
    """WorkerLostError (also wrapped by billiard) hands back when the term is over, else fails."""
    from billiard.einfo import ExceptionWithTraceback
    from billiard.exceptions import WorkerLostError

    shared = SharedLease()
    shared.publish(4, clock.now() + 60)
    lost = WorkerLostError("Worker exited prematurely: signal 9 (SIGKILL) Job: 1.")
    wrapped = ExceptionWithTraceback(lost, "")
    assert not ended_by_term(Request(4), wrapped, shared), "a crash in a valid term fails"
    shared.revoke(4)
    assert ended_by_term(Request(4), wrapped, shared)
    assert ended_by_term(Request(4), lost, shared)
    assert not ended_by_term(Request(4), ValueError("bug"), shared)
    assert ended_by_term(Request(4, revoked=True), ValueError("killed"), shared)


def test_a_run_the_watchdog_killed_is_a_hand_back_even_if_a_renewal_came_after():
    """Killed at the deadline, then a late renewal published the term again: still a hand-back."""
    from billiard.exceptions import WorkerLostError

    shared = SharedLease()
    child = sleeper()
    try:
        shared.publish(8, clock.now() + 0.05)
        record(shared, 0, child, 8)
        time.sleep(0.1)
        assert enforce_deadlines(shared, os.getpid()) == [child.pid]
        shared.publish(8, clock.now() + 60)  # the renewal that was on its way
        lost = WorkerLostError("Worker exited prematurely: signal 9 (SIGKILL) Job: 1.")
        assert ended_by_term(Request(8, pid=child.pid), lost, shared)
        assert not ended_by_term(Request(8, pid=child.pid + 1), lost, shared)
    finally:
        child.kill()
        child.wait()


def test_process_ended_sees_an_unreaped_exit():
    """A child that exited counts as ended before anyone reaps it."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 5
    while not process_ended(child.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert process_ended(child.pid)
    assert child.wait(5) == 0, "the exit status was left for its owner"


# -- a run table slot torn by a writer killed mid-write (fail closed) --------


def _die_mid_write(shared, index):
    """A forked process that dies between the first and the last write of slot *index*.

    It does what the first half of a slot write does (mark the slot "write in
    progress", name itself the writer where the layout has one) and is then
    SIGKILLed, as the watchdog, the parent, a hard time limit or the OOM
    killer may do to a pool child at any instruction.
    """
    import struct

    offset = index * len(shared.runs._slots) // RUN_SLOTS
    pid = os.fork()
    if pid == 0:
        (seq,) = struct.unpack_from("=q", shared.runs._slots, offset)
        struct.pack_into("=q", shared.runs._slots, offset + 8, os.getpid())
        struct.pack_into("=q", shared.runs._slots, offset, seq + 1 if seq % 2 == 0 else seq + 2)
        os.kill(os.getpid(), signal.SIGKILL)
    os.waitpid(pid, 0)


def test_a_slot_torn_by_a_killed_writer_still_shows_the_next_run_to_both_kill_layers():
    """The next child of a torn slot's pool index is seen by the watchdog and the parent's kill."""
    shared = SharedLease()
    _die_mid_write(shared, 0)
    assert shared.runs.slot(0) is None, "a writer that died left nothing running"
    child = sleeper()
    try:
        shared.publish(6, clock.now() + 60)
        record(shared, 0, child, 6)  # the next pool child of index 0 starts a terminate run
        assert [run.pid for run in shared.runs.running(6)] == [child.pid]
        shared.revoke(6)
        assert enforce_deadlines(shared, os.getpid()) == [child.pid]
        assert child.wait(5) == -signal.SIGKILL
    finally:
        child.kill()
        child.wait()


def test_a_slot_torn_for_good_by_a_live_writer_counts_as_a_run_of_every_term():
    """A writer stopped mid-write: the guard waits for it; it is not in a body, so none kills it.

    The step-down's kill after the grace period ends it (every recorded run of
    the term, whatever its policy).
    """
    import struct

    from celery_leader.term_end.in_worker import kill_recorded_runs

    shared = SharedLease()
    child = sleeper()
    try:
        record(shared, 2, child, 5)
        offset = 2 * len(shared.runs._slots) // RUN_SLOTS
        (seq,) = struct.unpack_from("=q", shared.runs._slots, offset)
        # It names itself (pid, start time, election) and stops mid-write.
        struct.pack_into("=qqq", shared.runs._slots, offset + 8, child.pid, start_of(child), 0)
        struct.pack_into("=q", shared.runs._slots, offset, seq + 1)
        assert [run.pid for run in shared.runs.running(3)] == [child.pid], "counts for any term"
        shared.publish(9, clock.now() + 60)
        shared.revoke(8)
        assert enforce_deadlines(shared, os.getpid()) == [], "nobody is killed for a slow write"
        assert kill_recorded_runs(shared, 9, "still running after the grace") == [child.pid]
        assert child.wait(5) == -signal.SIGKILL
        assert shared.runs.running(9) == []
    finally:
        child.kill()
        child.wait()


def test_a_torn_slot_whose_pid_was_reused_by_a_stranger_holds_nothing_up():
    """A writer that died mid-write, its pid reused by a process not ours: no run, no wait."""
    import struct

    shared = SharedLease()
    offset = 3 * len(shared.runs._slots) // RUN_SLOTS
    # pid 1 runs, but is no child of the worker; its start time is unknown here.
    struct.pack_into("=qqq", shared.runs._slots, offset + 8, 1, 0, 0)
    struct.pack_into("=q", shared.runs._slots, offset, 1)
    shared.runs._occupied[3] = 1
    assert shared.runs.slot(3) is None
    assert shared.runs.running(2**62) == []


def start_of(proc) -> int:
    deadline = time.monotonic() + 5
    while (started := procinfo.start_time(proc.pid)) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert started
    return started


def test_a_run_whose_start_time_is_unknown_still_ends_with_its_term():
    """Start time 0 (the child could not read /proc/self/stat): the pid alone decides."""
    shared = SharedLease()
    child = sleeper()
    try:
        record(shared, 1, child, 4, started=0)
        assert [run.pid for run in shared.runs.running(4)] == [child.pid]
        shared.revoke(4)
        assert enforce_deadlines(shared, os.getpid()) == [child.pid]
        assert child.wait(5) == -signal.SIGKILL
    finally:
        child.kill()
        child.wait()


def test_an_unreadable_start_time_is_not_remembered(monkeypatch):
    """One failed read of /proc/self/stat must not leave the process without a start time."""
    real = procinfo.start_time
    answers = iter([None])
    monkeypatch.setattr(procinfo, "_own_start", None)
    monkeypatch.setattr(procinfo, "start_time", lambda pid: next(answers, real(pid)))
    assert procinfo.own_start_time() == 0
    assert procinfo.own_start_time() == real(os.getpid()) != 0


def test_the_cached_pid_follows_a_fork():
    """own_pid() is read without a system call; a forked child must see its own pid."""
    assert procinfo.own_pid() == os.getpid()
    parent_start = procinfo.own_start_time()
    pid = os.fork()
    if pid == 0:
        ok = procinfo.own_pid() == os.getpid() and procinfo.own_start_time() not in (0,)
        ok = ok and procinfo.own_start_time() == procinfo.start_time(os.getpid())
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert procinfo.own_pid() == os.getpid()
    assert procinfo.own_start_time() == parent_start


def test_a_pool_child_past_the_run_table_refuses_leader_work(monkeypatch):
    """A pool grown past the run table (pool_grow, autoscale): the run is refused, not unwatched."""
    from billiard.process import current_process

    from celery_leader.term_end.in_run import UnwatchableRunError, watch_run

    shared = SharedLease()
    monkeypatch.setattr(shared.group, "owner_pid", -1)  # this process stands in for a pool child
    monkeypatch.setattr(current_process(), "index", RUN_SLOTS + 3, raising=False)
    with pytest.raises(UnwatchableRunError, match="1027"):
        watch_run(shared, 5, terminate=True)


def test_a_watchdog_continued_after_a_stop_passes_again():
    """Stopped past the staleness limit, then continued: nudged, it passes at once."""
    from celery_leader.term_end.watchdog import STALE_AFTER

    shared = SharedLease()
    watchdog = Watchdog(shared, heartbeat=60)  # without the nudge it would sleep on
    watchdog.start()
    pid = watchdog.pid
    assert pid is not None
    try:
        time.sleep(0.2)
        os.kill(pid, signal.SIGSTOP)
        time.sleep(STALE_AFTER + 0.2)
        assert not watchdog.alive()
        os.kill(pid, signal.SIGCONT)
        started = time.monotonic()
        assert watchdog.passes_again(within=5), "a continued watchdog did not pass when nudged"
        assert time.monotonic() - started < 1.0
        assert watchdog.alive() and watchdog.pid == pid
    finally:
        watchdog.stop()


def test_a_watchdog_that_exited_never_passes_again():
    """Gone is gone: passes_again() says so without waiting."""
    shared = SharedLease()
    watchdog = Watchdog(shared)
    watchdog.start()
    try:
        assert watchdog.pid is not None
        os.kill(watchdog.pid, signal.SIGKILL)
        os.waitpid(watchdog.pid, 0)
        started = time.monotonic()
        assert not watchdog.passes_again(within=5)
        assert time.monotonic() - started < 1.0
    finally:
        watchdog.stop()


def test_waiting_for_a_watchdog_never_reaches_into_a_terms_last_moments():
    """A stopped watchdog is waited for only until RESTART_ROOM before a published term ends."""
    from celery_leader.term_end.watchdog import RESTART_ROOM

    shared = SharedLease()
    watchdog = Watchdog(shared, heartbeat=60)
    watchdog.start()
    pid = watchdog.pid
    assert pid is not None
    try:
        time.sleep(0.1)
        os.kill(pid, signal.SIGSTOP)  # it will not pass: the whole allowed wait is taken
        ends_in = 0.5
        shared.publish(5, clock.now() + ends_in)
        started = time.monotonic()
        assert not watchdog.passes_again(within=5)
        took = time.monotonic() - started
        assert took < ends_in - RESTART_ROOM + 0.05, f"it waited {took:.2f} s, into the term's end"
        assert took > 0.1, f"it gave up after {took:.2f} s, with room to wait"
        os.kill(pid, signal.SIGCONT)
        shared.publish(6, clock.now() + 30)  # room enough: the live watchdog passes, nudged
        assert watchdog.passes_again(within=5)
    finally:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        watchdog.stop()


def test_a_stopped_watchdog_counts_as_dead_and_is_replaced():
    """A SIGSTOPped watchdog exists but no longer passes; restart() ends and replaces it."""
    from celery_leader.term_end.watchdog import STALE_AFTER

    shared = SharedLease()
    watchdog = Watchdog(shared)
    watchdog.start()
    stopped = watchdog.pid
    try:
        time.sleep(0.1)
        assert watchdog.alive()
        os.kill(stopped, signal.SIGSTOP)
        deadline = time.monotonic() + STALE_AFTER + 5
        while watchdog.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not watchdog.alive(), "a watchdog that stopped passing still counted as alive"
        assert procinfo.start_time(stopped) is not None, "it still exists: only its passes stopped"
        started = time.monotonic()
        assert not watchdog.passes_again(within=0.3), "a stopped watchdog passed"
        assert time.monotonic() - started >= 0.3
        watchdog.restart()
        assert watchdog.alive() and watchdog.pid != stopped
        assert procinfo.start_time(stopped) is None, "the stopped one was ended and reaped"
    finally:
        watchdog.stop()
        with suppress(ProcessLookupError):
            os.kill(stopped, signal.SIGKILL)
