"""The end of a term, piece by piece: policies, the run table, the watchdog's pass.

The watchdog is exercised against real child processes of this test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from celery_leader.exceptions import ConfigurationError
from celery_leader.shared_lease import RUN_SLOTS, SharedLease
from celery_leader.term_end import (
    OnLoss,
    Watchdog,
    effective_policy,
    ended_by_term,
    enforce_deadlines,
    process_ended,
)


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
    assert shared.publish(5, time.monotonic() + 60)
    shared.revoke(5)
    assert not shared.valid_for(5)
    assert shared.publish(5, time.monotonic() + 60) is False
    assert not shared.valid_for(5), "a renewal after the revocation does not undo it"
    assert shared.publish(6, time.monotonic() + 60)
    assert shared.valid_for(6)


def test_validity_ends_by_itself():
    """A term is valid only until the validity last published for it."""
    shared = SharedLease()
    shared.publish(3, time.monotonic() + 0.05)
    assert shared.valid_for(3)
    time.sleep(0.1)
    assert not shared.valid_for(3)


def test_run_table_slots():
    """Slots record pid and token per pool index; clear() only forgets the pid it names."""
    table = SharedLease().runs
    table.enter(0, 11)
    table.enter(RUN_SLOTS - 1, 12)
    assert table.busy() == [(0, os.getpid(), 11), (RUN_SLOTS - 1, os.getpid(), 12)]
    table.clear(0, os.getpid() + 1)
    assert table.slot(0) == (os.getpid(), 11)
    table.leave(0)
    assert table.slot(0) == (0, 0)


def sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_watchdog_pass_kills_a_child_whose_term_was_revoked_and_spares_a_valid_one():
    """One pass: the run of the revoked term is killed, the run of the valid term is not."""
    shared = SharedLease()
    doomed, spared = sleeper(), sleeper()
    try:
        shared.publish(7, time.monotonic() + 60)
        shared.runs._write(0, doomed.pid, 6)  # an older, revoked term
        shared.runs._write(1, spared.pid, 7)
        shared.revoke(6)
        shared.publish(7, time.monotonic() + 60)
        assert enforce_deadlines(shared, os.getpid()) == [doomed.pid]
        assert doomed.wait(5) == -signal.SIGKILL
        assert spared.poll() is None
        assert shared.runs.slot(0) == (0, 0)
    finally:
        for proc in (doomed, spared):
            proc.kill()
            proc.wait()


def test_watchdog_pass_kills_at_the_deadline_without_any_revocation():
    """Nobody revokes (the main process is stuck): the run is killed once validity passed."""
    shared = SharedLease()
    child = sleeper()
    try:
        shared.publish(9, time.monotonic() + 0.2)
        shared.runs._write(3, child.pid, 9)
        assert enforce_deadlines(shared, os.getpid()) == []
        time.sleep(0.25)
        assert enforce_deadlines(shared, os.getpid()) == [child.pid]
        assert child.wait(5) == -signal.SIGKILL
    finally:
        child.kill()
        child.wait()


def test_watchdog_never_kills_a_process_that_is_not_the_workers_child():
    """A slot naming a pid the worker does not own (reused) is cleared, never acted on."""
    shared = SharedLease()
    shared.runs._write(4, 1, 2)  # pid 1, a term that is not valid
    assert enforce_deadlines(shared, os.getpid()) == []
    assert shared.runs.slot(4) == (0, 0)


def test_watchdog_process_ends_runs_and_exits_with_its_worker():
    """The forked watchdog kills a revoked run within moments; it is gone after stop()."""
    shared = SharedLease()
    watchdog = Watchdog(shared)
    watchdog.start()
    child = sleeper()
    try:
        shared.publish(21, time.monotonic() + 60)
        shared.runs._write(0, child.pid, 21)
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


class Request:
    def __init__(self, token, revoked=False):
        self.leader_token, self.leader_killed = token, revoked


def test_a_lost_worker_is_a_hand_back_only_when_its_term_ended():
    """WorkerLostError (also wrapped by billiard) hands back when the term is over, else fails."""
    from billiard.einfo import ExceptionWithTraceback
    from billiard.exceptions import WorkerLostError

    shared = SharedLease()
    shared.publish(4, time.monotonic() + 60)
    lost = WorkerLostError("Worker exited prematurely: signal 9 (SIGKILL) Job: 1.")
    wrapped = ExceptionWithTraceback(lost, "")
    assert not ended_by_term(Request(4), wrapped, shared), "a crash in a valid term fails"
    shared.revoke(4)
    assert ended_by_term(Request(4), wrapped, shared)
    assert ended_by_term(Request(4), lost, shared)
    assert not ended_by_term(Request(4), ValueError("bug"), shared)
    assert ended_by_term(Request(4, revoked=True), ValueError("killed"), shared)


def test_process_ended_sees_an_unreaped_exit():
    """A child that exited counts as ended before anyone reaps it."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 5
    while not process_ended(child.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert process_ended(child.pid)
    assert child.wait(5) == 0, "the exit status was left for its owner"
