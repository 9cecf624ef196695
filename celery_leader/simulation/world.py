"""One seed: build the world from the seed, run it, judge it.

Everything random comes from ``random.Random(seed)``: the plan (nodes and
faults), the network, each node's manager (its jitter) and each node's
work (its runs, their lengths, its children's stops), and with lifelines
their threads' scheduling (:mod:`.lifelines`). Lease ids are
the one thing the real manager draws itself (``uuid4``, once per term); the
run depends only on whether two are equal, and the trace names them by
order of appearance, so a seed replays exactly.
"""

from __future__ import annotations

import logging
import random
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from celery_leader.lease import LeaseEvent
from celery_leader.lease.timing import LeaseTiming
from celery_leader.simulation.checker import Checker
from celery_leader.simulation.faults import MENUS, Fault, Kind, Plan, draw
from celery_leader.simulation.lifelines import LifelineServer, ProcessLifelines
from celery_leader.simulation.model_etcd import EtcdModel
from celery_leader.simulation.model_postgres import PostgresModel
from celery_leader.simulation.model_sentinel import SentinelModel
from celery_leader.simulation.model_store import Broken, LeaseModel, Log, ModelStore
from celery_leader.simulation.models import DEFAULT, check_broken, model_of
from celery_leader.simulation.network import Network, StoreClient, WatchEntry, notify_watchers
from celery_leader.simulation.node import ELECTION, Node
from celery_leader.simulation.presence import ModelPresence
from celery_leader.simulation.process import Process, TakesEarlyClient
from celery_leader.simulation.scheduler import Halt, Scheduler
from celery_leader.simulation.trace import Trace

#: The election's timing: the defaults for a 3 s ttl (renew every 1 s,
#: margin 0.06 s, store timeout 0.5 s). A model may ask for another ttl
#: (:attr:`~.model_store.LeaseModel.ttl`: etcd's is not whole seconds).
TIMING = LeaseTiming.create(3.0)
#: How long a seed runs (real seconds, drawn in this range).
DURATION = (30.0, 45.0)
#: With lifelines: shorter runs (their threads make ten times the events per second).
LIFELINE_DURATION = (15.0, 25.0)

#: Faults after which the store comes back (after their duration) with data to say.
COMES_BACK = frozenset(
    {
        Kind.STORE_RESTART,
        Kind.STORE_RESTORE,
        Kind.STORE_RESTART_KEEPING,
        Kind.FAILOVER,
        Kind.STANDBY_PROMOTED,
        Kind.NEW_CLUSTER,
    }
)
#: Faults that bring back the data of an earlier time (the models keep their history).
RESTORES = frozenset({Kind.STORE_RESTORE, Kind.FAILOVER, Kind.STANDBY_PROMOTED, Kind.NEW_CLUSTER})

M = TypeVar("M", bound=LeaseModel[Any])


def _rng(seed: int) -> random.Random:
    """One stream of the run's randomness (a simulation's, not a secret's)."""
    return random.Random(seed)  # noqa: S311 - reproducible by design


class _StoreProcess:
    """The store's process as an owner of events: what it does by itself waits out its pauses."""

    def __init__(self, network: Network) -> None:
        self._network = network

    @property
    def paused_until(self) -> float:
        """The end of the store's pause."""
        return self._network.store_paused_until


@dataclass(frozen=True)
class SeedResult:
    """The outcome of one seed."""

    seed: int
    violation: str | None
    trace: list[str]
    plan: str
    events: int
    terms: int


class World:
    """The nodes, the store, the network and the checker of one run."""

    def __init__(
        self,
        seed: int,
        *,
        broken: Broken | None = None,
        trace_limit: int | None = 30,
        every_event: bool = False,
        elections: int = 1,
        store: str = DEFAULT,
        gaps: bool = False,
        lifelines: bool = False,
    ) -> None:
        if elections < 1:
            raise ValueError(f"elections={elections!r}: at least 1")
        model = model_of(store)
        check_broken(store, broken, lifelines=lifelines)
        #: Every process has a lifeline and a monitor, and followers take over (:mod:`.lifelines`).
        self.lifelines = lifelines
        self.broken = broken
        #: The modelled store's name (``--store``).
        self.store_name = store
        self.menu = MENUS[store]
        #: Also the faults the store does not cover (see :attr:`.faults.Menu.uncovered`).
        self.gaps = gaps
        self.timing = TIMING if model.ttl == TIMING.ttl else LeaseTiming.create(model.ttl)
        master = _rng(seed)
        self.seed = seed
        self.plan: Plan = draw(
            _rng(master.getrandbits(64)),
            self.timing,
            store=store,
            lifelines=lifelines,
            duration=LIFELINE_DURATION if lifelines else DURATION,
        )
        self.sched = Scheduler()
        self.trace = Trace(trace_limit)
        #: The elections every node competes in; with two or more, each process balances.
        self.elections = [ELECTION] if elections == 1 else [f"e{i}" for i in range(elections)]
        self.balanced = elections > 1
        keep_history = any(fault.kind in RESTORES for fault in self.plan.faults)
        logs: dict[str, Log] = {
            name: self._store_says if not self.balanced else partial(self._lease_says, name)
            for name in self.elections
        }
        #: One model per election's lease: one store holds them all, so faults hit all.
        self.stores = model.for_elections(
            self.elections,
            lambda: self.sched.now,
            broken=broken,
            keep_history=keep_history,
            logs=logs,
        )
        self.store = self.stores[self.elections[0]]
        self.presence = ModelPresence(lambda: self.sched.now - self.store.behind)
        self.network = Network(
            self.sched,
            self.store,
            _rng(master.getrandbits(64)),
            self.plan.network,
            self.trace,
        )
        store_process = self._store_process = _StoreProcess(self.network)
        for each in self.stores.values():
            each.schedule = partial(self.sched.at, owner=store_process)
        self._node_rng = _rng(master.getrandbits(64))
        # Drawn after the others, so that their streams stay what they were.
        self._work_rng = _rng(master.getrandbits(64))
        self._lifeline_rng = _rng(master.getrandbits(64)) if lifelines else None
        #: The lifelines of every process started (closed at the end of the run).
        self._process_lifelines: list[ProcessLifelines] = []
        #: The store's server's lifelines (None without lifelines).
        self.lifeline_server = LifelineServer(self._store_says) if lifelines else None
        #: Real times of every election: (time, node, token).
        self.elected: list[tuple[float, str, int]] = []
        #: Real times of every take-over the store granted.
        self.take_overs: list[float] = []
        self._pids = 100
        self.all_nodes: list[Node] = []
        #: Every node of each election, stopped and crashed ones too.
        self._nodes_of: dict[str, list[Node]] = {name: [] for name in self.elections}
        #: The current incarnation of each slot (None between a stop and a restart).
        self.slots: list[Process | None] = [None] * len(self.plan.nodes)
        self._incarnations = [0] * len(self.plan.nodes)
        #: One checker per election: each judges its election's history on its own.
        self.checkers = {
            name: Checker(
                self.sched,
                self.trace,
                self._nodes_of[name],
                label=name if self.balanced else "",
            )
            for name in self.elections
        }
        self.checker = self.checkers[self.elections[0]]
        for name, lease_model in self.stores.items():
            lease_model.on_grant = self.checkers[name].on_grant
            lease_model.on_release = partial(self._on_release, name)
            if lifelines:
                lease_model.on_take_over = partial(self._on_take_over, name)
        self.terms = 0
        if every_event:
            self.sched.after_event = self.check_all

    def _store_says(self, message: str, args: tuple[object, ...]) -> None:
        self.trace.add(self.sched.now, "store", message, *args)

    def _lease_says(self, election: str, message: str, args: tuple[object, ...]) -> None:
        self.trace.add(self.sched.now, f"store[{election}]", message, *args)

    def check_all(self) -> None:
        """Judge every election now."""
        for checker in self.checkers.values():
            checker.check_instant()

    def _on_release(self, election: str | None = None) -> None:
        """A release of *election* (None: a store restart, which every watch notices)."""
        for process in self.slots:
            if process is None:
                continue
            for node in process.nodes:
                if node.alive and election in (None, node.election_name):
                    notify_watchers(self.network, node.watches)

    def _on_take_over(self, election: str, key: str) -> None:
        """A take-over matched: the server must have dropped the lifeline taken over.

        A holder's lifeline that the server still keeps (its process paused,
        say) may not be taken over: only a reading that showed it gone lets
        a follower try.
        """
        self.take_overs.append(self.sched.now)
        server = self.lifeline_server
        if server is not None and server.keeps(key):
            self.checkers[election].fail(
                f"take-over of a term whose lifeline {key} the server still keeps"
            )

    def _on_elected(self, node: Node, event: LeaseEvent) -> None:
        self.terms += 1
        self.elected.append((self.sched.now, node.name, event.term.token))
        term = event.term
        checker = self.checkers[node.election_name]
        checker.on_elected(node.name, term.token, term.valid_until, node.local_now())

    # -- nodes ------------------------------------------------------------------

    def _new_pid(self) -> int:
        self._pids += 1
        return self._pids

    def _start_node(self, slot: int, at: float) -> None:
        setup = self.plan.nodes[slot]
        incarnation = self._incarnations[slot]
        self._incarnations[slot] += 1
        nodename = f"n{slot}" + "'" * incarnation
        lifelines = None
        if self.lifeline_server is not None:
            assert self._lifeline_rng is not None
            lifelines = ProcessLifelines(
                process=nodename,
                rate=setup.rate,
                sched=self.sched,
                network=self.network,
                server=self.lifeline_server,
                rng=_rng(self._lifeline_rng.getrandbits(64)),
                trace=self.trace,
                local_now=lambda: setup.offset + setup.rate * self.sched.now,
                models=self.stores,
                timeout=self.timing.op_timeout,
                after_step=self.check_all,
                broken=self.broken,
            )
            self._process_lifelines.append(lifelines)
        process = Process(
            nodename=nodename,
            rate=setup.rate,
            sched=self.sched,
            network=self.network,
            trace=self.trace,
            presence=self.presence if self.balanced else None,
            interval=self.timing.renew_interval,
            ttl=self.timing.ttl,
            timeout=self.timing.op_timeout,
            local_now=lambda: setup.offset + setup.rate * self.sched.now,
            after_pass=self.check_all,
            lifelines=lifelines,
        )
        # One per process, as the store's.
        witness = self.store.process_witness(nodename, lambda: process.alive)
        for election in self.elections:
            checker = self.checkers[election]
            node = Node(
                name=nodename if not self.balanced else f"{nodename}:{election}",
                slot=slot,
                rate=setup.rate,
                offset=setup.offset,
                sched=self.sched,
                network=self.network,
                timing=self.timing,
                rng=_rng(self._node_rng.getrandbits(64)),
                trace=self.trace,
                after_code=checker.check_instant,
                on_elected=self._on_elected,
                work=self.plan.work,
                work_rng=_rng(self._work_rng.getrandbits(64)),
                judge=checker,
                new_pid=self._new_pid,
                release_guard_ok=setup.release_guard_ok,
                torn_slot_hides_runs=self.store.broken is Broken.TORN_SLOT_HIDES_RUNS,
                election=election,
                client_factory=partial(self._client, election, process),
                acquire_delay=process.acquire_delay(election),
                witness=witness,
                lifeline=None if lifelines is None else lifelines.holder,
                lifelines=None if lifelines is None else lifelines.monitor,
                dies_at_once=lifelines is not None,
            )
            process.nodes.append(node)
            self.all_nodes.append(node)
            self._nodes_of[election].append(node)
        if lifelines is not None:
            lifelines.holds = lambda: any(node.manager.state().token for node in process.nodes)
        self.slots[slot] = process
        process.start(at)

    def _client(
        self, election: str, process: Process, node: Node, watches: list[WatchEntry]
    ) -> StoreClient:
        """The store client of *node*: its election's lease (the broken balancer's, if so)."""
        store = self.stores[election]
        if store.broken is Broken.BALANCER_TAKES_EARLY:
            assert isinstance(store, ModelStore), "only the Redis models can take over"
            return TakesEarlyClient(self.network, node, watches, store, process)
        return StoreClient(self.network, node, watches, store)

    def _models(self, kind: type[M]) -> list[M]:
        """Every election's model, as *kind* (the faults of a store only come to its model)."""
        models = list(self.stores.values())
        assert all(isinstance(model, kind) for model in models), (kind, self.store_name)
        return [model for model in models if isinstance(model, kind)]

    def _model(self, kind: type[M], election: str) -> M:
        """The model of *election*, as *kind*."""
        model = self.stores[election]
        assert isinstance(model, kind), (kind, self.store_name)
        return model

    def _pick(self, fault: Fault) -> str:
        """The one election a fault of one lease hits (an eviction, a step-down)."""
        return self.elections[int(fault.at * 1_000_000) % len(self.elections)]

    # -- faults -----------------------------------------------------------------

    def _schedule(self, fault: Fault) -> None:
        self.sched.at(fault.at, partial(self._fault, fault))

    def _fault(self, fault: Fault) -> None:
        kind, now, say = fault.kind, self.sched.now, self.trace.add
        if kind is Kind.STORE_PAUSE:
            self.network.pause_store(fault.duration)
            say(now, "store", "paused for %.3f s", fault.duration)
        elif kind in COMES_BACK:
            self._restart_store(fault)
        elif kind is Kind.EVICT:
            election = self._pick(fault)
            if self._model(ModelStore, election).evict_lease():
                if self.balanced:
                    say(now, "store", "lease key of %s evicted", election)
                else:
                    say(now, "store", "lease key evicted")
        elif kind is Kind.DELETED_BY_HAND:
            election = self._pick(fault)
            model = self._model(PostgresModel, election)
            # The row deleted, or its lease cleared: one or the other, by the instant's parity.
            whole_row = int(fault.at * 1_000_000) % 2 == 0
            if model.delete_by_hand(whole_row=whole_row):
                what = "row deleted" if whole_row else "lease cleared"
                where = f" of {election}" if self.balanced else ""
                say(now, "store", "lease %s by hand%s", what, where)
        elif kind is Kind.LEADER_CHANGE:
            models = self._models(EtcdModel)

            def elected() -> None:
                for model in models:
                    model.leader_change()
                say(self.sched.now, "store", "new etcd leader: every lease has its full TTL again")

            self.sched.at(now + fault.duration, elected)  # before the paused calls are applied
            self.network.pause_store(fault.duration)
            say(now, "store", "etcd leader lost: members elect for %.3f s", fault.duration)
        elif kind is Kind.STORE_CLOCK_BACK:
            # Never before the clock's origin: a clock reads time since an epoch long past.
            back = min(fault.age, now - self.store.behind)
            for store in self.stores.values():
                store.step_clock_back(back)
            say(
                now, "store", "clock steps back %.3f s (now %.3f s behind)", back, self.store.behind
            )
        else:
            self._node_fault(fault)

    def _restart_store(self, fault: Fault) -> None:
        now, say = self.sched.now, self.trace.add
        lost = self.network.restart_store()
        for store in self.stores.values():
            store.go_down()
        if self.lifeline_server is not None:
            self.lifeline_server.restart()  # every connection dies with the server
        why = "failover" if fault.kind in (Kind.FAILOVER, Kind.STANDBY_PROMOTED) else "restart"
        say(now, "store", "down (%s, %.3f s; %d queued requests lost)", why, fault.duration, lost)

        def up() -> None:
            self.network.store_down = False
            self.presence.forget()
            self._come_back(fault)
            # Every watch loses its connection and subscribes again: one call each.
            self._on_release()

        self.sched.at(now + fault.duration, up)

    def _come_back(self, fault: Fault) -> None:
        """The store is back after *fault*, with the data the fault leaves it."""
        kind, say = fault.kind, partial(self.trace.add, self.sched.now, "store")
        as_of = fault.at - fault.age  # a save before the crash; the replica's last write
        if kind is Kind.STORE_RESTORE:
            as_of = self.store.snapshot_time(as_of, covered=not self.gaps)
            for store in self.stores.values():
                taken = store.restore(as_of)
            say("up from the snapshot of %.6f, %s", taken, self.store.incarnation())
        elif kind is Kind.STORE_RESTART:
            for store in self.stores.values():
                store.restart_empty()
            say("up empty, %s", self.store.incarnation())
        elif kind is Kind.STORE_RESTART_KEEPING:
            for store in self.stores.values():
                store.restart_keeping_data()
            say("up with all its data, %s", self.store.incarnation())
        elif kind is Kind.FAILOVER:
            for sentinel in self._models(SentinelModel):
                taken = sentinel.failover(as_of)
            say("replica promoted, with the data of %.6f, %s", taken, self.store.incarnation())
        elif kind is Kind.STANDBY_PROMOTED:
            for postgres in self._models(PostgresModel):
                taken = postgres.promote_standby(as_of)
            say("standby promoted, with the data of %.6f, %s", taken, self.store.incarnation())
        else:
            assert kind is Kind.NEW_CLUSTER, kind
            as_of = self.store.snapshot_time(as_of, covered=False)  # always noticed
            for etcd in self._models(EtcdModel):
                taken = etcd.restore_new_cluster(as_of)
            say(
                "up in a new cluster from the snapshot of %.6f, %s", taken, self.store.incarnation()
            )

    def _target(self, fault: Fault) -> Process | None:
        """The process a node fault hits: the lease holder's when aimed at the leader."""
        if fault.leader:
            election = self._pick(fault)
            record = self.stores[election].read(election)
            if record is not None:
                for process in self.slots:
                    if process is not None and any(
                        node.name == record.nodename for node in process.nodes
                    ):
                        return process
        return self.slots[fault.slot]

    def _node_fault(self, fault: Fault) -> None:
        process = self._target(fault)
        if process is None or not process.alive:
            return
        now, kind = self.sched.now, fault.kind
        if kind is Kind.ADMIN_KILL:
            server = self.lifeline_server
            assert server is not None, "only with lifelines"
            # A command to the server (CLIENT KILL, pg_terminate_backend): it waits out a pause.
            self.sched.at(
                now,
                partial(self._admin_kill, server, process.nodename, fault.silent),
                owner=self._store_process,
            )
            return
        if kind is Kind.PARTITION:
            self._partition(process, fault)
            return
        if kind is Kind.NODE_PAUSE:
            process.pause(fault.duration)
            return
        if kind is Kind.UNFIT:
            process.unfit(fault.duration)
            self.trace.add(now, process.nodename, "not live for %.3f s", fault.duration)
            return
        # The rest act on the node's thread or process: not while it is paused.
        self.sched.at(now, partial(self._node_action, process, fault), process.nodes[0])

    @staticmethod
    def _admin_kill(server: LifelineServer, nodename: str, silent: bool) -> None:
        server.kill(nodename, silent=silent)

    def _partition(self, process: Process, fault: Fault) -> None:
        """*process* is cut off from the store; the server may drop its lifeline meanwhile."""
        now, server = self.sched.now, self.lifeline_server
        process.cut(now + fault.duration)
        self.trace.add(now, process.nodename, "cut off from the store for %.3f s", fault.duration)
        if server is not None and fault.age > 0:
            nodename = process.nodename
            self.sched.at(
                now + fault.age,
                lambda: server.drop_process(nodename, "the server's keepalive gave up"),
                self._store_process,
            )

    def _node_action(self, process: Process, fault: Fault) -> None:
        if not process.alive:
            return
        if fault.kind is Kind.STEP_DOWN:
            election = self._pick(fault)
            for node in process.nodes:
                if node.election_name == election:
                    node.request_step_down()
            return
        if fault.kind is Kind.STOP:
            process.stop(release=fault.release)
        else:
            process.crash()
        self.sched.at(self.sched.now + fault.age, partial(self._restart_node, process))

    def _restart_node(self, old: Process) -> None:
        if old.alive:  # the stop is still pending (a node was inside a call)
            self.sched.at(self.sched.now + 0.1, partial(self._restart_node, old))
            return
        slot = old.nodes[0].slot
        later = self._start_after()
        if later > self.sched.now:
            self.sched.at(later, partial(self._restart_node, old))
            return
        if self.slots[slot] is old:
            self._start_node(slot, self.sched.now)

    def _start_after(self) -> float:
        """When a process may start, now or later (etcd: not right after a restore).

        A process started after a snapshot was restored under the same
        cluster id does not notice it (the store's documented gap): unless
        the gaps are asked for, none starts from the restore until one ttl
        after the store is back, as the store's docstring advises. (The
        other half of what the store covers is the snapshot a restore picks:
        see :meth:`.model_etcd.EtcdModel.snapshot_time`.)
        """
        now = self.sched.now
        if self.gaps or not self.menu.uncovered:
            return now
        for fault in self.plan.faults:
            if fault.kind in self.menu.uncovered:
                end = fault.at + fault.duration + self.timing.ttl
                if fault.at <= now < end:
                    return end
        return now

    # -- the run ------------------------------------------------------------------

    def _violation(self) -> str | None:
        return next((c.violation for c in self.checkers.values() if c.violation), None)

    def run(self) -> SeedResult:
        """Run the plan to its end (or to the first violation)."""
        failure: str | None = None
        try:
            for slot, setup in enumerate(self.plan.nodes):
                self._start_node(slot, setup.start)
            for fault in self.plan.faults:
                self._schedule(fault)
            self.sched.run_until(self.plan.duration)
        except Halt:
            if self._violation() is None:
                failure = f"stuck: more than {self.sched.max_events} events"
        except Exception as exc:  # noqa: BLE001 - a crash of the run is a failure of the seed
            failure = f"the run raised {type(exc).__name__}: {exc}"
            self.trace.add(self.sched.now, "sim", "%s", traceback.format_exc().rstrip())
        finally:
            for lifelines in self._process_lifelines:
                lifelines.close()
        violation = self._violation() or failure
        return SeedResult(
            seed=self.seed,
            violation=violation,
            trace=self.trace.lines() if violation is not None else [],
            plan=self.plan.describe()
            + (f", {len(self.elections)} elections balanced" if self.balanced else "")
            + (", lifelines" if self.lifelines else ""),
            events=self.sched.events,
            terms=self.terms,
        )


@contextmanager
def quiet_loggers() -> Iterator[None]:
    """Silence the ``celery_leader`` loggers (they log every term) for the run's duration."""
    logger = logging.getLogger("celery_leader")
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(level)


def simulate(
    seed: int,
    *,
    broken: Broken | None = None,
    trace_limit: int | None = 30,
    every_event: bool = False,
    full_trace: bool = False,
    elections: int = 1,
    store: str = DEFAULT,
    gaps: bool = False,
    lifelines: bool = False,
) -> SeedResult:
    """Run one seed. With *full_trace*, the whole trace is returned even when it passed.

    With *elections* above 1, every node competes in that many elections and
    balances them (see :mod:`.process`); each election is judged on its own.
    *store* names the modelled store (see :mod:`.models`); *gaps* adds the
    faults the store does not cover (see :attr:`.faults.Menu.uncovered`).
    With *lifelines*, every process has a lifeline and followers take over
    a holder whose lifeline ended (see :mod:`.lifelines`): another run of
    the seed, with faults that end lifelines too.
    """
    world = World(
        seed,
        broken=broken,
        trace_limit=None if full_trace else trace_limit,
        every_event=every_event,
        elections=elections,
        store=store,
        gaps=gaps,
        lifelines=lifelines,
    )
    result = world.run()
    if full_trace and result.violation is None:
        return SeedResult(
            result.seed, None, world.trace.lines(), result.plan, result.events, result.terms
        )
    return result
