"""The end of a term: what happens to leader work when the lease ends.

This module is the one place that decides it. It holds the ``on_loss``
policy and its per-pool defaults, the hand-back rule for a run that was
stopped, the parent's kill, and the run's own dead-man's switch.

How a term's work ends, fastest first. Correctness rests on the last
layer alone; the others only make it sooner.

1. **The parent's kill.** The lease thread hears LOST (or a step-down or a
   shutdown revokes the term) and SIGKILLs the pool children that run
   ``terminate`` runs of the term.
2. **The run's watcher.** A thread in the child reads the shared lease
   every :data:`WATCH_INTERVAL` seconds. When the term was revoked, it
   kills its own process. This also covers a run the parent has not yet
   seen start.
3. **The kernel's timer (the dead-man's switch).** While a ``terminate`` run
   is in a prefork child, ``ITIMER_REAL`` is armed for the term's published
   validity. ``SIGALRM`` keeps its default action, so the kernel ends the
   child at the deadline without the interpreter's help. That holds even
   when the child's main thread holds the GIL in a C call, when the watcher
   is starved, and when the parent is stopped or stuck. Only a renewal that
   the parent publishes moves the deadline, and the watcher is what re-arms
   it. When re-arming is starved, the timer fires at the old deadline:
   early, never late.

Assumptions: the child is a forked prefork child, one run at a time per
child (billiard's model). The task does not use ``SIGALRM``,
``signal.alarm`` or ``ITIMER_REAL`` itself, since the switch owns them
while a ``terminate`` run is in progress.

Policies (:class:`OnLoss`):

* ``terminate``: the run is killed at the end of the term. It is the
  default where the pool can kill, which means prefork.
* ``cancel``: :func:`celery_leader.lease_lost` turns true at the end of the
  term, and the task is expected to stop. It is the default, and the only
  choice, in threads, solo, gevent and eventlet. A task that never polls
  runs on; on a step-down or a warm shutdown, prefork then kills it after
  the grace period.
* ``finish``: the run completes. This is unsafe without fencing. On a
  step-down or a warm shutdown, prefork kills it after the grace period.

The hand-back rule for a run that was stopped: with ``acks_late`` the
message goes back to the broker and runs again on the next leader;
otherwise the task is recorded ``REVOKED``.
"""

from __future__ import annotations

import enum
import logging
import os
import signal
import threading
import time
from collections.abc import Iterable
from contextlib import suppress
from typing import Any

from celery_leader.exceptions import ConfigurationError
from celery_leader.shared_lease import SharedLease

logger = logging.getLogger(__name__)

#: Pools whose runs can be killed one by one (each run is a process).
KILLABLE_POOLS = frozenset({"prefork", "processes"})
#: How often a run's watcher reads the shared lease, in seconds.
WATCH_INTERVAL = 0.02


class OnLoss(str, enum.Enum):
    """What happens to a running leader task when its term ends."""

    TERMINATE = "terminate"
    CANCEL = "cancel"
    FINISH = "finish"

    @classmethod
    def parse(cls, value: str | OnLoss | None) -> OnLoss | None:
        """The policy named *value* (None stays None); a clear error for anything else."""
        if value is None or isinstance(value, OnLoss):
            return value
        try:
            return cls(value)
        except ValueError:
            allowed = ", ".join(policy.value for policy in cls)
            raise ConfigurationError(
                f"on_loss={value!r} is not allowed: use one of {allowed}"
            ) from None


def effective_policy(declared: str | OnLoss | None, pool_kind: str) -> OnLoss:
    """The policy that applies to a task declaring *declared* in a *pool_kind* pool.

    ``terminate`` needs a pool that can kill one run. Elsewhere it becomes
    ``cancel``, because the run must cooperate.
    """
    policy = OnLoss.parse(declared)
    killable = pool_kind in KILLABLE_POOLS
    if policy is None:
        return OnLoss.TERMINATE if killable else OnLoss.CANCEL
    if policy is OnLoss.TERMINATE and not killable:
        return OnLoss.CANCEL
    return policy


# -- the hand-back rule ------------------------------------------------------


def requeues_stopped_run(acks_late: bool) -> bool:
    """True when a stopped run's message goes back to the broker, False when it is REVOKED."""
    return bool(acks_late)


def stop_run_in_task(task: Any, why: str) -> None:
    """Inside the run: end it now, per the hand-back rule (always raises)."""
    from celery.exceptions import Ignore, Reject  # noqa: PLC0415 - keep this module light

    request = task.request
    logger.warning("celery-leader: %s[%s] handed back: %s", task.name, request.id, why)
    if requeues_stopped_run(task.acks_late):
        raise Reject(why, requeue=True)
    task.backend.mark_as_revoked(request.id, why, request=request)
    raise Ignore()


def settle_stopped_run(request: Any) -> None:
    """In the parent: settle the message of a run that was stopped, per the hand-back rule."""
    if requeues_stopped_run(request.task.acks_late):
        logger.info(
            "celery-leader: %s stopped at the end of its term; handed back", request.humaninfo()
        )
        request.reject(requeue=True)
    else:
        request.task.backend.mark_as_revoked(
            request.id, "leader lease lost", request=request._context, store_result=True
        )
        request.acknowledge()
    request.send_event("task-revoked", terminated=True, signum="SIGKILL", expired=False)


def ended_by_term(request: Any, exc: BaseException, shared: SharedLease | None) -> bool:
    """True when a failed run of *request* failed because its term ended.

    That is the case when the parent killed it (``leader_revoked``), and when
    its process was lost after the term ended, whether by the switch or with
    the parent stalled. In both cases the run is handed back, not failed.
    """
    if getattr(request, "leader_revoked", False):
        return True
    if type(exc).__name__ != "WorkerLostError":
        return False
    token = getattr(request, "leader_token", None)
    expired = shared is None or not shared.valid_for(token)
    return expired or "(SIGALRM)" in str(exc)


# -- the parent's kill -------------------------------------------------------


def kill_runs(requests: Iterable[Any], reason: str) -> list[int]:
    """SIGKILL the pool children running *requests*; returns the pids signalled.

    Each request is marked first, so the thread that sees the child die
    hands the message back instead of recording a failure.
    """
    killed = []
    for request in requests:
        request.leader_revoked = True
        pid = request.worker_pid
        if pid and pid != os.getpid():
            logger.warning(
                "celery-leader: %s; killing %s (pid %s)", reason, request.humaninfo(), pid
            )
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    return killed


def process_ended(pid: int) -> bool:
    """True when our child *pid* has exited, reaped or not (billiard still reaps it)."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True  # already reaped
    except OSError:
        return False
    return info is not None


# -- the run's own switch (in a prefork child) -------------------------------


class RunSwitch:
    """The dead-man's switch of ``terminate`` runs in one prefork child (see the module doc)."""

    def __init__(self, shared: SharedLease, interval: float = WATCH_INTERVAL) -> None:
        self._shared = shared
        self._interval = interval
        self._lock = threading.Lock()
        self._token: int | None = None
        self._deadline = 0.0
        self._kernel_timer = False
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def arm(self, token: int) -> bool:
        """Arm for a run under *token*; False (nothing armed) when the term is not valid now."""
        current, valid_until = self._shared.read()
        if current != token or time.monotonic() >= valid_until:
            return False
        if os.getpid() == self._shared.owner_pid:
            return True  # never a switch in the worker's main process
        with self._lock:
            self._token = token
            self._deadline = 0.0
            self._kernel_timer = _take_sigalrm()
            self._set_deadline(valid_until)
        self._ensure_watcher()
        return True

    def disarm(self) -> None:
        """The run ended: stop the timer and the watching."""
        with self._lock:
            self._token = None
            if self._kernel_timer:
                signal.setitimer(signal.ITIMER_REAL, 0)

    def _set_deadline(self, valid_until: float) -> None:
        """Move the kernel deadline to *valid_until* (lock held)."""
        self._deadline = valid_until
        if self._kernel_timer:
            signal.setitimer(signal.ITIMER_REAL, max(valid_until - time.monotonic(), 1e-6))

    def _ensure_watcher(self) -> None:
        if self._thread is None or not self._thread.is_alive() or self._pid != os.getpid():
            self._pid = os.getpid()
            self._thread = threading.Thread(
                target=self._watch, name="celery-leader-run-switch", daemon=True
            )
            self._thread.start()

    def _watch(self) -> None:
        while True:
            time.sleep(self._interval)
            with self._lock:
                token = self._token
                if token is None:
                    continue
                current, valid_until = self._shared.read()
                if current != token or time.monotonic() >= valid_until:
                    # Revoked, or past the deadline: end the run now, whatever it does.
                    os.kill(os.getpid(), signal.SIGKILL)
                elif valid_until > self._deadline:
                    self._set_deadline(valid_until)


def _take_sigalrm() -> bool:
    """Give SIGALRM its default action (end the process); False where that is impossible."""
    try:
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
    except ValueError:  # not the main thread: leave it to the watcher
        return signal.getsignal(signal.SIGALRM) == signal.SIG_DFL
    return True


_switch: RunSwitch | None = None


def run_switch(shared: SharedLease) -> RunSwitch:
    """The switch of this process over *shared* (one per process, made on first use)."""
    global _switch  # noqa: PLW0603 - one switch per (forked) process
    if _switch is None or _switch._shared is not shared:
        _switch = RunSwitch(shared)
    return _switch
