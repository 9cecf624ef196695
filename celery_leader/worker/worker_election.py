"""One election in a worker: its lease, its leader queue, the end of its terms, its step-down.

A worker takes part in its app's default election and in every named
election of the leader-only tasks it imports (``@leader_only(election=...)``,
``leader_elections``). Each is one :class:`WorkerElection`, owned by the
worker's :class:`~celery_leader.worker.coordinator.Coordinator`, which wires
what they share (the consumer, loop liveness, the watchdog, the signal
thread, redelivered copies). Per election:

* an :class:`~celery_leader.elections.election.Election` (lease manager,
  shared-memory slot, listener) in the process's election group;
* a :class:`~celery_leader.term_end.in_worker.TermEnd` that ends its terms:
  only its own runs are killed and only its own messages handed back;
* its leader queue, consumed exactly while it leads;
* its occurrences: which run here and which completed, read from its lease
  state as each term starts and written through (see
  :mod:`celery_leader.worker.occurrences` and
  :mod:`celery_leader.worker.occurrence_sync`); a term admits leader work
  once that read returned or failed;
* its step-down, and its part of a warm shutdown.

Guarantees and threads are those of the coordinator: lease events arrive on
the election's manager thread; queue changes run on the consumer's loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from celery_leader import signals
from celery_leader.elections.election import Election
from celery_leader.lease import EventKind, LeaseEvent, Role, lifeline
from celery_leader.settings import LeaderSettings
from celery_leader.stores.base import Holder, LeaseStore
from celery_leader.term_end.in_worker import SnapshotError, TermEnd
from celery_leader.term_end.leaving import Leaving
from celery_leader.worker.occurrence_sync import OccurrenceSync
from celery_leader.worker.occurrences import Occurrences
from celery_leader.worker.wakeup import wake_redis_consumer

if TYPE_CHECKING:
    from celery_leader.elections.group import ElectionGroup
    from celery_leader.term_end import OnLoss
    from celery_leader.term_end.in_worker import Waiting


class ElectionHost(Protocol):
    """What an election needs of the worker it runs in (the worker's coordinator).

    Declared here, so that this module never imports the coordinator that
    wires the elections: the dependency runs one way.
    """

    nodename: str
    pool_kind: str
    group: ElectionGroup
    renew_grid: float | None
    consumer: Any

    @property
    def shutting_down(self) -> bool:
        """True once the worker is leaving."""

    def is_live(self) -> bool:
        """True while the worker can act on leadership."""

    def watchdog_alive(self) -> bool:
        """True when no run watchdog is needed or it runs."""

    def acquire_delay(self, election: str) -> float:
        """Seconds *election* should wait before trying to acquire."""

    def policy_for(self, task: Any) -> OnLoss:
        """The on_loss policy of *task*'s runs in this pool."""

    def post(self, fn: Callable[[], None]) -> None:
        """Run *fn* on the consumer's loop thread."""

    def wake_loop(self) -> None:
        """Have a blocking consumer loop run what was posted now."""

    def waiting_messages(self) -> list[Waiting]:
        """Leader messages held here that never reached the pool."""

    def send_event(self, kind: str, election: str, **fields: Any) -> None:
        """Send a Celery event of *kind* for *election*."""

    def send_signal(self, signal_: Any, election: str, **kwargs: Any) -> None:
        """Send one of celery_leader's signals for *election*."""


logger = logging.getLogger(__name__)


def stop_consuming(consumer: Any, queue: str) -> None:
    """Stop consuming *queue*, or keep it out of the queues a consumer starts with. Loop thread."""
    if consumer.task_consumer.consuming_from(queue):
        consumer.cancel_task_queue(queue)
    else:
        consumer.app.amqp.queues.deselect(queue)


class WorkerElection:
    """One election of this worker; see the module docstring."""

    def __init__(
        self,
        coordinator: ElectionHost,
        settings: LeaderSettings,
        store: LeaseStore,
        *,
        election: str | None,
        lease_of: Callable[[str | None], str],
    ) -> None:
        self.coordinator = coordinator
        self.settings = settings
        # Copied from the (frozen) settings, not properties: the gate reads both for every
        # leader message.
        #: The election's lease name.
        self.name: str = settings.name
        #: The election's leader queue.
        self.queue: str = settings.queue
        #: The election's own name (``@leader_only(election=...)``); None: the default one.
        self.short_name = election
        self.election: Election = coordinator.group.add(
            settings.name,
            store,
            settings.timing,
            holder=Holder.for_this_process(coordinator.nodename),
            liveness=coordinator.is_live,
            release_guard=self._work_stopped,
            may_publish=coordinator.watchdog_alive,
            on_elected=self._on_elected,
            on_ended=self._on_ended,
            acquire_delay=lambda: coordinator.acquire_delay(settings.name),
            renew_grid=coordinator.renew_grid,
            **lifeline.manager_options(
                store,
                settings.masked_backend_url,
                enabled=settings.fast_failover,
                label="the worker",
            ),
        )
        self.manager = self.election.manager
        #: This election's shared-memory slot (its group holds the run table).
        self.shared = self.election.shared
        #: Ends this election's terms here (see celery_leader.term_end.in_worker).
        self.term_end = TermEnd(
            self.shared,
            coordinator.pool_kind,
            policy_for=coordinator.policy_for,
            post=coordinator.post,
            wake_loop=coordinator.wake_loop,
            stop_consuming=self.sync_consumption,
            waiting=coordinator.waiting_messages,
            lease_of=lease_of,
        )
        #: This election's occurrences here: those running, those completed.
        self.occurrences = Occurrences()
        #: Reads them from the election's lease state at each term, writes completions.
        self.occurrence_sync = OccurrenceSync(
            self.occurrences,
            store,
            settings.name,
            timeout=settings.timing.op_timeout,
            retry_every=settings.timing.renew_interval,
            leading=lambda token: self.manager.current_token() == token,
            on_ready=self._occurrences_ready,
        )
        #: Its step-down, hand-over and warm shutdown (see celery_leader.term_end.leaving).
        self.leaving = Leaving(
            self.term_end,
            self.manager,
            election=settings.name,
            node=coordinator.nodename,
            sit_out=settings.timing.ttl,
            stop_grace=settings.stop_grace,
            poll=settings.timing.renew_interval,
            stop_taking_work=lambda: coordinator.post(self.sync_consumption),
        )
        #: The last term that ended by a loss (its release flush waits for no run).
        self._lost_token: int | None = None

    # -- the gate (loop thread) -----------------------------------------------

    def admit(self) -> int | None:
        """The token to run a leader task of this election under now, or None to hand it back.

        None also while the term's record of completed occurrences is being
        read (at most one store timeout as the term starts).
        """
        # One expression, no helper calls: this runs for every leader message.
        token = self.manager.current_token()
        if (
            token is None
            or self.leaving.under_way
            or self.coordinator.shutting_down
            or self.shared.deadline_of(token) is None
            or not self.occurrence_sync.ready(token)
        ):
            return None
        return token

    def refusal_reason(self) -> str:
        """Why :meth:`admit` refuses now, as the gate logs it when it hands a message back."""
        token = self.manager.current_token()
        valid = self._taking_work() and token is not None and self.shared.valid_for(token)
        if valid and not self.occurrence_sync.ready(token):
            return "the term's record of completed occurrences is being read"
        return "this worker does not hold the lease"

    def _taking_work(self) -> bool:
        """False while stepping down or shutting down: no new leader work then."""
        return not (self.stepping_down or self.coordinator.shutting_down)

    # -- leader queue (loop thread) -------------------------------------------

    def should_consume(self) -> bool:
        """True when this worker should consume the election's leader queue now.

        Not before the term's completed occurrences were read (or the read failed).
        """
        if not self._taking_work():
            return False
        token = self.manager.current_token()
        return token is not None and self.occurrence_sync.ready(token)

    def sync_consumption(self, *, may_add: bool = True) -> None:
        """Consume the leader queue exactly when leading. Loop thread only.

        With *may_add* False it only stops: what the consumer step may do
        before Celery's loop runs (see Coordinator.attach).
        """
        consumer = self.coordinator.consumer
        if consumer is None or getattr(consumer, "task_consumer", None) is None:
            return
        if not self.should_consume():
            stop_consuming(consumer, self.queue)
        elif may_add and not consumer.task_consumer.consuming_from(self.queue):
            consumer.add_task_queue(self.queue)
            wake_redis_consumer(consumer)

    # -- lease events (manager thread) ----------------------------------------

    def _on_elected(self, event: LeaseEvent) -> None:
        """A term began (manager thread; the Election published it already)."""
        token = event.term.token
        # First: the gate admits nothing under the term until its record was read.
        self.occurrence_sync.begin_term(token, self.manager.holder.lease_id)
        self.coordinator.post(self.sync_consumption)
        self.coordinator.wake_loop()
        self.coordinator.send_signal(signals.leader_elected, self.name, token=token)
        self.coordinator.send_event("leader-elected", self.name, token=token)

    def _occurrences_ready(self, token: int) -> None:
        """The term's record was read (or could not be): consume the leader queue now."""
        self.coordinator.post(self.sync_consumption)
        self.coordinator.wake_loop()

    def _on_ended(self, event: LeaseEvent) -> None:
        """A term ended (manager thread; the Election revoked it already): end its work."""
        token = event.term.token
        if event.kind is EventKind.LOST:
            self._lost_token = token  # before the release guard runs (the same thread)
        self.term_end.end(token)
        if event.kind is EventKind.LOST:
            reason = event.reason.value if event.reason else "unknown"
            self.coordinator.send_signal(signals.leader_lost, self.name, token=token, reason=reason)
            self.coordinator.send_event("leader-lost", self.name, token=token, reason=reason)
        else:
            self.coordinator.send_signal(signals.leader_released, self.name, token=token)
            self.coordinator.send_event("leader-released", self.name, token=token)

    # -- the end of a term (celery_leader.term_end.in_worker) ------------------

    def _work_stopped(self, term: Any) -> bool:
        """The release guard: no run of *term* goes on; then its occurrences are written."""
        stopped = self.term_end.work_stopped(term)
        if stopped:
            # The runs that completed are in the record the next leader reads: wait for its
            # writes (bounded), while the lease is still ours in the store. Only once the
            # runs stopped: asked again and again while they drain, the lease thread must
            # not sit out a store timeout each time. A run whose process is gone (killed)
            # has nothing on its way; after a loss (a stuck loop) no run would settle.
            self.occurrence_sync.flush(
                term.token,
                self.settings.timing.op_timeout,
                settle_runs=self._lost_token != term.token,
                gone=self.term_end.process_gone,
            )
        return stopped

    # -- the ends of a term this worker chooses (celery_leader.term_end.leaving) ---

    @property
    def stepping_down(self) -> bool:
        """True while a step-down or a hand-over of this election is under way."""
        return self.leaving.under_way

    def step_down(self) -> dict[str, Any]:
        """Stop leader work, then release in the background and sit out one ttl."""
        return self.leaving.step_down()

    def hand_over(self) -> bool:
        """Give the election to another worker without cutting a run short (the balancer's move).

        See :meth:`Leaving.hand_over <celery_leader.term_end.leaving.Leaving.hand_over>`.
        """
        return self.leaving.hand_over()

    def begin_shutdown(self) -> None:
        """Warm shutdown: stop runs per policy, release once they stopped (in the background)."""
        self.leaving.begin_shutdown()

    def finish_shutdown(self) -> None:
        """After the pool drained: stop leading, release, close the store."""
        try:
            self.leaving.finish_shutdown()
        finally:
            self.occurrence_sync.close()
            self.manager.store.close()

    # -- inspection -----------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """The election as ``celery inspect leader`` shows it."""
        state = self.manager.state()
        left = self.manager.time_left()
        leading = state.role is Role.LEADER and left is not None
        view: dict[str, Any] = {
            "role": "leader" if leading else "follower",
            "name": self.name,
            "token": state.token if leading else None,
            "expires_in": round(left, 3) if left is not None else None,
        }
        holding_off = self.manager.hold_off_left()
        if holding_off is not None:
            # The lease is ours in the store, but no leader work runs until the
            # hold-off ends: what `celery leader status` also says.
            view["holding_off"] = round(holding_off, 3)
        reading = self.occurrence_sync.reading_for(state.token) if leading else None
        if reading is not None:
            # Elected, but no leader work is admitted until the term's record of completed
            # occurrences was read (or the read failed): how long that has taken so far.
            view["reading_occurrences"] = round(reading, 3)
        if leading and (self.stepping_down or self.coordinator.shutting_down):
            view["stepping_down"] = True
            try:
                view["draining"] = len(self.term_end.leader_runs(state.token or 0))
            except SnapshotError:
                view["draining"] = None
        return view
