"""The worker side of leader election: Celery wiring around the worker's elections.

One :class:`Coordinator` per worker process, found with
:func:`current_coordinator`. It wires, and decides nothing about the end of
a term:

* the worker's elections, one
  :class:`~celery_leader.worker.worker_election.WorkerElection` each (the
  default election first, then every named one its tasks or
  ``leader_elections`` name), in the process's
  :class:`~celery_leader.elections.group.ElectionGroup`;
* what they share: the consumer, loop liveness, the run watchdog, the
  signal thread, redelivered copies, and the messages the worker holds
  (occurrences are each election's own: see
  :mod:`celery_leader.worker.occurrences`);
* the gate's questions, asked of the election of the task at hand;
* shutdown and inspection of every election.

Stop, then release: each election's lease manager asks its term end's
release guard before any release, so a lease is never freed while leader
work of its term still runs here. A step-down or a warm shutdown gives runs
``leader_stop_grace`` seconds to stop. After that, prefork kills the rest.
Pools that cannot kill keep the lease (renewed, never published as valid
again) until their runs end.

Threads: lease events arrive on each election's manager thread. Queue
changes and request bookkeeping run on the consumer's loop thread through
``call_soon``, one callable per ordered sequence, since Celery does not
order a batch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from celery.worker import state as worker_state

from celery_leader.elections.balancer import Balancer
from celery_leader.elections.group import ElectionGroup
from celery_leader.elections.liveness import CONNECTING, LoopLiveness
from celery_leader.elections.shared_lease import SharedLease
from celery_leader.exceptions import ConfigurationError
from celery_leader.lease import LeaseManager
from celery_leader.settings import ElectionNames, LeaderSettings, names_for_app
from celery_leader.stores.base import LeaseStore
from celery_leader.tasks.overlap import Overlap
from celery_leader.tasks.runtime import install_shared_lease
from celery_leader.tasks.runtime import shared_lease as installed_shared_lease
from celery_leader.term_end import KILLABLE_POOLS, OnLoss, effective_policy
from celery_leader.term_end.in_worker import SnapshotError, Waiting, snapshot
from celery_leader.term_end.orphans import guard_pool_children
from celery_leader.term_end.watchdog import Watchdog
from celery_leader.worker.dispatch import SerialDispatcher
from celery_leader.worker.eta import held_for_eta
from celery_leader.worker.gate import Gate
from celery_leader.worker.wakeup import can_wake_blocking_loop, wake_blocking_loop
from celery_leader.worker.worker_election import WorkerElection, stop_consuming

logger = logging.getLogger(__name__)

#: The longest an idle blocking consumer loop (Celery's synloop) waits between turns, seconds.
BLOCKING_LOOP_TURN = 2.0

_current: Coordinator | None = None


def current_coordinator() -> Coordinator | None:
    """The coordinator of this worker process, if the LeaderElection step runs here."""
    return _current


@dataclass(frozen=True)
class GateProfile:
    """What the gate needs of one registered task object (see :meth:`Coordinator.gate_profile`)."""

    #: The election the task runs under here; None when this worker takes no part in it.
    election: WorkerElection | None
    #: The on_loss policy that applies in this pool, as the request carries it (None: the
    #: task's value is not allowed; asked again, and refused, after admission).
    on_loss: str | None
    #: True unless the overlap policy is "allow" (a value not allowed is refused at admission).
    overlap: bool


class Coordinator:
    """Connects a worker's elections to one Celery worker."""

    def __init__(
        self,
        settings: LeaderSettings,
        store: LeaseStore,
        *,
        nodename: str,
        pool_kind: str,
        group: ElectionGroup | None = None,
        lease_of: Callable[[str | None], str] | None = None,
        renew_grid: float | None = None,
    ) -> None:
        self.nodename = nodename
        #: Renewals of every election land on multiples of this (seconds), to be batched.
        self.renew_grid = renew_grid
        self.pool_kind = pool_kind
        self._policies: dict[int, tuple[Any, OnLoss]] = {}
        self._profiles: dict[int, tuple[Any, GateProfile]] = {}
        #: The elections of this process; a new group unless one is given.
        self.group = group if group is not None else ElectionGroup()
        #: A task's election (short name, None: default) -> its lease name.
        self.lease_of = lease_of or ElectionNames(settings.name, settings.queue).lease_of
        self.consumer: Any = None
        #: The consumer loop's liveness: its ticks, started, stopping, broker reconnects.
        self.loop = LoopLiveness(max(2 * settings.timing.renew_interval, 1.0))
        self._signals: SerialDispatcher | None = None
        #: The gate's verdicts on each leader message, and the settlement of its run.
        self.gate = Gate(self)
        #: Ends prefork runs at their term's deadline (see celery_leader.term_end.watchdog).
        self.watchdog = Watchdog(self.group.shared) if pool_kind in KILLABLE_POOLS else None
        #: Spreads the elections over the workers, where the store can (see elections.balancer).
        self.balancer: Balancer | None = None
        #: Every election of this worker by its own name (None: the default one).
        self.elections: dict[str | None, WorkerElection] = {}
        #: The default election (what a task with no ``election`` runs under).
        self.default = self.add_election(None, settings, store)

    def add_election(
        self, election: str | None, settings: LeaderSettings, store: LeaseStore
    ) -> WorkerElection:
        """Take part in *election* (its *settings* and its own *store*); before :meth:`install`."""
        if election in self.elections:
            raise ValueError(f"this worker takes part in election {election!r} already")
        if self._signals is not None:
            raise RuntimeError("elections are added before the coordinator is installed")
        added = WorkerElection(self, settings, store, election=election, lease_of=self.lease_of)
        self.elections[election] = added
        self._profiles.clear()  # a task of this election was looked up without it
        return added

    def acquire_delay(self, election: str) -> float:
        """Seconds election *election* should wait before trying to acquire (the balancer's)."""
        balancer = self.balancer
        return balancer.acquire_delay(election) if balancer is not None else 0.0

    def election_for(self, task: Any) -> WorkerElection | None:
        """The election *task* runs under here, or None when this worker does not take part."""
        return self.elections.get(getattr(task, "leader_election", None))

    # -- the default election, as earlier releases exposed it -----------------

    @property
    def settings(self) -> LeaderSettings:
        """The default election's settings."""
        return self.default.settings

    @property
    def manager(self) -> LeaseManager:
        """The default election's lease manager."""
        return self.default.manager

    @property
    def shared(self) -> SharedLease:
        """The default election's shared-memory slot."""
        return self.default.shared

    @property
    def managers(self) -> Sequence[LeaseManager]:
        """Every election's lease manager, the default one first (what ``/healthz`` reports)."""
        return [election.manager for election in self.elections.values()]

    @property
    def shutting_down(self) -> bool:
        """True once a warm or cold shutdown began (the loop's ``stopping``)."""
        return self.loop.stopping

    def runs_ended(self, token: int, timeout: float) -> bool:
        """True once no run of the default election's term *token* runs here."""
        return self.default.term_end.runs_ended(token, timeout)

    def sync_consumption(self, *, may_add: bool = True) -> None:
        """Consume each election's leader queue exactly when leading it. Loop thread only.

        With *may_add* False it only stops consuming, never starts (see :meth:`attach`).

        The leader queue of an election this worker takes no part in (one
        declared in ``task_queues``, say) is never consumed: its messages
        would only be handed back, again and again.
        """
        for election in list(self.elections.values()):
            election.sync_consumption(may_add=may_add)
        consumer = self.consumer
        if consumer is None or getattr(consumer, "task_consumer", None) is None:
            return
        for queue in self.foreign_leader_queues(consumer.app):
            stop_consuming(consumer, queue)

    def foreign_leader_queues(self, app: Any) -> list[str]:
        """Leader queues *app* would consume that belong to no election of this worker."""
        ours = {election.queue for election in self.elections.values()}
        names = names_for_app(app)
        return [
            queue
            for queue in list(app.amqp.queues.consume_from)
            if queue not in ours and names.election_of_queue(queue)[0]
        ]

    # -- wiring ---------------------------------------------------------------

    def install(self) -> None:
        """Make this the process's coordinator, share the leases, start the watchdog.

        Call before the pool forks, after every election was added. The
        watchdog is forked first, before any thread of ours exists.
        """
        global _current  # noqa: PLW0603 - one coordinator per worker process
        if self.watchdog is not None:
            self.watchdog.start()
            guard_pool_children()
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
        """The consumer (re)started: start competing, and match consumption to the leases.

        Consumption is matched on the consumer's loop, once it runs.
        """
        self.consumer = consumer
        if getattr(consumer, "hub", None) is None:
            # Celery's blocking loop turns once per drain_events (up to 2 s) when idle.
            self.loop.widen(BLOCKING_LOOP_TURN + 1.0)
        self.loop.tick()
        self.loop.wait_ends(CONNECTING)
        if not self.loop.started:
            self.loop.start()
            if self.balancer is not None:
                self.balancer.start()
            for election in list(self.elections.values()):
                election.manager.start()
        # What must not be consumed is dropped here, before Celery's loop consumes its
        # queues (nothing is consumed yet: no round trip). What must be is added on the
        # loop, never here: Celery sets the task consumer's callback only when its loop
        # starts, and a queue consumed before that (a reconnect while leading) gets its
        # backlog delivered while the next steps open their channels, to a consumer
        # without a callback: the worker dies ("Consumer does not have any callbacks").
        self.sync_consumption(may_add=False)
        self.post(self.sync_consumption)

    def detach(self) -> None:
        """The consumer is stopping (shutdown or broker reconnect).

        What waited at the gate came on the connection that is gone, and
        the broker delivers it again: the gate forgets it
        (:meth:`~celery_leader.worker.gate.Gate.connection_gone`).
        """
        self.consumer = None
        self.loop.wait_begins(CONNECTING)  # until attach(): Celery reconnects, or shuts down
        self.gate.connection_gone()

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

    # -- liveness (the consumer's loop ticks self.loop) -----------------------

    def loop_busy_with_task(self) -> bool:
        """True when a task holds the loop by design: a solo pool runs tasks on the loop thread."""
        if self.pool_kind != "solo":
            return False
        try:
            return bool(snapshot(worker_state.active_requests))
        except SnapshotError:
            return True

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
        if self.loop.turning():
            return True
        # A busy loop is not a stuck one.
        return self.loop_busy_with_task()

    def watchdog_alive(self) -> bool:
        """True when no watchdog is needed or it runs; a dead one is replaced first.

        See :meth:`Watchdog.replace_if_dead
        <celery_leader.term_end.watchdog.Watchdog.replace_if_dead>`.
        """
        watchdog = self.watchdog
        if watchdog is None or watchdog.alive():
            return True
        if self.shutting_down:
            return True  # the worker is going: runs are stopped by the shutdown itself
        return watchdog.replace_if_dead()

    # -- the gate (loop thread) -----------------------------------------------

    def policy_for(self, task: Any) -> OnLoss:
        """The on_loss policy that applies to runs of *task* in this pool (known per task)."""
        found = self._policies.get(id(task))
        if found is None:
            policy = effective_policy(getattr(task, "leader_on_loss", None), self.pool_kind)
            # The task is kept beside its policy: its id is never reused for another one.
            found = self._policies[id(task)] = (task, policy)
        return found[1]

    def gate_profile(self, task: Any) -> GateProfile:
        """What the gate asks of every message of *task*, worked out once per task.

        The gate runs on the loop thread for every leader message, in a
        process whose caches the rest of Celery's work keeps cold: each lookup
        it saves is felt in throughput. Nothing in it changes while the worker
        runs (elections are fixed before :meth:`install`; ``@leader_only``
        sets a task's options before the worker consumes). Keyed by the task
        object, not its class: options are set on the registered instance.
        An option with a value not allowed raises where it did before this
        cache: after admission, from :meth:`policy_for` and
        :meth:`admit_overlap`.
        """
        found = self._profiles.get(id(task))
        if found is None:
            election = self.election_for(task)
            try:
                on_loss: str | None = self.policy_for(task).value
            except ConfigurationError:
                on_loss = None
            profile = GateProfile(
                election=election,
                on_loss=on_loss,
                overlap=getattr(task, "leader_overlap", Overlap.ALLOW) != Overlap.ALLOW,
            )
            found = self._profiles[id(task)] = (task, profile)
        return found[1]

    def unknown_leader_task(self, app: Any, message: Any, queue: str) -> bool:
        """A message of an unregistered task came from *queue*: requeue it if a leader queue.

        True when it was handled here (requeued, and this worker steps down
        from that election so that a worker that knows the task may lead);
        False for any other queue (Celery's own handling applies). Loop thread.
        """
        is_leader_queue, _ = names_for_app(app).election_of_queue(queue)
        if not is_leader_queue:
            return False
        name = (getattr(message, "headers", None) or {}).get("task", "?")
        election = next((e for e in self.elections.values() if e.queue == queue), None)
        logger.error(
            "celery-leader: a message of task %r reached leader queue %r, but this worker does "
            "not know the task: it goes back to the queue and this worker steps down from that "
            "election; import the task's module in every worker that may lead it, or set "
            "leader_elections_exclude",
            name,
            queue,
        )
        message.reject(requeue=True)
        if election is not None:
            election.step_down()
        return True

    def on_gate_refused(self) -> None:
        """A leader message reached us without a lease: make sure we stop consuming."""
        self.post(self.sync_consumption)

    # -- what the elections share -------------------------------------------

    def wake_loop(self) -> None:
        """Have a blocking consumer loop run what was just posted now, not in up to 2 s."""
        consumer = self.consumer
        if can_wake_blocking_loop(consumer):
            wake_blocking_loop(consumer.app, self.nodename)

    def send_event(self, kind: str, election: str, **fields: Any) -> None:
        """Send a Celery event of *kind* for *election*, from the loop thread, when enabled.

        Celery's dispatcher sends types outside the ``worker`` group only
        with task events on (``-E``); it is a no-op otherwise.
        """

        def send() -> None:
            dispatcher = getattr(self.consumer, "event_dispatcher", None)
            if dispatcher is not None and dispatcher.enabled:
                dispatcher.send(kind, name=election, **fields)

        self.post(send)

    def send_signal(self, signal_: Any, election: str, **kwargs: Any) -> None:
        """Send one of :mod:`celery_leader.signals` for *election* on the signal thread."""
        if self._signals is None:
            return
        self._signals.submit(lambda: signal_.send(sender=self.nodename, name=election, **kwargs))

    def waiting_messages(self) -> list[Waiting]:
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

    def step_down(self, election: str | None = None) -> dict[str, Any]:
        """Step down from *election* (None: the default one) where this worker leads it."""
        found = self.elections.get(election)
        if found is None:
            return {
                "ok": False,
                "reason": f"this worker does not take part in election {election!r}",
                "node": self.nodename,
            }
        reply = found.step_down()
        if reply.get("ok") and self.balancer is not None:
            self.balancer.note_step_down(found.name)  # the step-down moves this election alone
        return reply

    # -- shutdown (main thread) ----------------------------------------------

    def begin_shutdown(self) -> None:
        """Warm shutdown: stop taking leader work, stop runs per policy, release once they stopped.

        Each lease is released as soon as no leader task of its election runs
        here any more (a standby then takes over at once), without waiting for
        the rest of the pool to drain; :meth:`finish_shutdown` releases at the
        latest.
        """
        self.loop.stopping = True
        if self.balancer is not None:
            self.balancer.stop()  # the others plan without this worker at once
        for election in list(self.elections.values()):
            election.begin_shutdown()

    def finish_shutdown(self) -> None:
        """After the pool drained: stop leading, release, stop the threads."""
        self.loop.stopping = True
        try:
            for election in list(self.elections.values()):
                try:
                    election.finish_shutdown()
                except Exception:
                    logger.exception(
                        "celery-leader: error while releasing election %r", election.name
                    )
        finally:
            if self.balancer is not None:
                self.balancer.stop()
            if self._signals is not None:
                self._signals.close()
            if self.watchdog is not None:
                self.watchdog.stop()

    # -- inspection -----------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """The worker's view, as ``celery inspect leader`` shows it.

        The default election's keys as in earlier releases, and
        ``"elections"``: every election this worker takes part in, by its
        own name (the default one under its lease name).
        """
        view = self.default.describe()
        view["elections"] = {
            (election.short_name or election.name): {
                key: value for key, value in election.describe().items() if key != "name"
            }
            for election in self.elections.values()
        }
        return view
