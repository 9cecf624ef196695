"""One seed: build the world from the seed, run it, judge it.

Everything random comes from ``random.Random(seed)``: the plan (nodes and
faults), the network, each node's manager (its jitter) and each node's
work (its runs, their lengths, its children's stops). Lease ids are
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

from celery_leader.lease import LeaseEvent
from celery_leader.lease.timing import LeaseTiming
from celery_leader.simulation.checker import Checker
from celery_leader.simulation.faults import Fault, Kind, Plan, draw
from celery_leader.simulation.model_store import Broken, ModelStore
from celery_leader.simulation.network import Network, notify_watchers
from celery_leader.simulation.node import Node
from celery_leader.simulation.scheduler import Halt, Scheduler
from celery_leader.simulation.trace import Trace

#: The election's timing: the defaults for a 3 s ttl (renew every 1 s,
#: margin 0.06 s, store timeout 0.5 s).
TIMING = LeaseTiming.create(3.0)


def _rng(seed: int) -> random.Random:
    """One stream of the run's randomness (a simulation's, not a secret's)."""
    return random.Random(seed)  # noqa: S311 - reproducible by design


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
    ) -> None:
        master = _rng(seed)
        self.seed = seed
        self.plan: Plan = draw(_rng(master.getrandbits(64)), TIMING)
        self.sched = Scheduler()
        self.trace = Trace(trace_limit)
        self.store = ModelStore(
            lambda: self.sched.now,
            broken=broken,
            keep_history=any(fault.kind is Kind.STORE_RESTORE for fault in self.plan.faults),
            log=self._store_says,
        )
        self.network = Network(
            self.sched,
            self.store,
            _rng(master.getrandbits(64)),
            self.plan.network,
            self.trace,
        )
        self._node_rng = _rng(master.getrandbits(64))
        # Drawn after the others, so that their streams stay what they were.
        self._work_rng = _rng(master.getrandbits(64))
        self._pids = 100
        self.all_nodes: list[Node] = []
        #: The current incarnation of each slot (None between a stop and a restart).
        self.slots: list[Node | None] = [None] * len(self.plan.nodes)
        self._incarnations = [0] * len(self.plan.nodes)
        self.checker = Checker(self.sched, self.trace, self.all_nodes)
        self.store.on_grant = self.checker.on_grant
        self.store.on_release = self._on_release
        self.terms = 0
        if every_event:
            self.sched.after_event = self.checker.check_instant

    def _store_says(self, message: str, args: tuple[object, ...]) -> None:
        self.trace.add(self.sched.now, "store", message, *args)

    def _on_release(self) -> None:
        for node in self.slots:
            if node is not None and node.alive:
                notify_watchers(self.network, node.watches)

    def _on_elected(self, node: Node, event: LeaseEvent) -> None:
        self.terms += 1
        term = event.term
        self.checker.on_elected(node.name, term.token, term.valid_until, node.local_now())

    # -- nodes ------------------------------------------------------------------

    def _new_pid(self) -> int:
        self._pids += 1
        return self._pids

    def _start_node(self, slot: int, at: float) -> None:
        setup = self.plan.nodes[slot]
        incarnation = self._incarnations[slot]
        self._incarnations[slot] += 1
        name = f"n{slot}" + "'" * incarnation
        node = Node(
            name=name,
            slot=slot,
            rate=setup.rate,
            offset=setup.offset,
            sched=self.sched,
            network=self.network,
            timing=TIMING,
            rng=_rng(self._node_rng.getrandbits(64)),
            trace=self.trace,
            after_code=self.checker.check_instant,
            on_elected=self._on_elected,
            work=self.plan.work,
            work_rng=_rng(self._work_rng.getrandbits(64)),
            judge=self.checker,
            new_pid=self._new_pid,
            release_guard_ok=setup.release_guard_ok,
            torn_slot_hides_runs=self.store.broken is Broken.TORN_SLOT_HIDES_RUNS,
        )
        self.all_nodes.append(node)
        self.slots[slot] = node
        node.start(at)

    # -- faults -----------------------------------------------------------------

    def _schedule(self, fault: Fault) -> None:
        self.sched.at(fault.at, partial(self._fault, fault))

    def _fault(self, fault: Fault) -> None:
        kind, now, say = fault.kind, self.sched.now, self.trace.add
        if kind is Kind.STORE_PAUSE:
            self.network.pause_store(fault.duration)
            say(now, "store", "paused for %.3f s", fault.duration)
        elif kind in (Kind.STORE_RESTART, Kind.STORE_RESTORE):
            self._restart_store(fault)
        elif kind is Kind.EVICT:
            if self.store.evict_lease():
                say(now, "store", "lease key evicted")
        elif kind is Kind.STORE_CLOCK_BACK:
            # Never before the clock's origin: a clock reads time since an epoch long past.
            back = min(fault.age, now - self.store.behind)
            self.store.step_clock_back(back)
            say(
                now, "store", "clock steps back %.3f s (now %.3f s behind)", back, self.store.behind
            )
        else:
            self._node_fault(fault)

    def _restart_store(self, fault: Fault) -> None:
        now, say = self.sched.now, self.trace.add
        lost = self.network.restart_store()
        say(now, "store", "down (restart, %.3f s; %d queued requests lost)", fault.duration, lost)

        def up() -> None:
            self.network.store_down = False
            if fault.kind is Kind.STORE_RESTORE:
                taken = self.store.restore(fault.at - fault.age)  # a save before the crash
                say(
                    self.sched.now,
                    "store",
                    "up from the snapshot of %.6f, epoch %d",
                    taken,
                    self.store.epoch,
                )
            else:
                self.store.restart_empty()
                say(self.sched.now, "store", "up empty, epoch %d", self.store.epoch)
            # Every watch loses its connection and subscribes again: one call each.
            self._on_release()

        self.sched.at(now + fault.duration, up)

    def _node_fault(self, fault: Fault) -> None:
        node = self.slots[fault.slot]
        if node is None or not node.alive:
            return
        now, kind = self.sched.now, fault.kind
        if kind is Kind.NODE_PAUSE:
            node.pause(fault.duration)
            return
        if kind is Kind.UNFIT:
            node.unfit_until = now + fault.duration
            self.trace.add(now, node.name, "not live for %.3f s", fault.duration)
            return
        # The rest act on the node's thread or process: not while it is paused.
        self.sched.at(now, partial(self._node_action, node, fault), node)

    def _node_action(self, node: Node, fault: Fault) -> None:
        if not node.alive:
            return
        if fault.kind is Kind.STEP_DOWN:
            node.request_step_down()
            return
        if fault.kind is Kind.STOP:
            node.request_stop(release=fault.release)
        else:
            node.request_crash()
        self.sched.at(self.sched.now + fault.age, partial(self._restart_node, node))

    def _restart_node(self, old: Node) -> None:
        if old.alive:  # the stop is still pending (the node was inside a call)
            self.sched.at(self.sched.now + 0.1, partial(self._restart_node, old))
            return
        if self.slots[old.slot] is old:
            self._start_node(old.slot, self.sched.now)

    # -- the run ------------------------------------------------------------------

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
            if self.checker.violation is None:
                failure = f"stuck: more than {self.sched.max_events} events"
        except Exception as exc:  # noqa: BLE001 - a crash of the run is a failure of the seed
            failure = f"the run raised {type(exc).__name__}: {exc}"
            self.trace.add(self.sched.now, "sim", "%s", traceback.format_exc().rstrip())
        violation = self.checker.violation or failure
        return SeedResult(
            seed=self.seed,
            violation=violation,
            trace=self.trace.lines() if violation is not None else [],
            plan=self.plan.describe(),
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
) -> SeedResult:
    """Run one seed. With *full_trace*, the whole trace is returned even when it passed."""
    world = World(
        seed,
        broken=broken,
        trace_limit=None if full_trace else trace_limit,
        every_event=every_event,
    )
    result = world.run()
    if full_trace and result.violation is None:
        return SeedResult(
            result.seed, None, world.trace.lines(), result.plan, result.events, result.terms
        )
    return result
