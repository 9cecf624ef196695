"""The worker side of one election: Celery wiring around an Election and its TermEnd.

One :class:`Coordinator` per worker process, found with
:func:`current_coordinator`. It wires, and decides nothing about the end of
a term:

* the :class:`~celery_leader.elections.election.Election` (lease manager,
  shared-memory slot, listener) in the process's
  :class:`~celery_leader.elections.group.ElectionGroup`;
* the :class:`~celery_leader.term_end.in_worker.TermEnd` that ends the
  election's terms, handed the callables it needs (post to the loop, wake
  it, stop consuming, the messages waiting);
* the consumer: consume the leader queue exactly while leading;
* loop liveness, the gate's questions, redelivered copies, events and
  signals, step-down, shutdown and inspection.

Stop, then release: the lease manager asks the term end's release guard
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
from celery_leader.elections.election import Election
from celery_leader.elections.group import ElectionGroup
from celery_leader.lease import EventKind, LeaseEvent, Role
from celery_leader.settings import LeaderSettings
from celery_leader.stores.base import Holder, LeaseStore
from celery_leader.tasks.runtime import install_shared_lease
from celery_leader.tasks.runtime import shared_lease as installed_shared_lease
from celery_leader.term_end import KILLABLE_POOLS, OnLoss, effective_policy
from celery_leader.term_end.in_worker import SnapshotError, TermEnd, Waiting, snapshot
from celery_leader.term_end.watchdog import Watchdog
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

_current: Coordinator | None = None


def current_coordinator() -> Coordinator | None:
    """The coordinator of this worker process, if the LeaderElection step runs here."""
    return _current


class Coordinator:
    """Connects a lease manager to one Celery worker."""

    def __init__(
        self,
        settings: LeaderSettings,
        store: LeaseStore,
        *,
        nodename: str,
        pool_kind: str,
        group: ElectionGroup | None = None,
    ) -> None:
        self.settings = settings
        self.nodename = nodename
        self.pool_kind = pool_kind
        self._policies: dict[type, OnLoss] = {}
        #: The elections of this process (one today); a new group unless one is given.
        self.group = group if group is not None else ElectionGroup()
        self.election: Election = self.group.add(
            settings.name,
            store,
            settings.timing,
            holder=Holder.for_this_process(nodename),
            liveness=self.is_live,
            release_guard=self._work_stopped,
            may_publish=self.watchdog_alive,
            on_elected=self._on_elected,
            on_ended=self._on_ended,
        )
        self.manager = self.election.manager
        #: This election's shared-memory slot (its group holds the run table).
        self.shared = self.election.shared
        #: Ends this election's terms here (see celery_leader.term_end.in_worker).
        self.term_end = TermEnd(
            self.shared,
            pool_kind,
            policy_for=self.policy_for,
            post=self.post,
            wake_loop=self._wake_loop,
            stop_consuming=self.sync_consumption,
            waiting=self._waiting_messages,
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
        #: Ends prefork runs at their term's deadline (see celery_leader.term_end.watchdog).
        self.watchdog = Watchdog(self.shared.group) if pool_kind in KILLABLE_POOLS else None

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
            return bool(snapshot(worker_state.active_requests))
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
        """The on_loss policy that applies to runs of *task* in this pool (known per class)."""
        cls = type(task)
        policy = self._policies.get(cls)
        if policy is None:
            policy = effective_policy(getattr(task, "leader_on_loss", None), self.pool_kind)
            self._policies[cls] = policy
        return policy

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
        if qos is not None and qos.increment_eventually():
            # The copy must not hold a prefetch slot meanwhile; the slot goes back
            # to this same consumer's count (a reconnect makes a new one).
            request.leader_parked_qos = qos
        return False

    def run_settled(self, request: Any, outcome: str) -> None:
        """The run of *request* ended (any thread): settle the copies that waited for it."""
        copies = self.redeliveries.settle(request, outcome)
        if copies:
            self.post(
                lambda: release_copies(
                    copies, outcome, redispatch=self._redispatch, unpark=self._unpark
                )
            )

    @staticmethod
    def _unpark(request: Any) -> None:
        qos = getattr(request, "leader_parked_qos", None)
        if qos is not None:
            request.leader_parked_qos = None
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

    def _on_elected(self, event: LeaseEvent) -> None:
        """A term began (manager thread; the Election published it already)."""
        token = event.term.token
        self.post(self.sync_consumption)
        self._wake_loop()
        self._send(signals.leader_elected, token=token)
        self._send_event("leader-elected", token=token)

    def _on_ended(self, event: LeaseEvent) -> None:
        """A term ended (manager thread; the Election revoked it already): end its work."""
        token = event.term.token
        self.term_end.end(token)
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

    # -- the end of a term (celery_leader.term_end.in_worker) ------------------

    def revoke(self, token: int, *, on_loop: bool = False) -> None:
        """End term *token* here for good (see :meth:`TermEnd.end`)."""
        self.term_end.end(token, on_loop=on_loop)

    def leader_runs(self, token: int) -> list[Any]:
        """Leader runs of term *token* (or older) that this process saw start and not yet end."""
        return self.term_end.leader_runs(token)

    def runs_ended(self, token: int, timeout: float) -> bool:
        """True once no run of term *token* runs here; waits at most *timeout* s."""
        return self.term_end.runs_ended(token, timeout)

    def _work_stopped(self, term: Any) -> bool:
        return self.term_end.work_stopped(term)

    def _waiting_messages(self) -> list[Waiting]:
        """Leader messages held here that never reached the pool: ETA ones first. Loop thread."""
        consumer = self.consumer
        waiting = []
        for item in held_for_eta(consumer):

            def cancel(entry: Any = item.entry) -> None:
                if consumer is not None and consumer.timer is not None:
                    consumer.timer.cancel(entry)
                    consumer.qos.decrement_eventually()

            waiting.append(Waiting(item.request, cancel))
        waiting += [Waiting(r, None) for r in snapshot(worker_state.reserved_requests)]
        return waiting

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
        self.term_end.await_stopped(
            token,
            self.settings.stop_grace,
            holding=lambda: self.manager.state().role is not Role.FOLLOWER,
            poll=self.settings.timing.renew_interval,
        )

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
        holding_off = self.manager.hold_off_left()
        if holding_off is not None:
            # The lease is ours in the store, but no leader work runs until the
            # hold-off ends: what `celery leader status` also says.
            view["holding_off"] = round(holding_off, 3)
        if leading and (self.stepping_down or self.shutting_down):
            view["stepping_down"] = True
            try:
                view["draining"] = len(self.term_end.leader_runs(state.token or 0))
            except SnapshotError:
                view["draining"] = None
        return view
