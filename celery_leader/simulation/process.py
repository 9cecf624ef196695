"""One simulated worker process with several elections, and its balancer.

With several elections (``World(elections=K)``) a worker process is one
:class:`~.node.Node` per election (each its own LeaseManager, SharedLease,
store client and pool, as each election of a worker has its own lease,
watch and thread) plus the real
:class:`~celery_leader.elections.balancer.Balancer`, driven on virtual
time:

* **the balancer's thread** is a chain of passes, one per renew interval on
  the process's clock, each an ``announce`` through the network to the
  member list (:mod:`.presence`); the acquire delay it computes is what
  each node's manager asks before it acquires (``acquire_delay``), and its
  wake event (an election found free and planned for another) makes the
  next pass due now;
* **a hand-over** is :meth:`.node.Node.hand_over`: the node steps down
  between runs, as the worker's ``WorkerElection.hand_over`` does;
* **faults** hit the process: a pause, a crash, a stop (which stops the
  balancer first, so that it withdraws, then every election) and a
  liveness failure act on every node of it; a step-down acts on one.

The deliberately broken balancer (:attr:`~.model_store.Broken.BALANCER_TAKES_EARLY`)
moves an election by taking its lease for the planned worker at once,
before the holder released it (:class:`TakesEarlyClient`): the per-election
checker must find two holders.

Not modelled: a shared pool and run table for all elections (each node has
its own; the run table's election keys are tested on real shared memory),
batched renewals (each election renews on its own; batching changes how
many calls, not what they decide).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from celery_leader.elections.balancer import BalancedElection, Balancer
from celery_leader.lease import LeaseManager
from celery_leader.simulation.network import Network, StoreClient, WatchEntry
from celery_leader.simulation.node import Node, WakeEvent
from celery_leader.simulation.presence import ModelPresence, PresenceClient
from celery_leader.simulation.scheduler import Scheduler
from celery_leader.simulation.trace import Trace
from celery_leader.stores.base import AcquireResult, Holder

if TYPE_CHECKING:
    from celery_leader.simulation.lifelines import ProcessLifelines
    from celery_leader.simulation.model_store import ModelStore

#: The members' group name in the model store.
GROUP = "sim.members"


class Seat:
    """One node as the balancer sees an election of its worker."""

    def __init__(self, node: Node) -> None:
        self.node = node

    @property
    def name(self) -> str:
        """The election's name."""
        return self.node.election_name

    @property
    def manager(self) -> LeaseManager:
        """The node's manager."""
        return self.node.manager

    @property
    def stepping_down(self) -> bool:
        """A hand-over is in progress."""
        return self.node.stepping_down

    def hand_over(self) -> bool:
        """See :meth:`.node.Node.hand_over`."""
        return self.node.hand_over()


class BalancerThread:
    """The balancer's thread: an owner of events (paused with its process) and a caller."""

    def __init__(self, name: str, rate: float) -> None:
        self.name = name
        self.rate = rate
        self.paused_until = 0.0


class Process:
    """A worker process: a node per election, its balancer, the faults that hit them all.

    With one election there is no balancer (as in a worker with one
    election): the process is its one node.
    """

    def __init__(
        self,
        *,
        nodename: str,
        rate: float,
        sched: Scheduler,
        network: Network,
        trace: Trace,
        presence: ModelPresence | None = None,
        interval: float = 1.0,
        ttl: float = 3.0,
        timeout: float = 0.5,
        local_now: Callable[[], float] | None = None,
        after_pass: Callable[[], None] | None = None,
        lifelines: ProcessLifelines | None = None,
    ) -> None:
        self.nodename = nodename
        #: Its lifeline and monitor with their threads (:mod:`.lifelines`), or None.
        self.lifelines = lifelines
        self.shutting_down = False
        self.nodes: list[Node] = []
        self._sched = sched
        self._network = network
        self._trace = trace
        self._interval = interval
        self._after_pass = after_pass
        self.thread = BalancerThread(f"{nodename}/balancer", rate)
        self.balancer: Balancer | None = None
        if presence is not None:
            self.balancer = Balancer(
                self,
                PresenceClient(network, self.thread, presence, timeout),
                GROUP,
                interval=interval,
                ttl=ttl,
                clock=local_now or (lambda: sched.now),
                event_factory=lambda: WakeEvent(self._woken),
            )
        self._stopped = False
        self._in_pass = False
        self._woken_in_pass = False
        self._gen = 0
        self._pause_pending = 0.0

    # -- what the balancer reads (BalancedWorker) -----------------------------------

    @property
    def elections(self) -> Mapping[str | None, BalancedElection]:
        """Every election of the process."""
        return {node.election_name: Seat(node) for node in self.nodes}

    def is_live(self) -> bool:
        """Fit to lead: the nodes share one liveness (one main process)."""
        return all(node.alive and self._sched.now >= node.unfit_until for node in self.nodes)

    def acquire_delay(self, election: str) -> Callable[[], float] | None:
        """What *election*'s manager asks before it acquires (None without a balancer)."""
        if self.balancer is None:
            return None
        balancer = self.balancer
        return lambda: balancer.acquire_delay(election)

    def planned(self, election: str) -> str | None:
        """The worker this process's balancer plans for *election*."""
        return None if self.balancer is None else self.balancer.planned(election)

    # -- the balancer's thread ----------------------------------------------------

    def start(self, at: float) -> None:
        """Start every node at *at*, and the balancer's first pass (before it: no plan)."""
        if self.lifelines is not None:
            self.lifelines.start(at)
        for node in self.nodes:
            node.on_exit = self._node_exited
            node.start(at)
        if self.balancer is not None:
            self._schedule(at)

    def _schedule(self, at: float) -> None:
        self._gen += 1
        gen = self._gen
        self._sched.at(at, lambda: self._pass(gen), self.thread)

    def _woken(self) -> None:
        if self._stopped:
            return
        if self._in_pass:
            self._woken_in_pass = True
        else:
            self._schedule(self._sched.now)

    def _pass(self, gen: int) -> None:
        balancer = self.balancer
        if gen != self._gen or self._stopped or balancer is None:
            return
        self._in_pass = True
        self._woken_in_pass = False
        try:
            balancer.run_pass()
        finally:
            self._in_pass = False
        if self._pause_pending:
            self.thread.paused_until = max(
                self.thread.paused_until, self._sched.now + self._pause_pending
            )
            self._pause_pending = 0.0
        if self._after_pass is not None:
            self._after_pass()
        if self._stopped:
            return
        delay = 0.0 if self._woken_in_pass else self._interval / self.thread.rate
        self._schedule(self._sched.now + delay + 0.001)

    # -- faults of the whole process ---------------------------------------------

    def pause(self, duration: float) -> None:
        """Every thread of the process stops for *duration* (see :meth:`.node.Node.pause`)."""
        for node in self.nodes:
            node.pause(duration)
        if self.lifelines is not None:
            self.lifelines.pause(duration)
        if self.balancer is None:
            return
        if self._network.holds_up_others(self.thread):
            self._pause_pending = max(self._pause_pending, duration)
            return
        self.thread.paused_until = max(self.thread.paused_until, self._sched.now + duration)

    def unfit(self, duration: float) -> None:
        """The liveness check fails for *duration*."""
        for node in self.nodes:
            node.unfit_until = self._sched.now + duration

    def stop(self, *, release: bool) -> None:
        """A warm shutdown: the balancer withdraws, then every election stops."""
        self.shutting_down = True
        self._stopped = True
        if self.balancer is not None:
            self._trace.add(self._sched.now, self.nodename, "balancer stops, withdraws")
            self.balancer.stop()
        for node in self.nodes:
            node.request_stop(release=release)

    def crash(self) -> None:
        """SIGKILL: every thread is gone at once; its announcement lapses by itself."""
        self._stopped = True
        if self.lifelines is not None:
            self.lifelines.crash()
        for node in self.nodes:
            node.request_crash()

    def _node_exited(self) -> None:
        """A node's thread ended by a stop: after the last, the worker closes its lifelines."""
        if self.lifelines is not None and not self.alive:
            self.lifelines.stop()

    def cut(self, until: float) -> None:
        """A partition from the store until real time *until*: every thread's messages lost."""
        threads: list[object] = [*self.nodes, self.thread]
        if self.lifelines is not None:
            threads += self.lifelines.threads
        for thread in threads:
            self._network.cut(thread, until)

    @property
    def alive(self) -> bool:
        """Some thread of it still runs (a stop waits for a node inside a call)."""
        return any(node.alive for node in self.nodes)


class TakesEarlyClient(StoreClient):
    """The broken balancer's move: the planned worker takes the lease at once, held or not."""

    def __init__(
        self,
        network: Network,
        node: Node,
        watches: list[WatchEntry],
        store: ModelStore,
        process: Process,
    ) -> None:
        super().__init__(network, node, watches, store)
        self._model = store
        self._process = process
        self._election = node.election_name

    def acquire(self, name: str, holder: Holder, ttl: float, min_token: int = 0) -> AcquireResult:
        """Take over when the plan names this worker; otherwise acquire as usual."""
        process = self._process
        if process.planned(self._election) == process.nodename:
            return self._model.take_early(name, holder, ttl)
        return super().acquire(name, holder, ttl, min_token)
