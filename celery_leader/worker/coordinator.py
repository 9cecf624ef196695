"""The worker side of one election: lease events in, Celery actions out.

One :class:`Coordinator` per worker process, found with
:func:`current_coordinator`. It builds and owns the lease manager, and
turns its events into Celery actions:

* ELECTED: publish the term to the places where work runs, and start
  consuming the leader queue (on the consumer's loop thread).
* RENEWED: extend the term in shared memory. A revoked term stays revoked.
* LOST / RELEASED: revoke the term at once, for good (shared memory, so that
  runs and buffered jobs see it), and kill the ``terminate`` runs straight
  from the lease thread. Then, on the loop thread, stop consuming the
  leader queue and hand back the leader messages that never reached the
  pool.

What the end of a term does to a run (policies, the kill, the watchdog, the
hand-back rule) lives in :mod:`celery_leader.term_end`.

Stop, then release: the lease manager asks :meth:`Coordinator.work_stopped`
before any release, so the lease is never freed while leader work of the
term still runs here. A step-down or a warm shutdown gives runs
``leader_stop_grace`` seconds to stop. After that, prefork kills the rest.
Pools that cannot kill keep the lease (renewed, never published as valid
again) until their runs end.

Threads: lease events arrive on the manager thread. Queue changes and
request bookkeeping run on the consumer's loop thread through ``call_soon``,
one callable per ordered sequence, since Celery does not order a batch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from celery.worker import state as worker_state
from celery.worker.state import task_ready, task_reserved

from celery_leader import signals
from celery_leader.lease import EventKind, LeaseEvent, LeaseManager, Role, Term
from celery_leader.runtime import install_shared_lease
from celery_leader.runtime import shared_lease as installed_shared_lease
from celery_leader.settings import LeaderSettings
from celery_leader.shared_lease import SharedLease, SharedLeases
from celery_leader.stores.base import Holder, LeaseStore
from celery_leader.term_end import (
    KILLABLE_POOLS,
    OnLoss,
    Watchdog,
    effective_policy,
    kill_recorded_runs,
    kill_runs,
    process_ended,
)
from celery_leader.worker.dispatch import SerialDispatcher
from celery_leader.worker.eta import held_for_eta
from celery_leader.worker.redelivery import (
    DROP,
    RUN,
    Redeliveries,
    describe_parking,
    release_copies,
)
from celery_leader.worker.wakeup import (
    can_wake_blocking_loop,
    wake_blocking_loop,
    wake_redis_consumer,
)

logger = logging.getLogger(__name__)

#: The longest an idle blocking consumer loop (Celery's synloop) waits between turns, seconds.
BLOCKING_LOOP_TURN = 2.0
#: How long the release waits for killed runs to be gone, in seconds.
KILL_SETTLE = 1.0

_current: Coordinator | None = None


def current_coordinator() -> Coordinator | None:
    """The coordinator of this worker process, if the LeaderElection step runs here."""
    return _current


class SnapshotError(RuntimeError):
    """Celery's request set could not be copied: callers must assume the worst."""


def _snapshot(requests: Any) -> list[Any]:
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


def election_of(request: Any) -> str | None:
    """The election a leader request belongs to: the one it was admitted under, else its task's.

    None for a task that names none: it belongs to the process's one election.
    """
    admitted = getattr(request, "leader_election", None)
    return admitted if admitted is not None else getattr(request.task, "leader_election", None)


def _of_term(request: Any, election: str, token: int) -> bool:
    """True for a request of *election*'s term *token* or older (or not admitted yet)."""
    if election_of(request) not in (None, election):
        return False  # another election's tokens mean nothing to this one
    run_token = getattr(request, "leader_token", None)
    return run_token is None or run_token <= token


class Coordinator:
    """Connects a lease manager to one Celery worker."""

    def __init__(
        self,
        settings: LeaderSettings,
        store: LeaseStore,
        *,
        nodename: str,
        pool_kind: str,
        shared: SharedLease | None = None,
    ) -> None:
        self.settings = settings
        self.nodename = nodename
        self.pool_kind = pool_kind
        #: The shared lease slot of this election; its group (one per process) holds
        #: every election's slot and the run table. A new group unless one is given.
        self.shared = shared if shared is not None else SharedLeases().add(settings.name)
        self.manager = LeaseManager(
            store,
            settings.name,
            settings.timing,
            holder=Holder.for_this_process(nodename),
            listeners=(self.on_lease_event,),
            liveness=self.is_live,
            release_guard=self.work_stopped,
        )
        self.consumer: Any = None
        self.stepping_down = False
        self.shutting_down = False
        self._last_tick = time.monotonic()
        self._liveness_window = max(2 * settings.timing.renew_interval, 1.0)
        self._started = False
        self._signals: SerialDispatcher | None = None
        self._lock = threading.Lock()
        #: Leader runs by task id, and their messages delivered again meanwhile.
        self.redeliveries = Redeliveries()
        #: Ends prefork runs at their term's deadline (see celery_leader.term_end).
        self.watchdog = Watchdog(self.shared) if pool_kind in KILLABLE_POOLS else None

    # -- wiring ---------------------------------------------------------------

    def install(self) -> None:
        """Make this the process's coordinator, share the lease, start the watchdog.

        Call before the pool forks. The watchdog is forked first, before any
        thread of ours exists.
        """
        global _current  # noqa: PLW0603 - one coordinator per worker process
        if self.watchdog is not None:
            self.watchdog.start()
        self._signals = SerialDispatcher("celery-leader-signals")
        _current = self
        install_shared_lease(self.shared)

    def uninstall(self) -> None:
        """Undo :meth:`install`, for a worker embedded in a process that goes on (tests)."""
        global _current  # noqa: PLW0603 - one coordinator per worker process
        if _current is self:
            _current = None
        if installed_shared_lease() is self.shared:
            install_shared_lease(None)

    def attach(self, consumer: Any) -> None:
        """The consumer (re)started: start competing, and match consumption to the lease."""
        self.consumer = consumer
        if getattr(consumer, "hub", None) is None:
            # Celery's blocking loop turns once per drain_events (up to 2 s) when idle.
            self._liveness_window = max(self._liveness_window, BLOCKING_LOOP_TURN + 1.0)
        self.tick()
        if not self._started:
            self._started = True
            self.manager.start()
        self.sync_consumption()

    def detach(self) -> None:
        """The consumer is stopping (shutdown or broker reconnect)."""
        self.consumer = None

    def post(self, fn: Callable[[], None]) -> None:
        """Run *fn* on the consumer's loop thread; errors are logged, never raised there."""
        consumer = self.consumer
        if consumer is None:
            return

        def guarded() -> None:
            try:
                fn()
            except Exception:
                logger.exception("celery-leader: error in a worker callback")

        consumer.call_soon(guarded)

    # -- liveness -------------------------------------------------------------

    def tick(self) -> None:
        """Called from the consumer's loop: the loop is alive."""
        self._last_tick = time.monotonic()

    def loop_age(self) -> float:
        """Seconds since the consumer's loop last ticked."""
        return time.monotonic() - self._last_tick

    def loop_busy_with_task(self) -> bool:
        """True when a task holds the loop by design: a solo pool runs tasks on the loop thread."""
        if self.pool_kind != "solo":
            return False
        try:
            return bool(_snapshot(worker_state.active_requests))
        except SnapshotError:
            return True

    @property
    def started(self) -> bool:
        """True once the consumer connected and the election began."""
        return self._started

    @property
    def connected(self) -> bool:
        """False while the consumer is stopped: Celery reconnects to the broker, or shuts down."""
        return self.consumer is not None

    def is_live(self) -> bool:
        """True while the worker can act on leadership: its loop runs (or a solo task does).

        Asked before every renewal and every attempt to acquire. A prefork
        worker is also not live while its run watchdog is dead: a dead
        watchdog is replaced here, and the lease is renewed only once the
        replacement runs, so no validity is ever published that no watchdog
        enforces.
        """
        if not self.watchdog_alive():
            return False
        if self.shutting_down:
            return True
        if self.loop_age() < self._liveness_window:
            return True
        # A busy loop is not a stuck one.
        return self.loop_busy_with_task()

    def watchdog_alive(self) -> bool:
        """True when no watchdog is needed or it runs; a dead one is replaced first."""
        watchdog = self.watchdog
        if watchdog is None or watchdog.alive():
            return True
        if self.shutting_down:
            return True  # the worker is going: runs are stopped by the shutdown itself
        logger.error("celery-leader: the run watchdog died; starting a new one")
        try:
            watchdog.restart()
        except OSError:
            logger.exception("celery-leader: cannot start a new run watchdog; not renewing")
            return False
        return watchdog.alive()

    # -- the gate (loop thread) -----------------------------------------------

    def admit(self) -> int | None:
        """The token to run a leader task under now, or None to hand it back."""
        token = self.manager.current_token()
        if not self._taking_work() or token is None or not self.shared.valid_for(token):
            return None
        return token

    def policy_for(self, task: Any) -> OnLoss:
        """The on_loss policy that applies to runs of *task* in this pool."""
        return effective_policy(getattr(task, "leader_on_loss", None), self.pool_kind)

    def admit_delivery(self, request: Any) -> bool:
        """True to run *request* now; False when it is a copy of a run's message (kept or dropped).

        Loop thread, at the gate. See :mod:`celery_leader.worker.redelivery`.
        """
        verdict = self.redeliveries.admit(request)
        if verdict == RUN:
            return True
        task_ready(request)  # not reserved any more: the hand-back at a term's end skips it
        if verdict == DROP:
            logger.info(
                "celery-leader: %s was delivered again after its run completed here; "
                "acknowledged without running",
                request.humaninfo(),
            )
            request.acknowledge()
            return False
        logger.warning(describe_parking(request))
        qos = getattr(self.consumer, "qos", None)
        if qos is not None:
            qos.increment_eventually()  # the copy must not hold a prefetch slot meanwhile
        return False

    def run_settled(self, request: Any, *, completed: bool) -> None:
        """The run of *request* ended (any thread): settle the copies that waited for it."""
        copies = self.redeliveries.settle(request, completed=completed)
        if copies:
            self.post(
                lambda: release_copies(
                    copies, completed=completed, redispatch=self._redispatch, unpark=self._unpark
                )
            )

    def _unpark(self) -> None:
        qos = getattr(self.consumer, "qos", None)
        if qos is not None:
            qos.decrement_eventually()

    def _redispatch(self, request: Any) -> None:
        """Hand a copy that waited to the worker again: through the gate, as on receipt."""
        consumer = self.consumer
        if consumer is None:
            return  # reconnecting: the broker delivers the unacknowledged message again
        task_reserved(request)
        consumer.on_task_request(request)

    def on_gate_refused(self) -> None:
        """A leader message reached us without a lease: make sure we stop consuming."""
        self.post(self.sync_consumption)

    # -- leader queue (loop thread) -------------------------------------------

    def _taking_work(self) -> bool:
        """False while stepping down or shutting down: no new leader work then."""
        return not (self.stepping_down or self.shutting_down)

    def should_consume(self) -> bool:
        """True when this worker should consume the leader queue now."""
        return self._taking_work() and self.manager.is_leader()

    def sync_consumption(self) -> None:
        """Consume the leader queue exactly when leading. Loop thread only."""
        consumer = self.consumer
        if consumer is None or getattr(consumer, "task_consumer", None) is None:
            return
        queue = self.settings.queue
        consuming = consumer.task_consumer.consuming_from(queue)
        wanted = self.should_consume()
        if wanted and not consuming:
            consumer.add_task_queue(queue)
            wake_redis_consumer(consumer)
        elif not wanted:
            if consuming:
                consumer.cancel_task_queue(queue)
            else:
                consumer.app.amqp.queues.deselect(queue)

    # -- lease events (manager thread) ----------------------------------------

    def on_lease_event(self, event: LeaseEvent) -> None:
        """Handle one event from the lease manager. Runs on the manager thread."""
        token = event.term.token
        if event.kind is EventKind.ELECTED:
            self.watchdog_alive()  # checked before the acquire too; a death since is caught here
            self.shared.publish(token, event.term.valid_until)
            self.post(self.sync_consumption)
            self._wake_loop()
            self._send(signals.leader_elected, token=token)
            self._send_event("leader-elected", token=token)
        elif event.kind is EventKind.RENEWED:
            self.shared.publish(token, event.term.valid_until)  # refused once revoked
        else:
            self.revoke(token)
            if event.kind is EventKind.LOST:
                reason = event.reason.value if event.reason else "unknown"
                self._send(signals.leader_lost, token=token, reason=reason)
                self._send_event("leader-lost", token=token, reason=reason)
            else:
                self._send(signals.leader_released, token=token)
                self._send_event("leader-released", token=token)

    def _wake_loop(self) -> None:
        """Have a blocking consumer loop run what was just posted now, not in up to 2 s."""
        consumer = self.consumer
        if can_wake_blocking_loop(consumer):
            wake_blocking_loop(consumer.app, self.nodename)

    def _send_event(self, kind: str, **fields: Any) -> None:
        """Send a Celery event of *kind*, from the loop thread, when the worker sends events.

        Celery's dispatcher sends types outside the ``worker`` group only
        with task events on (``-E``); it is a no-op otherwise.
        """

        def send() -> None:
            dispatcher = getattr(self.consumer, "event_dispatcher", None)
            if dispatcher is not None and dispatcher.enabled:
                dispatcher.send(kind, name=self.settings.name, **fields)

        self.post(send)

    def _send(self, signal_: Any, **kwargs: Any) -> None:
        if self._signals is None:
            return
        self._signals.submit(
            lambda: signal_.send(sender=self.nodename, name=self.settings.name, **kwargs)
        )

    # -- the end of a term ----------------------------------------------------

    def revoke(self, token: int, *, on_loop: bool = False) -> None:
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
            # Every terminate run of the term whose child is alive, whatever the
            # run table says: the table is the watchdog's view, and a slot it
            # cannot read must not spare a run here too. A child that already
            # finished (its result on its way) loses nothing: its result was sent.
            doomed = [
                r
                for r in runs
                if self.policy_for(r.task) is OnLoss.TERMINATE and not self._process_gone(r)
            ]
            kill_runs(doomed, "lease lost")
            # And runs the parent has not seen start, from the run table.
            kill_recorded_runs(self.shared, token, "lease lost", terminate_only=True)
        if on_loop:
            self.hand_back_waiting(token)
        else:
            self.post(lambda: self.hand_back_waiting(token))
            self._wake_loop()

    def leader_runs(self, token: int) -> list[Any]:
        """Leader runs of term *token* (or older) that the parent saw start and not yet end."""
        return [
            request
            for request in _snapshot(worker_state.active_requests)
            if is_leader_request(request) and _of_term(request, self.settings.name, token)
        ]

    def runs_ended(self, token: int, timeout: float) -> bool:
        """Block until no run of term *token* runs here (at most *timeout* s); True when none does.

        A run the parent killed counts as ended as soon as its process
        exited, before the loop thread has processed its death.
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                running = [r for r in self.leader_runs(token) if not self._process_gone(r)]
            except SnapshotError:
                running = [None]  # unknown: assume work still runs
            # Runs the pool's children recorded, the parent may not know of yet.
            running += self.shared.runs.running(
                token, exclude_pid=self.shared.owner_pid, election=self.shared.election
            )
            if not running:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)

    def _process_gone(self, request: Any) -> bool:
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
        try:
            kill_runs(self.leader_runs(token), reason)
        except SnapshotError:
            logger.exception("celery-leader: cannot list runs to stop them")
        kill_recorded_runs(self.shared, token, reason)
        return self.runs_ended(token, KILL_SETTLE)

    def work_stopped(self, term: Term) -> bool:
        """The release guard: True once no work of *term* runs here (waits briefly for kills)."""
        return self.runs_ended(term.token, KILL_SETTLE)

    def hand_back_waiting(self, token: int) -> None:
        """Stop consuming; hand back leader messages that never reached the pool. Loop thread."""
        self.sync_consumption()
        consumer = self.consumer
        held = held_for_eta(consumer)
        eta_entries = {id(item.request): item.entry for item in held}
        waiting = [
            *(item.request for item in held),
            *_snapshot(worker_state.reserved_requests),
        ]
        for request in never_dispatched(waiting):
            if not _of_term(request, self.settings.name, token):
                continue  # another election's message: its own term decides
            entry = eta_entries.get(id(request))
            if entry is not None and consumer is not None and consumer.timer is not None:
                consumer.timer.cancel(entry)
                consumer.qos.decrement_eventually()
            request.hand_back("the term ended before it ran")
        logger.debug("celery-leader: term %d revoked on the loop", token)

    # -- step-down (loop thread, from a control command) ---------------------

    def step_down(self) -> dict[str, Any]:
        """Stop leader work, then release in the background and sit out one ttl."""
        token = self.manager.current_token()
        if token is None:
            return {"ok": False, "reason": "not leader", "node": self.nodename}
        with self._lock:
            if self.stepping_down:
                return {"ok": True, "token": token, "node": self.nodename}
            self.stepping_down = True
        self.revoke(token, on_loop=True)
        threading.Thread(
            target=self._finish_step_down,
            args=(token,),
            name="celery-leader-step-down",
            daemon=True,
        ).start()
        return {"ok": True, "token": token, "node": self.nodename}

    def _finish_step_down(self, token: int) -> None:
        try:
            self._await_stopped(token)
            self.manager.step_down(sit_out=self.settings.timing.ttl)
        except Exception:
            logger.exception("celery-leader: step-down failed")
        finally:
            self.stepping_down = False

    def _await_stopped(self, token: int) -> None:
        """Stop the runs of *token*; where they cannot be killed, wait for them while leading."""
        if self.stop_runs(token, self.settings.stop_grace):
            return
        logger.warning(
            "celery-leader: leader tasks of term %d still run and this pool cannot stop "
            "them; the lease is kept (no new leader work) until they end",
            token,
        )
        while self.manager.state().role is not Role.FOLLOWER:
            if self.runs_ended(token, self.settings.timing.renew_interval):
                return

    # -- shutdown (main thread) ----------------------------------------------

    def begin_shutdown(self) -> None:
        """Warm shutdown: stop taking leader work, stop runs per policy, release once they stopped.

        The lease is released as soon as no leader task runs here any more
        (a standby then takes over at once), without waiting for the rest of
        the pool to drain; :meth:`finish_shutdown` releases at the latest.
        """
        self.shutting_down = True
        token = self.manager.current_token()
        if token is None:
            return
        self.revoke(token)  # the consumer is stopping: only the urgent part still runs
        threading.Thread(
            target=self._release_when_stopped,
            args=(token,),
            name="celery-leader-shutdown",
            daemon=True,
        ).start()

    def _release_when_stopped(self, token: int) -> None:
        try:
            self._await_stopped(token)
            self.manager.stop(release=True)
        except Exception:
            logger.exception("celery-leader: early release failed; releasing at shutdown")

    def finish_shutdown(self) -> None:
        """After the pool drained: stop leading, release, stop the threads."""
        self.shutting_down = True
        try:
            self.manager.stop(release=True)
        finally:
            if self._signals is not None:
                self._signals.close()
            if self.watchdog is not None:
                self.watchdog.stop()
            self.manager.store.close()

    # -- inspection -----------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """The worker's view, as ``celery inspect leader`` shows it."""
        state = self.manager.state()
        left = self.manager.time_left()
        leading = state.role is Role.LEADER and left is not None
        view: dict[str, Any] = {
            "role": "leader" if leading else "follower",
            "name": self.settings.name,
            "token": state.token if leading else None,
            "expires_in": round(left, 3) if left is not None else None,
        }
        if leading and (self.stepping_down or self.shutting_down):
            view["stepping_down"] = True
            try:
                view["draining"] = len(self.leader_runs(state.token or 0))
            except SnapshotError:
                view["draining"] = None
        return view
