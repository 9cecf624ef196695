"""Which faults a run suffers: drawn once per seed, before the run starts.

Each seed draws a *profile*: which fault kinds are on (each kind on in about
half of the seeds, so that calm runs and storms both occur, and combinations
of every kind do), how the network behaves, and a list of timed faults:

* network: message delay (usual, and slow beyond the store timeout), loss of
  requests and of replies, duplicated requests, requests held back until
  after their client gave up (all in :class:`~.network.NetworkProfile`);
* store: the faults on the store's :class:`Menu` (:data:`MENUS`), only
  those that exist for it. Redis: pauses (requests queue until it resumes),
  restarts with empty data (a new epoch), restarts from an older snapshot
  (a new epoch), eviction of the lease key alone. Sentinel: those, and
  failovers to a replica that lags by a part of a second. PostgreSQL:
  pauses, restarts keeping the data, a new cluster, a snapshot started,
  an asynchronous standby promoted, the lease deleted by hand. etcd:
  pauses, leader changes, restarts keeping the data, a new cluster,
  snapshots restored under the same cluster id and into a new one. Every
  store's clock may step back (only in runs without data loss: the token
  rule assumes the clock does not go back past a token granted before data
  is lost);
* nodes: clock rate drift within the bound and any offset, process pauses
  (shorter and longer than a ttl), step-downs, ``stop()`` with and without
  release, crashes (SIGKILL; both followed by a restart of the process
  later), liveness failures (the NOT_LIVE path), and release guards that
  say the term's work still runs (no release);
* work (:class:`~.pool.WorkProfile`): how often leaders start runs, how long
  runs last (some for several ttls), and pool children stopped in the
  middle of writing their run-table slot;
* with lifelines (:mod:`.lifelines`), drawn after all of the above (so the
  rest of a seed's plan is what it is without them): crashes, pauses,
  partitions of the leader's process, and admin kills of its lifeline
  connection (its holder told, or not), each aimed at whichever process
  holds the lease when it comes.

The assumptions the checker relies on are kept: the store honours its ttl,
it notices whenever other data comes to lie under the lease (unless a broken
store is asked for, or the gaps of a store that covers a fault only in part,
see :attr:`Menu.uncovered`), and drift stays below ``margin / ttl / 4`` (a
quarter of what the margin allows, see :data:`DRIFT_SHARE`). A Redis seed
draws what it drew before the other stores existed.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from celery_leader.lease.timing import LeaseTiming
from celery_leader.simulation.network import NetworkProfile
from celery_leader.simulation.pool import WorkProfile

#: The share of the margin that clock drift may use over one ttl.
DRIFT_SHARE = 0.25
#: Each fault kind is on in this share of the seeds.
KIND_ON = 0.5
#: The share of nodes whose release guard always confirms the work stopped.
GUARD_OK = 0.9
#: The share of stops that release (the others leave the lease to expire).
STOP_RELEASES = 0.7


class Kind(enum.Enum):
    """A timed fault. Which store faults a store has is its :class:`Menu`."""

    STORE_PAUSE = "store pause"
    STORE_RESTART = "store restart (empty)"
    STORE_RESTORE = "store restart (from a snapshot)"
    EVICT = "lease key evicted"
    NODE_PAUSE = "node pause"
    STEP_DOWN = "step-down"
    STOP = "stop"
    CRASH = "crash"
    UNFIT = "liveness fails"
    STORE_CLOCK_BACK = "store clock steps back"
    #: A restart that loses nothing (PostgreSQL, etcd: durable servers).
    STORE_RESTART_KEEPING = "store restart (keeping its data)"
    #: Sentinel: a replica that lags by a part of a second is promoted.
    FAILOVER = "failover to a lagging replica"
    #: PostgreSQL: an asynchronous standby that missed the last commits is promoted.
    STANDBY_PROMOTED = "standby promoted"
    #: PostgreSQL: an operator deletes the lease row, or clears its lease.
    DELETED_BY_HAND = "lease deleted by hand"
    #: etcd: a snapshot restored into a new cluster (another cluster id).
    NEW_CLUSTER = "snapshot restored into a new cluster"
    #: etcd: another member becomes leader (every lease gets its full TTL again).
    LEADER_CHANGE = "etcd leader change"
    #: With lifelines: an admin kills a process's lifeline connections at the server.
    ADMIN_KILL = "lifeline killed by an admin"
    #: A process is cut off from the store (its requests, replies and notifications lost).
    PARTITION = "partition"


#: Faults after which the store holds other data than the last written (or none): the
#: store's clock never steps back in a run with one (the token rule's assumption).
DATA_LOSS = frozenset(
    {Kind.STORE_RESTART, Kind.STORE_RESTORE, Kind.FAILOVER, Kind.STANDBY_PROMOTED, Kind.NEW_CLUSTER}
)


@dataclass(frozen=True)
class Menu:
    """The timed faults one store can suffer (besides the nodes' and the network's)."""

    #: The store's own faults, in the order a seed draws them (each on in half the seeds).
    kinds: tuple[Kind, ...]
    #: How long the store is down before it comes back with other data, or none (s).
    loss_downtime: tuple[float, float] = (0.0, 1.0)
    #: A restart begins only once the one before it ended (see :func:`_apart`).
    restarts_apart: bool = False
    #: Faults the store covers only in part (etcd: a snapshot restored under the same
    #: cluster id goes unnoticed by a process that saw no later revision). Unless the
    #: simulation is asked for the gaps, they come only in the form the store covers:
    #: see :meth:`~.model_etcd.EtcdModel.snapshot_time` and :meth:`.world.World._start_after`.
    uncovered: frozenset[Kind] = frozenset()


#: What each store can suffer. Redis: a restart without persistence, one from an older
#: snapshot, the lease key evicted. Sentinel: those of its primary, and a failover.
#: PostgreSQL (durable, never evicts): restarts keeping the data, a new cluster, a
#: snapshot started, a standby promoted, a lease deleted by hand. etcd (durable, never
#: evicts): leader changes, restarts keeping the data, a new cluster, snapshots restored
#: under the same cluster id and into a new one; it is down for more than a second before
#: it comes back with other data (its clock reads whole seconds, see :mod:`.model_etcd`).
MENUS: dict[str, Menu] = {
    "redis": Menu((Kind.STORE_PAUSE, Kind.STORE_RESTART, Kind.STORE_RESTORE, Kind.EVICT)),
    "sentinel": Menu(
        (Kind.STORE_PAUSE, Kind.STORE_RESTART, Kind.STORE_RESTORE, Kind.EVICT, Kind.FAILOVER)
    ),
    "postgres": Menu(
        (
            Kind.STORE_PAUSE,
            Kind.STORE_RESTART_KEEPING,
            Kind.STORE_RESTART,
            Kind.STORE_RESTORE,
            Kind.STANDBY_PROMOTED,
            Kind.DELETED_BY_HAND,
        )
    ),
    "etcd": Menu(
        (
            Kind.STORE_PAUSE,
            Kind.LEADER_CHANGE,
            Kind.STORE_RESTART_KEEPING,
            Kind.STORE_RESTART,
            Kind.STORE_RESTORE,
            Kind.NEW_CLUSTER,
        ),
        loss_downtime=(1.0, 2.0),
        restarts_apart=True,
        uncovered=frozenset({Kind.STORE_RESTORE}),
    ),
}

#: Faults that take the store down for their duration (then it comes back, see :mod:`.world`).
RESTARTS = DATA_LOSS | {Kind.STORE_RESTART_KEEPING}


def _apart(faults: list[Fault]) -> list[Fault]:
    """*faults* with each restart moved after the end of the one before it.

    The world brings the store up at the end of each restart, even while
    another one that began meanwhile is not over: the store is up between
    them, for less than that one's downtime. With etcd's whole-second clock,
    data must not go back within a second of an acquisition; apart, every
    restart that loses data keeps the store down for its whole downtime.
    """
    moved: list[Fault] = []
    free_at = 0.0
    for fault in sorted(faults, key=lambda fault: fault.at):
        if fault.kind in RESTARTS:
            if fault.at < free_at:
                fault = replace(fault, at=free_at + 0.001)  # noqa: PLW2901 - the moved fault
            free_at = fault.at + fault.duration
        moved.append(fault)
    return moved


@dataclass(frozen=True)
class Fault:
    """One timed fault. Unused fields stay at their defaults."""

    at: float
    kind: Kind
    #: The node slot it hits (node faults).
    slot: int = 0
    #: How long it lasts: a pause, a restart's downtime, a liveness failure.
    duration: float = 0.0
    #: STORE_RESTORE: how old the snapshot is (s). STOP/CRASH: restart after (s).
    #: STORE_CLOCK_BACK: how far the store's clock steps back (s). PARTITION: after how
    #: long the server's keepalive drops the process's lifeline (s; 0: it keeps it).
    age: float = 0.0
    release: bool = True
    #: A node fault aimed at the process that holds the lease when it comes (the
    #: slot's when none does); else at the slot's process.
    leader: bool = False
    #: ADMIN_KILL: the holder never hears of it (its confirmations go unanswered).
    silent: bool = False


@dataclass(frozen=True)
class NodeSetup:
    """One node slot's clock and habits."""

    rate: float
    offset: float
    start: float
    release_guard_ok: bool


@dataclass(frozen=True)
class Plan:
    """Everything a seed decides before its run."""

    duration: float
    network: NetworkProfile
    nodes: list[NodeSetup]
    faults: list[Fault] = field(default_factory=list)
    work: WorkProfile = field(default_factory=WorkProfile)

    def describe(self) -> str:
        """One line: what this seed does."""
        kinds: dict[str, int] = {}
        for fault in self.faults:
            kind = fault.kind.value + (" of the leader" if fault.leader else "")
            kinds[kind] = kinds.get(kind, 0) + 1
        parts = [f"{len(self.nodes)} nodes, {self.duration:.0f} s"]
        parts += [f"{count} x {kind}" for kind, count in kinds.items()]
        net = self.network
        if net.slow:
            parts.append(f"slow {net.slow:.0%}")
        if net.loss_request or net.loss_reply:
            parts.append(f"loss {net.loss_request:.0%}/{net.loss_reply:.0%}")
        if net.duplicate:
            parts.append(f"dup {net.duplicate:.0%}")
        if net.late:
            parts.append(f"late {net.late:.0%}")
        if self.work.stall:
            parts.append(f"stalled writes {self.work.stall:.0%}")
        if self.work.die_mid_write:
            parts.append(f"children killed mid-write {self.work.die_mid_write:.0%}")
        return ", ".join(parts)


def _store_faults(
    kind: Kind,
    rng: random.Random,
    times: Callable[[int], list[float]],
    ttl: float,
    menu: Menu,
) -> list[Fault]:
    """The faults of *kind* in a seed where that kind is on."""
    if kind is Kind.STORE_PAUSE:
        faults = [Fault(t, kind, duration=rng.uniform(0.05, ttl * 1.5)) for t in times(2)]
    elif kind is Kind.STORE_RESTART:
        faults = [Fault(t, kind, duration=rng.uniform(*menu.loss_downtime)) for t in times(2)]
    elif kind in (Kind.STORE_RESTORE, Kind.NEW_CLUSTER):
        faults = [
            Fault(t, kind, duration=rng.uniform(*menu.loss_downtime), age=rng.uniform(0, ttl * 2))
            for t in times(2)
        ]
    elif kind in (Kind.EVICT, Kind.DELETED_BY_HAND):
        faults = [Fault(t, kind) for t in times(3)]
    elif kind is Kind.STORE_RESTART_KEEPING:
        faults = [Fault(t, kind, duration=rng.uniform(0.0, 1.0)) for t in times(2)]
    elif kind is Kind.FAILOVER:
        # Down until the sentinels agree (shorter or longer than a ttl); the replica lags
        # by a part of a second.
        faults = [
            Fault(t, kind, duration=rng.uniform(0.0, ttl * 2), age=rng.uniform(0.0, 1.0))
            for t in times(2)
        ]
    elif kind is Kind.STANDBY_PROMOTED:
        # Down until the standby is promoted; it lags by up to a ttl.
        faults = [
            Fault(t, kind, duration=rng.uniform(0.0, ttl * 2), age=rng.uniform(0.0, ttl))
            for t in times(2)
        ]
    elif kind is Kind.LEADER_CHANGE:
        # Requests wait while the members elect (a pause), then every lease is renewed.
        faults = [Fault(t, kind, duration=rng.uniform(0.05, 1.0)) for t in times(3)]
    else:
        raise ValueError(f"{kind} is not a store fault")
    return faults


#: With lifelines, the share of seeds whose leader crashes (the fast path's main case).
LEADER_CRASH_ON = 0.7
#: With lifelines: the share of admin kills whose news the holder never gets, of
#: partitions after which the server's keepalive drops the lifeline, of partitions aimed
#: at the leader (the rest hit a slot's process), and of short leader pauses.
SILENT_KILL = 0.5
KEEPALIVE_DROPS = 0.5
PARTITION_OF_LEADER = 0.7
SHORT_PAUSE = 0.5
#: With lifelines, the shares of slow, lost and late messages are this much of what the seed drew.
LIFELINE_TROUBLE_SHARE = 0.1


def _lifeline_faults(
    rng: random.Random, times: Callable[[int], list[float]], ttl: float, count: int
) -> list[Fault]:
    """The faults aimed at the leader's lifeline (each kind on in a share of the seeds).

    Crashes (the server drops the lifeline at once); admin kills of its
    connection, the holder told or not; partitions of its process, after
    which the server's keepalive drops the lifeline or not; pauses (SIGSTOP:
    the lifeline is kept), short and longer than a ttl.
    """
    faults: list[Fault] = []
    if rng.random() < LEADER_CRASH_ON:
        faults += [
            Fault(
                t, Kind.CRASH, slot=rng.randrange(count), age=rng.uniform(0.1, ttl * 2), leader=True
            )
            for t in times(2)
        ]
    if rng.random() < KIND_ON:
        faults += [
            Fault(
                t,
                Kind.ADMIN_KILL,
                slot=rng.randrange(count),
                leader=True,
                silent=rng.random() < SILENT_KILL,
            )
            for t in times(3)
        ]
    if rng.random() < KIND_ON:
        for t in times(2):
            cut = rng.uniform(0.05, ttl * 2)
            dropped = rng.uniform(0.0, cut) if rng.random() < KEEPALIVE_DROPS else 0.0
            faults.append(
                Fault(
                    t,
                    Kind.PARTITION,
                    slot=rng.randrange(count),
                    duration=cut,
                    age=dropped,
                    leader=rng.random() < PARTITION_OF_LEADER,
                )
            )
    if rng.random() < KIND_ON:
        for t in times(2):
            short = rng.random() < SHORT_PAUSE
            pause = rng.uniform(0.05, 0.5) if short else rng.uniform(ttl, ttl * 2)
            faults.append(
                Fault(t, Kind.NODE_PAUSE, slot=rng.randrange(count), duration=pause, leader=True)
            )
    return faults


def draw(
    rng: random.Random,
    timing: LeaseTiming,
    *,
    store: str = "redis",
    nodes: tuple[int, int] = (3, 5),
    duration: tuple[float, float] = (30.0, 45.0),
    lifelines: bool = False,
) -> Plan:
    """Draw one seed's plan from *rng*, with the faults *store* can suffer (see :data:`MENUS`).

    With *lifelines*, the faults that end lifelines too (:func:`_lifeline_faults`).
    """
    menu = MENUS[store]
    ttl = timing.ttl
    length = rng.uniform(*duration)
    count = rng.randint(*nodes)

    def on() -> bool:
        return rng.random() < KIND_ON

    def times(most: int) -> list[float]:
        # Faults fall in the run, leaving its first and last seconds calm.
        return sorted(rng.uniform(1.0, length - 1.0) for _ in range(rng.randint(1, most)))

    drift = timing.margin / ttl * DRIFT_SHARE
    setups = [
        NodeSetup(
            rate=1.0 + rng.uniform(-drift, drift),
            offset=rng.uniform(0.0, 10_000.0),
            start=rng.uniform(0.0, 0.5),
            release_guard_ok=rng.random() < GUARD_OK,
        )
        for _ in range(count)
    ]
    op = timing.op_timeout
    network = NetworkProfile(
        min_delay=0.0002,
        max_delay=rng.choice((0.002, 0.01, 0.05)),
        slow=rng.uniform(0.0, 0.1) if on() else 0.0,
        slow_max=op * 2.5,
        loss_request=rng.uniform(0.0, 0.05) if on() else 0.0,
        loss_reply=rng.uniform(0.0, 0.05) if on() else 0.0,
        duplicate=rng.uniform(0.0, 0.05) if on() else 0.0,
        dup_max=ttl,
        late=rng.uniform(0.0, 0.05) if on() else 0.0,
        late_max=ttl * 1.5,
    )
    if lifelines:
        # A confirmation that is lost, or slower than CONFIRM_TIMEOUT, ends a lifeline: with
        # lost and slow messages as common as without lifelines, lifelines would hardly stay up and
        # the fast path would go unexercised. Scaled after the draw, so the rest of the plan
        # draws the same.
        share = LIFELINE_TROUBLE_SHARE
        network = replace(
            network,
            slow=network.slow * share,
            loss_request=network.loss_request * share,
            loss_reply=network.loss_reply * share,
            late=network.late * share,
        )
    faults: list[Fault] = []
    for kind in menu.kinds:
        if on():
            faults += _store_faults(kind, rng, times, ttl, menu)
    if on():
        faults += [
            Fault(
                t,
                Kind.NODE_PAUSE,
                slot=rng.randrange(count),
                duration=rng.uniform(0.05, ttl * 0.5) if on() else rng.uniform(ttl, ttl * 3),
            )
            for t in times(4)
        ]
    if on():
        faults += [Fault(t, Kind.STEP_DOWN, slot=rng.randrange(count)) for t in times(2)]
    if on():
        faults += [
            Fault(
                t,
                Kind.STOP,
                slot=rng.randrange(count),
                release=rng.random() < STOP_RELEASES,
                age=rng.uniform(0.1, ttl * 2),
            )
            for t in times(2)
        ]
    if on():
        faults += [
            Fault(t, Kind.CRASH, slot=rng.randrange(count), age=rng.uniform(0.1, ttl * 2))
            for t in times(2)
        ]
    if on():
        faults += [
            Fault(t, Kind.UNFIT, slot=rng.randrange(count), duration=rng.uniform(0.1, ttl))
            for t in times(2)
        ]
    # Drawn last, so that what a seed drew before these existed stays the same.
    loses_data = any(f.kind in DATA_LOSS for f in faults)
    if on() and not loses_data:
        faults += [
            Fault(t, Kind.STORE_CLOCK_BACK, age=rng.uniform(0.001, ttl * 3)) for t in times(3)
        ]
    work = WorkProfile(
        arrival=rng.uniform(0.2, 1.5),
        long_max=ttl * 2,
        stall=rng.uniform(0.02, 0.2) if on() else 0.0,
        stall_max=ttl * 2,
    )
    if on():  # drawn after the rest: earlier seeds keep what they drew
        work = replace(work, die_mid_write=rng.uniform(0.02, 0.2))
    if lifelines:
        faults += _lifeline_faults(rng, times, ttl, count)
    if menu.restarts_apart:
        faults = _apart(faults)
    faults.sort(key=lambda fault: fault.at)
    return Plan(duration=length, network=network, nodes=setups, faults=faults, work=work)
