"""The end of one election's term in the worker's main process, in one place.

:class:`TermEnd` runs the sequence; the worker hands it what it needs of
Celery as callables (post to the consumer's loop, wake it, stop consuming,
list the messages waiting), so a change to what happens on lease loss is a
change here:

1. **revoke** the term in shared memory, for good (runs and buffered jobs
   see it at once);
2. **kill** the ``terminate`` runs of the term the run table shows: the
   requests the parent saw start, and the runs it has not seen start yet;
3. **hand back** the leader messages of the election that never reached the
   pool (on the loop thread);
4. on a step-down or a warm shutdown, give the other runs
   ``leader_stop_grace`` seconds, then kill what a prefork pool can kill;
5. **guard the release**: the lease is released only once no run of the
   term is left (:meth:`TermEnd.work_stopped`).

Threads: :meth:`TermEnd.end` runs on the lease thread (or the loop thread
with ``on_loop``); the hand-back runs on the consumer's loop thread, one
callable per ordered sequence, since Celery does not order a batch.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Collection, Iterable
from contextlib import suppress
from typing import Any, NamedTuple, Protocol

from celery.worker import state as worker_state

from celery_leader.elections.procinfo import Liveness, liveness, process_ended
from celery_leader.elections.run_table import Run
from celery_leader.elections.shared_lease import SharedLease
from celery_leader.lease import Term
from celery_leader.term_end import KILLABLE_POOLS, OnLoss, requeues_stopped_run

logger = logging.getLogger(__name__)

#: How long the release waits for killed runs to be gone, in seconds.
KILL_SETTLE = 1.0
#: How often the parent's kill asks ``/proc`` again about a run it could not judge (s).
RETRY_EVERY = 0.01


# -- the hand-back rule, for requests in the parent ---------------------------


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


class RecordedRuns(Protocol):
    """The run table as the parent's kill and the release guard read it.

    :class:`~celery_leader.elections.run_table.RunTable` in a worker; the
    simulation's model of it there.
    """

    def running(self, token: int, exclude_pid: int = 0, election: int | None = None) -> list[Run]:
        """Runs of *election*'s term *token* or older whose process still runs (or may)."""


class Processes(Protocol):
    """How the parent's kill reaches the pool's children: the host's, or a model's."""

    def liveness(self, pid: int, started: int) -> Liveness:
        """Whether the child *pid* (started at *started*; 0: unknown) still runs."""

    def kill(self, pid: int, reason: str) -> bool:
        """SIGKILL the child *pid* because of *reason*; False when it was gone already."""


class HostProcesses:
    """The pool children of *parent* (this process), through ``/proc`` and signals."""

    def __init__(self, parent: int) -> None:
        self.parent = parent

    def liveness(self, pid: int, started: int) -> Liveness:
        """See :class:`Processes`; a pid that is no child of *parent* counts as gone."""
        return liveness(pid, started, parent=self.parent)

    def kill(self, pid: int, reason: str) -> bool:
        """See :class:`Processes`."""
        logger.warning("celery-leader: %s; killing pool child pid %s", reason, pid)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        return True


def recorded_runs_of(
    table: RecordedRuns, token: int, *, owner_pid: int, election: int
) -> list[Run]:
    """The runs the table shows of *election*'s term *token* or older, the owner's own left out.

    What the release guard waits for and the parent's kill chooses from:
    torn slots of a live writer and runs ``/proc`` cannot tell about count
    as running (fail closed).
    """
    return table.running(token, exclude_pid=owner_pid, election=election)


def kill_table_runs(
    table: RecordedRuns,
    election: int,
    token: int,
    reason: str,
    *,
    owner_pid: int,
    processes: Processes,
    terminate_only: bool = False,
    spare: Collection[int] = (),
    retry_for: float = KILL_SETTLE,
) -> list[int]:
    """SIGKILL the children *table* shows running *election*'s term *token* (or older).

    The parent's kill, written once for the worker (:func:`kill_recorded_runs`)
    and the simulation (which passes its model of the table and of the
    processes). It includes runs the parent has not seen start yet, and a
    slot that cannot be read (its writer's process, fail closed). With
    *terminate_only*, runs under another policy are spared; so are the pids
    in *spare* (signalled already).

    A run whose process *processes* cannot tell about (``UNKNOWN``) is
    looked at again every :data:`RETRY_EVERY` seconds until it can, for at
    most *retry_for* seconds (the release guard's own wait for killed
    runs); past that, the watchdog's passes and the release guard still see
    it as running. Returns the pids signalled.
    """
    killed: list[int] = []
    deadline = time.monotonic() + retry_for
    while True:
        unsure = []
        for run in recorded_runs_of(table, token, owner_pid=owner_pid, election=election):
            if (terminate_only and not run.terminate) or run.pid in spare or run.pid in killed:
                continue
            state = processes.liveness(run.pid, run.started)
            if state is Liveness.UNKNOWN:
                unsure.append(run.pid)
            elif state is Liveness.RUNNING and processes.kill(run.pid, reason):
                killed.append(run.pid)
        if not unsure:
            return killed
        if time.monotonic() >= deadline:
            logger.warning(
                "celery-leader: %s; /proc does not answer for pool child pid(s) %s: "
                "the watchdog and the release guard go on counting them as running",
                reason,
                ", ".join(map(str, unsure)),
            )
            return killed
        time.sleep(RETRY_EVERY)


def kill_recorded_runs(
    shared: SharedLease,
    token: int,
    reason: str,
    *,
    terminate_only: bool = False,
    spare: Collection[int] = (),
    retry_for: float = KILL_SETTLE,
) -> list[int]:
    """:func:`kill_table_runs` on *shared*'s run table, for the children of this process.

    Only children of the calling process (the worker's main process) are
    signalled, each the process that wrote its slot (same start time, when
    known).
    """
    me = os.getpid()
    return kill_table_runs(
        shared.runs,
        shared.election,
        token,
        reason,
        owner_pid=me,
        processes=HostProcesses(me),
        terminate_only=terminate_only,
        spare=spare,
        retry_for=retry_for,
    )


# -- which requests belong to a term -----------------------------------------


class SnapshotError(RuntimeError):
    """Celery's request set could not be copied: callers must assume the worst."""


def snapshot(requests: Any) -> list[Any]:
    """A copy of one of Celery's request WeakSets, taken while the loop thread may change it.

    The copy of the WeakSet's underlying set of references is one C-level
    operation under the GIL, so it cannot see the set change midway. When
    it still fails, this raises :class:`SnapshotError`. It never returns
    "nothing runs" for a copy it could not take.
    """
    refs = getattr(requests, "data", requests)
    for _ in range(100):
        try:
            copied = list(refs)
        except RuntimeError:  # changed during the copy: only possible without a GIL
            continue
        items = (ref() if callable(ref) and refs is not requests else ref for ref in copied)
        return [item for item in items if item is not None]
    raise SnapshotError("could not copy the worker's request set")


def is_leader_request(request: Any) -> bool:
    """True for requests of leader-only tasks."""
    return bool(getattr(request.task, "leader_only", False))


def never_dispatched(requests: list[Any]) -> list[Any]:
    """The leader requests among *requests* that the gate never sent to the pool, once each.

    Only these may be handed back when a term ends. A request the gate sent
    to the pool belongs to the pool: the child checks the term before it runs
    and the watchdog ends the run, so handing it back too could let the next
    leader run it while this child still does (a child may have started it
    before the parent read its acknowledgement).
    """
    seen: set[int] = set()
    chosen = []
    for request in requests:
        if id(request) in seen or not is_leader_request(request):
            continue
        seen.add(id(request))
        # The gate marks a request as it hands it to the pool, on the loop
        # thread; hand-backs run on the loop thread too, so they never race.
        # (Celery's _apply_result is no sign: eventlet's pool returns None.)
        in_pool = getattr(request, "leader_dispatched", False)
        if not in_pool and not request.acknowledged:
            chosen.append(request)
    return chosen


def election_of(request: Any, lease_of: Callable[[str | None], str] | None = None) -> str | None:
    """The lease name of a leader request's election: the one admitted under, else its task's.

    *lease_of* turns a task's election (``leader_election``: a short name, or
    None for the default one) into its lease name. Without it, a request
    not yet admitted gives None: it belongs to the process's one election.
    """
    admitted = getattr(request, "leader_election", None)
    if admitted is not None:
        return str(admitted)
    if lease_of is None:
        return None
    return lease_of(getattr(request.task, "leader_election", None))


def of_term(
    request: Any,
    election: str,
    token: int,
    lease_of: Callable[[str | None], str] | None = None,
) -> bool:
    """True for a request of *election*'s term *token* or older (or not admitted yet)."""
    if election_of(request, lease_of) not in (None, election):
        return False  # another election's tokens mean nothing to this one
    run_token = getattr(request, "leader_token", None)
    return run_token is None or run_token <= token


class Waiting(NamedTuple):
    """A leader message the worker holds that never reached the pool.

    *cancel* takes it out of the worker first (an ETA message's timer
    entry), or is None.
    """

    request: Any
    cancel: Callable[[], None] | None


class TermEnd:
    """Ends one election's terms in a worker's main process; see the module docstring."""

    def __init__(
        self,
        shared: SharedLease,
        pool_kind: str,
        *,
        policy_for: Callable[[Any], OnLoss],
        post: Callable[[Callable[[], None]], None],
        wake_loop: Callable[[], None],
        stop_consuming: Callable[[], None],
        waiting: Callable[[], list[Waiting]],
        lease_of: Callable[[str | None], str] | None = None,
    ) -> None:
        self.shared = shared
        #: A task's election (short name) -> its lease name; None: one election per process.
        self._lease_of = lease_of
        self.election = shared.name
        self.pool_kind = pool_kind
        self._policy_for = policy_for
        self._post = post
        self._wake_loop = wake_loop
        self._stop_consuming = stop_consuming
        self._waiting = waiting

    def end(self, token: int, *, on_loop: bool = False) -> None:
        """End term *token* here for good: revoke, kill ``terminate`` runs, hand back the rest.

        Pass *on_loop* when already on the consumer's loop thread (the waiting
        messages are then handed back at once instead of being posted).
        """
        self.shared.revoke(token)
        try:
            runs = self.leader_runs(token)
        except SnapshotError:
            logger.exception("celery-leader: cannot list runs; the watchdog stops them")
        else:
            # The terminate runs whose child the run table shows in a run of this
            # term (a slot it cannot read included, and a child /proc cannot tell
            # about: unknown counts as running): a child that finished its run
            # and took other work (the parent lagging, or -O fast) is left alone.
            # The table holds every run's body: a run registers before its body
            # and checks its term again after.
            in_term = {
                run.pid
                for run in recorded_runs_of(
                    self.shared.runs,
                    token,
                    owner_pid=self.shared.owner_pid,
                    election=self.shared.election,
                )
            }
            doomed = [
                r
                for r in runs
                if self._policy_for(r.task) is OnLoss.TERMINATE and r.worker_pid in in_term
            ]
            signalled = kill_runs(doomed, "lease lost")
            # And runs the parent has not seen start, from the run table.
            kill_recorded_runs(
                self.shared, token, "lease lost", terminate_only=True, spare=signalled
            )
        if on_loop:
            self.hand_back_waiting(token)
        else:
            self._post(lambda: self.hand_back_waiting(token))
            self._wake_loop()

    def leader_runs(self, token: int) -> list[Any]:
        """Leader runs of term *token* (or older) that the parent saw start and not yet end."""
        return [
            request
            for request in snapshot(worker_state.active_requests)
            if is_leader_request(request) and of_term(request, self.election, token, self._lease_of)
        ]

    def runs_ended(self, token: int, timeout: float) -> bool:
        """Block until no run of term *token* runs here (at most *timeout* s); True when none does.

        A run the parent killed counts as ended as soon as its process
        exited, before the loop thread has processed its death.
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                running = [r for r in self.leader_runs(token) if not self.process_gone(r)]
            except SnapshotError:
                running = [None]  # unknown: assume work still runs
            # Runs the pool's children recorded, the parent may not know of yet.
            running += recorded_runs_of(
                self.shared.runs,
                token,
                owner_pid=self.shared.owner_pid,
                election=self.shared.election,
            )
            if not running:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)

    def process_gone(self, request: Any) -> bool:
        """True when *request* ran in a pool child that has exited (killed by anyone).

        Only a prefork child is a process of its own; elsewhere the run
        lives in this process and ends with its request.
        """
        pid = request.worker_pid
        if self.pool_kind not in KILLABLE_POOLS or not pid or pid == self.shared.owner_pid:
            return False
        return process_ended(pid)

    def stop_runs(self, token: int, grace: float) -> bool:
        """Give runs of *token* *grace* seconds to stop; where the pool can kill, kill the rest.

        Returns True when none runs any more.
        """
        if self.runs_ended(token, grace):
            return True
        if self.pool_kind not in KILLABLE_POOLS:
            return False
        reason = f"still running {grace:g} s after the term ended"
        signalled: list[int] = []
        try:
            signalled = kill_runs(self.leader_runs(token), reason)
        except SnapshotError:
            logger.exception("celery-leader: cannot list runs to stop them")
        kill_recorded_runs(self.shared, token, reason, spare=signalled)
        return self.runs_ended(token, KILL_SETTLE)

    def await_stopped(
        self, token: int, grace: float, *, holding: Callable[[], bool], poll: float
    ) -> None:
        """Stop the runs of *token*; where they cannot be killed, wait for them while *holding*."""
        if self.stop_runs(token, grace):
            return
        logger.warning(
            "celery-leader: leader tasks of term %d still run and this pool cannot stop "
            "them; the lease is kept (no new leader work) until they end",
            token,
        )
        while holding():
            if self.runs_ended(token, poll):
                return

    def work_stopped(self, term: Term) -> bool:
        """The release guard: True once no work of *term* runs here (waits briefly for kills)."""
        return self.runs_ended(term.token, KILL_SETTLE)

    def hand_back_waiting(self, token: int) -> None:
        """Stop consuming; hand back the election's messages that never reached the pool.

        Loop thread only.
        """
        self._stop_consuming()
        waiting = self._waiting()
        cancels = {id(item.request): item.cancel for item in waiting}
        for request in never_dispatched([item.request for item in waiting]):
            if not of_term(request, self.election, token, self._lease_of):
                continue  # another election's message: its own term decides
            cancel = cancels.get(id(request))
            if cancel is not None:
                cancel()
            request.hand_back("the term ended before it ran")
        logger.debug("celery-leader: term %d of %r revoked on the loop", token, self.election)
