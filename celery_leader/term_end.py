"""The end of a term: what happens to leader work when the lease ends.

This module is the one place that decides it. It holds the ``on_loss``
policy and its per-pool defaults, the hand-back rule for a run that was
stopped, the parent's kill, and the run's own dead-man's switch.

How a term's work ends, fastest first. Correctness rests on the last
layer alone; the others only make it sooner.

1. **The parent's kill.** The lease thread hears LOST (or a step-down or a
   shutdown revokes the term) and SIGKILLs the pool children that run
   ``terminate`` runs of the term.
2. **The watchdog (the dead-man's switch).** Each prefork worker forks one
   small :class:`Watchdog` process before its pool. A child that starts any
   leader run records it in the shared run table
   (:mod:`celery_leader.run_table`: pid, start time, token, policy). Every
   :data:`WATCH_INTERVAL` seconds the watchdog compares each ``terminate``
   entry with the shared lease. It SIGKILLs the child as soon as the term
   was revoked or its published validity passed, and only a renewal that
   the parent publishes extends that validity. It records each kill, so the
   parent hands the message back even if a late renewal made the term look
   valid again. The watchdog waits on nothing the run or the main process
   does: it acts when the main process is stopped or stuck, when the lease
   thread hangs in a store call, and when the run holds the GIL in a C call.
   It also covers a run the parent has not yet seen start.

The release guard (:meth:`Coordinator.work_stopped
<celery_leader.worker.coordinator.Coordinator.work_stopped>`) reads the same
run table, so a run the parent has not seen start still holds the lease.

Assumptions: the watchdog process is scheduled (a host so starved that it
cannot run for a whole margin breaks the clock assumption of guarantee 1 as
well). A process group frozen as a whole (SIGSTOP of the group, a paused VM)
is a paused leader; only fencing tokens protect against that. Linux is
needed, since the watchdog checks ``/proc/<pid>/stat`` before it kills.

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
import time
from collections.abc import Iterable
from contextlib import suppress
from typing import Any

from celery_leader.exceptions import ConfigurationError
from celery_leader.procinfo import parent_of
from celery_leader.run_table import RUN_SLOTS
from celery_leader.shared_lease import SharedLease, SharedLeases

logger = logging.getLogger(__name__)

#: Pools whose runs can be killed one by one (each run is a process).
KILLABLE_POOLS = frozenset({"prefork", "processes"})
#: How often the watchdog reads the shared lease and the run table, in seconds.
WATCH_INTERVAL = 0.01


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

    That is the case when the parent killed it (``leader_killed``), and when
    its process was lost after its term ended, whether the watchdog killed it
    or the parent was stalled. Either way the run is handed back, not failed.
    """
    if getattr(request, "leader_killed", False):
        return True
    exc = getattr(exc, "exc", exc)  # billiard wraps it in ExceptionWithTraceback
    if type(exc).__name__ != "WorkerLostError":
        return False
    token = getattr(request, "leader_token", None)
    if shared is None or not shared.valid_for(token):
        return True
    # Killed at its deadline, then a renewal that was already on its way
    # published the term again: the watchdog's record still says why it died.
    pid = getattr(request, "worker_pid", None)
    return (
        isinstance(pid, int)
        and isinstance(token, int)
        and shared.runs.was_killed(pid, token, shared.election)
    )


# -- the parent's kill -------------------------------------------------------


def kill_runs(requests: Iterable[Any], reason: str) -> list[int]:
    """SIGKILL the pool children running *requests*; returns the pids signalled.

    Each request is marked first, so the thread that sees the child die
    hands the message back instead of recording a failure.
    """
    killed = []
    for request in requests:
        request.leader_killed = True
        pid = request.worker_pid
        if pid and pid != os.getpid():
            logger.warning(
                "celery-leader: %s; killing %s (pid %s)", reason, request.humaninfo(), pid
            )
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    return killed


def kill_recorded_runs(
    shared: SharedLease, token: int, reason: str, *, terminate_only: bool = False
) -> list[int]:
    """SIGKILL the pool children the run table shows running term *token* (or older).

    These include runs the parent has not seen start yet, and a slot that
    cannot be read (its writer's process, fail closed). With
    *terminate_only*, runs under another policy are spared. Only children
    of the calling process (the worker's main process) are signalled.
    """
    killed = []
    for run in shared.runs.running(token, exclude_pid=os.getpid(), election=shared.election):
        if terminate_only and not run.terminate:
            continue
        if run.pid > 0 and parent_of(run.pid) == os.getpid():
            logger.warning("celery-leader: %s; killing pool child pid %s", reason, run.pid)
            with suppress(ProcessLookupError):
                os.kill(run.pid, signal.SIGKILL)
                killed.append(run.pid)
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


# -- the deadline, enforced from outside the run (prefork) -------------------


class UnwatchableRunError(RuntimeError):
    """A pool child has no slot in the run table: it must not run leader work."""


def pool_child_index() -> int | None:
    """The billiard pool index of the calling process, or None outside a prefork child."""
    try:
        from billiard.process import current_process  # noqa: PLC0415 - prefork only

        index = getattr(current_process(), "index", None)
    except Exception:  # noqa: BLE001 - no billiard, no index: the run is not watched
        return None
    return index if isinstance(index, int) and index >= 0 else None


def watch_run(shared: SharedLease, token: int, *, terminate: bool) -> int | None:
    """In a prefork child: record this leader run in the run table; its slot index, or None.

    Every policy is recorded, so that the release guard sees the run even
    before the parent does; only *terminate* runs are killed by the
    watchdog. Returns None (nothing recorded) outside a prefork child.
    Raises :class:`UnwatchableRunError` in a child whose pool index is past the
    table (a pool grown at run time by ``pool_grow`` or autoscale): a run
    neither kill layer could see must not start.
    """
    index = pool_child_index()
    if index is None or os.getpid() == shared.owner_pid:
        return None
    if index >= RUN_SLOTS:
        raise UnwatchableRunError(
            f"pool process index {index} is past the run table's {RUN_SLOTS} slots "
            "(the pool was grown at run time); this process runs no leader work"
        )
    shared.runs.enter(index, token, terminate=terminate, election=shared.election)
    return index


def unwatch_run(shared: SharedLease, index: int | None) -> None:
    """The run recorded by :func:`watch_run` ended."""
    if index is not None:
        shared.runs.leave(index)


def enforce_deadlines(
    shared: SharedLease | SharedLeases, worker_pid: int, done: set[tuple[int, int]] | None = None
) -> list[int]:
    """One pass of the watchdog: SIGKILL each ``terminate`` run whose term is not valid now.

    Each run is judged against its own election's slot (*shared* is the
    group, or any slot of it). A run's term stops being valid when it is
    revoked or when its published validity has passed; a run of an election
    the group does not know, or whose slot could not be read, is never
    valid. A run is killed only while its process is the one that wrote the
    slot (same pid and start time, or the pid alone when the start time is
    unknown) and a child of *worker_pid*, so a stale slot whose pid was
    reused by another process is never acted on. Each kill is recorded for
    the parent (:meth:`RunTable.record_kill`). *done* remembers ``(pid,
    start time)`` already killed, across passes. Returns the pids killed.
    """
    group = shared if isinstance(shared, SharedLeases) else shared.group
    killed = []
    done = set() if done is None else done
    for run in group.runs.busy():
        if not run.terminate or run.pid <= 0 or (run.pid, run.started) in done:
            continue
        lease = group.at(run.election)
        if lease is not None and lease.valid_for(run.token):
            continue
        if run.running() and parent_of(run.pid) == worker_pid:
            group.runs.record_kill(run)  # before the kill: the parent may see the death first
            with suppress(ProcessLookupError):
                os.kill(run.pid, signal.SIGKILL)
                killed.append(run.pid)
        done.add((run.pid, run.started))
    if len(done) > 4 * RUN_SLOTS:
        done.clear()  # kept small; a stale entry only costs one more /proc read
    return killed


class Watchdog:
    """A small process per prefork worker that ends runs at their term's deadline.

    It is forked from the worker's main process before the pool. Every
    :data:`WATCH_INTERVAL` seconds it reads the shared lease and the run
    table, and SIGKILLs the pool children whose run's term was revoked or
    ran out (:func:`enforce_deadlines`). Being its own process, it acts when
    the main process is stopped or stuck, when the lease thread waits on a
    store call, and when the run holds the GIL in C code. It exits when the
    worker's main process is gone.
    """

    def __init__(
        self, shared: SharedLease | SharedLeases, interval: float = WATCH_INTERVAL
    ) -> None:
        self._shared = shared if isinstance(shared, SharedLeases) else shared.group
        self._interval = interval
        self.pid: int | None = None

    def start(self) -> None:
        """Fork the watchdog (call before the pool forks, with as few threads as possible)."""
        worker_pid = os.getpid()
        pid = os.fork()
        if pid == 0:  # the watchdog
            code = 0
            try:
                for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1"):
                    signal.signal(getattr(signal, name), signal.SIG_IGN)
                done: set[tuple[int, int]] = set()
                while os.getppid() == worker_pid:
                    # One bad pass must not end the watch.
                    with suppress(Exception):
                        enforce_deadlines(self._shared, worker_pid, done)
                    time.sleep(self._interval)
            except BaseException:  # noqa: BLE001 - never run the worker's cleanup here
                code = 1
            finally:
                os._exit(code)
        self.pid = pid
        logger.info("celery-leader: run watchdog started (pid %d)", pid)

    def alive(self) -> bool:
        """True while the watchdog runs."""
        return self.pid is not None and not process_ended(self.pid)

    def restart(self) -> None:
        """Reap a watchdog that died and fork a new one.

        Forking from a process with threads is safe here because the
        watchdog's loop takes no lock another thread could hold: it reads
        shared memory and ``/proc``, sends signals and sleeps.
        """
        pid, self.pid = self.pid, None
        if pid is not None:
            with suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        self.start()

    def stop(self) -> None:
        """End the watchdog and reap it."""
        pid, self.pid = self.pid, None
        if pid is None:
            return
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with suppress(ChildProcessError):
            os.waitpid(pid, 0)
