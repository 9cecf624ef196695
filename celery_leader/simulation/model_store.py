"""A model of the Redis lease store: the same decisions, as a pure state machine.

This module also holds what every store model shares (:class:`LeaseModel`:
the trace labels, the grant and release hooks, the store's clock and its
steps back, the history of data that restores pick from) and the broken
variants of all of them (:class:`Broken`). The other stores' models build
on it: :mod:`.model_sentinel`, :mod:`.model_postgres`, :mod:`.model_etcd`
(:mod:`.models` names them for ``--store``).

What is modelled (one election; see :mod:`celery_leader.stores.redis`, its
Lua scripts and its safety statement):

* **Data**: the lease record (lease id, token, expiry and hold-off end on the
  store's clock), the token counter, and the meta record (the epoch that
  the last acquire recorded, and the lease end recorded last). Data is
  immutable; every change makes a new :class:`Data`, so a snapshot is a
  reference and a restore is an assignment.
* **acquire**: refused (with ``retry_in``) while a live lease of someone else
  exists; otherwise the token is ``max(last + 1, store clock in us,
  min_token + 1)`` and the new holder holds off one ttl (both by
  :mod:`celery_leader.stores.rules`, the rules the Lua is tested against) when the epoch
  changed since the last recorded term, when the meta record is missing
  (first use, or forgotten), when the lease vanished before its recorded
  end (eviction), or always when the store cannot read its epoch (an ACL
  user without ``INFO``). Re-acquiring one's own live lease keeps its
  remaining hold-off.
* **renew** and **release**: compare-and-set on the lease id; renew records
  the new lease end, release records 0 and announces the release to
  watchers. Neither records the epoch: a late one applied to restored data
  must not make that data look current.
* **take_over** (with lifelines, :mod:`.lifelines`): compare-and-set on the
  live lease's token and lifeline key, as the follower read them; on a match
  the lease is granted as an acquire of a free lease would be (the token and
  hold-off rules apply), and the new term keeps what is left of the dead
  term's hold-off; otherwise it answers as ``acquire``. Every lease record
  carries its holder's lifeline key.
* **Epoch**: the incarnation of the data (Redis: the server's run id, its
  replication id and the count of commands that replace data in place). It
  is not part of the data, so no copy of the data brings an old one back.
  It changes whenever other data comes to lie under the lease, whether or
  not the server restarts: :meth:`ModelStore.restore` is a restart from an
  older snapshot and an in-process load of one alike (``SWAPDB``, a flush
  and restore, ``DEBUG RELOAD``, a failover back). A restart that keeps
  every write changes it too (:meth:`ModelStore.restart_keeping_data`): the
  store cannot tell that restart from one that lost writes.

The store's clock is the simulation's real time, the reference against
which the nodes' clocks drift, until it steps back
(:meth:`ModelStore.step_clock_back`: an NTP correction, a VM restored on
another host); from then on it runs that much behind. Expiry is exact on
that clock: a lease granted or renewed at ``t`` ends at ``t + ttl``, which is
what "the store honours its ttl" means (a step back only makes leases last
longer in real time). Tokens then rest on the counter: the clock alone would
hand out a token below an earlier one.

Deliberately broken variants (:class:`Broken`) exist to show that the checker
finds what they break; they are never the default. Each model lists those it
implements (:attr:`LeaseModel.breaks`). One of them breaks the worker's kill
layers rather than a store (:mod:`.pool` reads it), so every model takes it.
"""

from __future__ import annotations

import abc
import bisect
import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from celery_leader.stores import rules
from celery_leader.stores.base import (
    AcquireResult,
    Capability,
    Holder,
    LeaseRecord,
    NullWatch,
    Watch,
)
from celery_leader.stores.redis import RedisLeaseStore

if TYPE_CHECKING:
    from celery_leader.simulation.network import CallWitness


class Broken(str, enum.Enum):
    """A deliberately wrong store or kill layer, for showing that the checker catches it."""

    #: Older data comes back under the same epoch, as a run id alone allowed (a
    #: failover back, ``DEBUG RELOAD``, ``SWAPDB``): the restore goes unnoticed.
    SNAPSHOT_KEEPS_EPOCH = "snapshot-keeps-epoch"
    #: The store never asks a new holder to hold off, even after it forgot.
    NO_HOLD_OFF = "no-hold-off"
    #: Tokens come from the counter alone (no store clock): a lost counter restarts them.
    COUNTER_ONLY_TOKENS = "counter-only-tokens"
    #: Tokens come from the store's clock alone (no counter): a clock that steps
    #: back hands out a token below an earlier one.
    CLOCK_ONLY_TOKENS = "clock-only-tokens"
    #: The run table before the fix: a slot a child left torn when it was killed
    #: mid-write reads torn after every later write of its pool index, and the
    #: kill layers skip it, so the next terminate runs there outlive their term.
    TORN_SLOT_HIDES_RUNS = "torn-slot-hides-runs"
    #: With several elections: a balancer that moves an election by taking its lease for
    #: the planned worker at once (:meth:`ModelStore.take_early`), before the old holder
    #: released it, instead of waiting for the holder's hand-over.
    BALANCER_TAKES_EARLY = "balancer-takes-early"
    #: Sentinel: a failover to a replica that missed the last writes keeps the epoch
    #: (as if the store compared the data alone, not the run id and replication id).
    SENTINEL_FAILOVER_KEEPS_EPOCH = "sentinel-failover-keeps-epoch"
    #: PostgreSQL: the incarnation without the server's start time (system identifier and
    #: timeline only): a file-system snapshot restored and started, which keeps the
    #: timeline, goes unnoticed.
    POSTGRES_NO_START_TIME = "postgres-no-start-time"
    #: etcd: no witness of the revision (a process does not remember the highest revision
    #: it saw): a snapshot restored under the same cluster id goes unnoticed by everyone.
    ETCD_NO_WITNESS = "etcd-no-witness"
    #: etcd: the lease's TTL rounded down to whole seconds instead of up: the server ends
    #: a lease before the holder's reckoning of it does.
    ETCD_TTL_ROUNDED_DOWN = "etcd-ttl-rounded-down"
    #: With lifelines: a follower takes over as soon as a reading showed the holder's
    #: lifeline gone (no TAKEOVER_WAIT), while the holder's work may still run for GRACE.
    TAKEOVER_WITHOUT_WAIT = "takeover-without-wait"
    #: With lifelines: the holder does not bound its validity by its lifeline (only by the
    #: lease), so a holder that does not hear its lifeline end (paused, cut off, crashed
    #: with its work view published) may act after a follower took over.
    LIFELINE_UNBOUNDED = "lifeline-unbounded"


#: Broken variants of the worker, not of a store: every model takes them.
WORKER_BREAKS = frozenset({Broken.TORN_SLOT_HIDES_RUNS})
#: Broken variants of the worker's lifeline rule: only with lifelines (every model that has them).
LIFELINE_BREAKS = frozenset({Broken.TAKEOVER_WITHOUT_WAIT, Broken.LIFELINE_UNBOUNDED})


@dataclass(frozen=True)
class Lease:
    """The lease record (Redis: the JSON value of the lease key, with its PX expiry)."""

    lease_id: str
    nodename: str
    token: int
    acquired_at: float
    expires_at: float
    hold_until: float
    #: The key of the holder's lifeline the term is tied to (empty: none).
    lifeline: str = ""


@dataclass(frozen=True)
class Meta:
    """The meta hash: who recorded the last term, and the end recorded for its lease."""

    epoch: int | None
    """None when a renew or release created the hash without a run id (HSET of one field)."""
    lease_end: float


@dataclass(frozen=True)
class Data:
    """Everything a snapshot holds (the epoch is not data)."""

    lease: Lease | None = None
    counter: int | None = None
    meta: Meta | None = None


#: Called on every grant: (token, lease id, store time).
GrantHook = Callable[[int, str, float], None]
#: Runs an action at a real time: how a model that acts by itself (etcd's expiry) is
#: driven. Set by the simulation, on the store process (held back while it is paused).
Schedule = Callable[[float, Callable[[], None]], None]
#: Where a model writes its trace lines: (message, arguments).
Log = Callable[[str, tuple[object, ...]], None]
#: Called on every take-over that matched: the key of the lifeline taken over.
TakeOverHook = Callable[[str], None]

D = TypeVar("D")


class LeaseModel(abc.ABC, Generic[D]):
    """What every store model shares: bookkeeping, the store's clock, the data's history.

    A model holds one election's lease (the simulation makes one per
    election; the faults of the store hit them all). Its data is immutable:
    every change makes a new value of type *D*, so a snapshot is a reference
    and a restore an assignment. Subclasses decide the store protocol
    (acquire, renew, release, read) and what the store's faults do to it.
    """

    url = "sim://model"
    #: What the modelled store claims (the real store class's claims).
    capabilities: ClassVar[frozenset[Capability]]
    ttl_range: ClassVar[tuple[float | None, float | None]]
    #: The ``--store`` name of the modelled store.
    name: ClassVar[str]
    #: The election's ttl the simulation uses with this store.
    ttl: ClassVar[float] = 3.0
    #: The broken variants this model implements (see :class:`Broken`).
    breaks: ClassVar[frozenset[Broken]]
    #: The model has lifelines and takes over a dead holder's term (:meth:`take_over`).
    has_lifelines: ClassVar[bool] = False

    def __init__(
        self,
        clock: Callable[[], float],
        empty: D,
        *,
        broken: Broken | None = None,
        keep_history: bool = False,
        log: Log | None = None,
    ) -> None:
        self._real_clock = clock
        #: How far the store's clock runs behind real time (its steps back so far).
        self.behind = 0.0
        self.broken = broken
        self.data = empty
        #: The incarnation of the data, as a number (each model says what changes it).
        self.epoch = 1
        #: (time, data) after every change, for restores from a snapshot.
        self._history: list[tuple[float, D]] | None = [(0.0, empty)] if keep_history else None
        self._log = log
        #: Set by the simulation: told about every grant (for the token check).
        self.on_grant: GrantHook | None = None
        #: Set by the simulation: told about every release (to notify watchers).
        self.on_release: Callable[[], None] | None = None
        #: Set by the simulation with lifelines: told about every take-over that matched.
        self.on_take_over: TakeOverHook | None = None
        #: Set by the simulation for models that act by themselves (see :data:`Schedule`).
        self.schedule: Schedule | None = None
        self._labels: dict[str, str] = {}
        self._label_counts: dict[str, int] = {}

    @classmethod
    @abc.abstractmethod
    def for_elections(
        cls,
        names: Sequence[str],
        clock: Callable[[], float],
        *,
        broken: Broken | None,
        keep_history: bool,
        logs: Mapping[str, Log],
    ) -> dict[str, LeaseModel[Any]]:
        """One model per election, all on one store (they may share the store's own state)."""

    # -- bookkeeping --------------------------------------------------------------

    def label(self, lease_id: str, nodename: str = "?") -> str:
        """A short, deterministic name for a lease id (the ids themselves are random)."""
        label = self._labels.get(lease_id)
        if label is None:
            count = self._label_counts.get(nodename, 0) + 1
            self._label_counts[nodename] = count
            label = self._labels[lease_id] = f"{nodename}/{count}"
        return label

    def _say(self, message: str, *args: object) -> None:
        if self._log is not None:
            self._log(message, args)

    def _clock(self) -> float:
        return self._real_clock() - self.behind

    def _set(self, data: D) -> None:
        self.data = data
        if self._history is not None:
            # Snapshots are taken and chosen on real time.
            self._history.append((self._real_clock(), data))

    def _snapshot(self, as_of: float) -> tuple[float, D]:
        """The data of real time *as_of* (the latest change before it): (its time, data)."""
        assert self._history is not None, "restores need keep_history=True"
        times = [time for time, _ in self._history]
        index = max(0, bisect.bisect_right(times, as_of) - 1)
        return self._history[index]

    def incarnation(self) -> str:
        """The epoch as the trace shows it (Redis: ``epoch N``)."""
        return f"epoch {self.epoch}"

    def process_witness(self, process: str, alive: Callable[[], bool]) -> CallWitness | None:
        """What worker *process* keeps across its calls to this store (etcd: revisions seen).

        *alive* tells whether the process still runs. None when the process
        keeps nothing (its calls go straight through).
        """
        return None

    # -- the store protocol (what LeaseManager calls) ------------------------------

    @abc.abstractmethod
    def acquire(self, name: str, holder: Holder, ttl: float, min_token: int = 0) -> AcquireResult:
        """Take the lease when free or ours."""

    @abc.abstractmethod
    def renew(self, name: str, lease_id: str, ttl: float) -> bool:
        """Extend our live lease."""

    @abc.abstractmethod
    def release(self, name: str, lease_id: str) -> bool:
        """End our live lease and announce it."""

    @abc.abstractmethod
    def read(self, name: str) -> LeaseRecord | None:
        """The live lease as a record, or None."""

    @abc.abstractmethod
    def holds(self, lease_id: str) -> bool:
        """True while *lease_id* holds the live lease."""

    def take_over(
        self, name: str, holder: Holder, ttl: float, dead: LeaseRecord, min_token: int = 0
    ) -> AcquireResult:
        """The lifeline fast path (:class:`~celery_leader.stores.base.Lifelines`); not here."""
        raise NotImplementedError(f"the {self.name} model has no lifelines")

    def get_state(self, name: str) -> dict[str, str]:
        """Not modelled (the lease manager never uses it): always empty."""
        return {}

    def set_state(self, name: str, lease_id: str, key: str, value: str) -> bool:
        """Not modelled: accepted while *lease_id* holds the lease, and forgotten."""
        return self.holds(lease_id)

    def watch(self, name: str, callback: Callable[[], None]) -> Watch:
        """Notifications are routed per node by the simulation; this store alone has none."""
        return NullWatch()

    def close(self) -> None:
        """Nothing to close."""

    # -- faults every store has ------------------------------------------------------

    def go_down(self) -> None:
        """The store process stops (a restart begins): nothing happens in it until it is back."""

    @abc.abstractmethod
    def restart_empty(self) -> None:
        """The store comes back with no data at all (each model says how that happens)."""

    @abc.abstractmethod
    def restart_keeping_data(self) -> None:
        """The store comes back with every write it acknowledged."""

    @abc.abstractmethod
    def restore(self, as_of: float) -> float:
        """The store comes back with the data of real time *as_of*; returns the snapshot's time."""

    def snapshot_time(self, as_of: float, *, covered: bool = True) -> float:
        """When the snapshot was taken that a restore of a save made by *as_of* brings back.

        The save of *as_of* itself, unless a model chooses an earlier one
        (etcd: one taken between two terms). With *covered*, only a snapshot
        whose restore the store guarantees to notice.
        """
        return as_of

    def step_clock_back(self, seconds: float) -> None:
        """The store's clock steps back by *seconds* (and runs on from there).

        Live leases last *seconds* longer in real time (their expiry is on
        this clock). The token rule keeps tokens rising with the counter; it
        assumes the clock does not go back past a token granted before data
        is lost (see :func:`celery_leader.stores.rules.next_token`), so the
        simulation never loses data in a run whose clock steps back.
        """
        self.behind += seconds


class ModelStore(LeaseModel[Data]):
    """The Redis store's state machine, driven at the times the network delivers requests."""

    name: ClassVar[str] = "redis"
    # It models the Redis store, so it claims what that store claims.
    capabilities: ClassVar[frozenset[Capability]] = RedisLeaseStore.capabilities
    ttl_range: ClassVar[tuple[float | None, float | None]] = RedisLeaseStore.ttl_range
    breaks: ClassVar[frozenset[Broken]] = (
        WORKER_BREAKS
        | LIFELINE_BREAKS
        | {
            Broken.SNAPSHOT_KEEPS_EPOCH,
            Broken.NO_HOLD_OFF,
            Broken.COUNTER_ONLY_TOKENS,
            Broken.CLOCK_ONLY_TOKENS,
            Broken.BALANCER_TAKES_EARLY,
        }
    )
    has_lifelines: ClassVar[bool] = True

    def __init__(
        self,
        clock: Callable[[], float],
        *,
        broken: Broken | None = None,
        keep_history: bool = False,
        reads_epoch: bool = True,
        log: Log | None = None,
    ) -> None:
        super().__init__(clock, Data(), broken=broken, keep_history=keep_history, log=log)
        #: False models an ACL user refused INFO: the epoch is unknown to acquire.
        self.reads_epoch = reads_epoch

    @classmethod
    def for_elections(
        cls,
        names: Sequence[str],
        clock: Callable[[], float],
        *,
        broken: Broken | None,
        keep_history: bool,
        logs: Mapping[str, Log],
    ) -> dict[str, LeaseModel[Any]]:
        """One model per election's lease: one server holds them all, so faults hit all."""
        return {
            name: cls(clock, broken=broken, keep_history=keep_history, log=logs[name])
            for name in names
        }

    def _live(self, now: float) -> Lease | None:
        # A key with a PX expiry is gone once its time has come (on the store's clock).
        lease = self.data.lease
        return lease if lease is not None and lease.expires_at > now else None

    def holds(self, lease_id: str) -> bool:
        """True while *lease_id* holds the live lease."""
        current = self._live(self._clock())
        return current is not None and current.lease_id == lease_id

    # -- the store protocol (what LeaseManager calls) ------------------------------

    def acquire(self, name: str, holder: Holder, ttl: float, min_token: int = 0) -> AcquireResult:
        """ACQUIRE_LUA: take the lease when free or ours; see the module docstring."""
        now = self._clock()
        current = self._live(now)
        who = self.label(holder.lease_id, holder.nodename)
        if current is not None and current.lease_id != holder.lease_id:
            self._say("acquire by %s refused: held by %s", who, self.label(current.lease_id))
            return AcquireResult(
                acquired=False,
                holder=self._record(current, now),
                retry_in=current.expires_at - now,
            )
        own_hold_until = current.hold_until if current is not None else 0.0
        return self._grant(
            holder,
            ttl,
            min_token=min_token,
            now=now,
            present=current is not None,
            own_hold_until=own_hold_until,
            who=who,
        )

    def _grant(
        self,
        holder: Holder,
        ttl: float,
        *,
        min_token: int,
        now: float,
        present: bool,
        own_hold_until: float,
        who: str,
    ) -> AcquireResult:
        """Grant the lease to *holder* (the acquire script's second half)."""
        data = self.data
        meta = data.meta
        restarted_at = self.restarted_since(meta.epoch) if meta is not None else None
        forgot = rules.store_forgot(
            cannot_tell=not self.reads_epoch,
            # No meta record: first use, or forgotten. Another epoch: other data (unless
            # it is the same data's server, restarted).
            data_replaced=meta is None or (meta.epoch != self.epoch and restarted_at is None),
            vanished_early=rules.lease_vanished_early(
                present, meta.lease_end if meta is not None else 0.0, now
            ),
        )
        holds_off = self.broken is not Broken.NO_HOLD_OFF
        hold_until, hold_off = rules.hold_off(
            now=now,
            ttl=ttl,
            own_hold_until=own_hold_until,
            forgot=forgot and holds_off,
            restarted_at=restarted_at if holds_off else None,
        )
        now_us = int(now * 1_000_000)
        if self.broken is Broken.COUNTER_ONLY_TOKENS:
            token = max((data.counter or 0) + 1, min_token + 1)
        elif self.broken is Broken.CLOCK_ONLY_TOKENS:
            token = now_us
        else:
            token = rules.next_token(data.counter, now_us, min_token)
        lease = Lease(
            holder.lease_id, holder.nodename, token, now, now + ttl, hold_until, holder.lifeline
        )
        self._set(Data(lease, token, Meta(self.epoch, now + ttl)))
        self._say("acquire by %s granted: token %d, hold-off %.3f", who, token, hold_off)
        if self.on_grant is not None:
            self.on_grant(token, who, self._real_clock())
        return AcquireResult(
            acquired=True,
            token=token,
            hold_off=hold_off,
            restarted_ago=None if restarted_at is None else now - restarted_at,
        )

    def restarted_since(self, recorded: int | None) -> float | None:
        """When the server started (store clock), if only a restart changed the epoch.

        *recorded* is the epoch the last term recorded; None when more than a
        restart sets it apart from the current one. The Redis store tells no
        restart apart from other data (its data may be gone with the
        process): always None. See :func:`rules.hold_off`.
        """
        return None

    def take_over(
        self, name: str, holder: Holder, ttl: float, dead: LeaseRecord, min_token: int = 0
    ) -> AcquireResult:
        """Take the lease of the term *dead* (its lifeline was seen ended); see the docstring.

        Compare-and-set on the live lease's token and lifeline key: on a
        match, granted as an acquire of a free lease would be (none vanished
        early), keeping what is left of the dead term's hold-off, as a holder
        re-acquiring its own lease keeps its own; otherwise :meth:`acquire`.
        """
        now = self._clock()
        current = self._live(now)
        if (
            current is None
            or not dead.lifeline
            or (current.token, current.lifeline) != (dead.token, dead.lifeline)
        ):
            return self.acquire(name, holder, ttl, min_token)
        who = self.label(holder.lease_id, holder.nodename)
        self._say(
            "take-over by %s of %s (token %d, lifeline %s)",
            who,
            self.label(current.lease_id),
            current.token,
            current.lifeline,
        )
        if self.on_take_over is not None:
            self.on_take_over(dead.lifeline)
        # The lease is there (nothing vanished). A term taken over in its hold-off passes
        # the rest of it on: it holds off because a holder the store forgot may still act,
        # and that holder is still out there (the dead one never acted).
        return self._grant(
            holder,
            ttl,
            min_token=min_token,
            now=now,
            present=True,
            own_hold_until=current.hold_until,
            who=who,
        )

    def take_early(self, name: str, holder: Holder, ttl: float) -> AcquireResult:
        """Grant the lease to *holder* even while another holds it (no hold-off).

        Only :attr:`Broken.BALANCER_TAKES_EARLY` calls it: no store of the
        package has such an operation.
        """
        now = self._clock()
        data = self.data
        token = rules.next_token(data.counter, int(now * 1_000_000), 0)
        lease = Lease(holder.lease_id, holder.nodename, token, now, now + ttl, now)
        self._set(Data(lease, token, Meta(self.epoch, now + ttl)))
        who = self.label(holder.lease_id, holder.nodename)
        self._say("take-over by %s granted: token %d", who, token)
        if self.on_grant is not None:
            self.on_grant(token, who, self._real_clock())
        return AcquireResult(acquired=True, token=token, hold_off=0.0)

    def renew(self, name: str, lease_id: str, ttl: float) -> bool:
        """RENEW_LUA: extend our live lease and record its new end."""
        now = self._clock()
        current = self._live(now)
        who = self.label(lease_id)
        if current is None or current.lease_id != lease_id:
            self._say("renew by %s rejected", who)
            return False
        meta = self.data.meta
        self._set(
            replace(
                self.data,
                lease=replace(current, expires_at=now + ttl),
                meta=Meta(None if meta is None else meta.epoch, now + ttl),
            )
        )
        self._say("renew by %s ok (token %d)", who, current.token)
        return True

    def release(self, name: str, lease_id: str) -> bool:
        """RELEASE_LUA: delete our live lease, record end 0, announce it."""
        now = self._clock()
        current = self._live(now)
        who = self.label(lease_id)
        if current is None or current.lease_id != lease_id:
            self._say("release by %s: not its lease", who)
            return False
        meta = self.data.meta
        self._set(
            replace(self.data, lease=None, meta=Meta(None if meta is None else meta.epoch, 0.0))
        )
        self._say("release by %s ok (token %d)", who, current.token)
        if self.on_release is not None:
            self.on_release()
        return True

    def read(self, name: str) -> LeaseRecord | None:
        """The live lease as a record, or None."""
        now = self._clock()
        current = self._live(now)
        return None if current is None else self._record(current, now)

    @staticmethod
    def _record(lease: Lease, now: float) -> LeaseRecord:
        return LeaseRecord(
            nodename=lease.nodename,
            hostname="sim",
            pid=0,
            token=lease.token,
            acquired_at=lease.acquired_at,
            expires_in=lease.expires_at - now,
            hold_off=max(0.0, lease.hold_until - now),
            lifeline=lease.lifeline,
        )

    # -- faults -------------------------------------------------------------------

    def restart_empty(self) -> None:
        """A restart without persistence: all data gone, a new epoch."""
        self.epoch += 1
        self._set(Data())

    def restart_keeping_data(self) -> None:
        """A restart that kept every write (an AOF synced on every write): a new epoch.

        Nothing was lost, but the store cannot know that, so the next holder
        holds off; the lease, if still live, stays its holder's.
        """
        self.epoch += 1

    def restore(self, as_of: float) -> float:
        """Data as it was at *as_of* (or the latest snapshot before) comes back; a new epoch.

        A restart from that snapshot, or the same server loading it without a
        restart (``SWAPDB``, a flush and restore, ``DEBUG RELOAD``, a failover
        back to a node that missed later writes): the epoch changes either way.

        Returns the time of the snapshot used. The restored lease keeps its
        absolute expiry, as an RDB file does: it may be gone already on load.
        """
        taken, data = self._snapshot(as_of)
        if self.broken is not Broken.SNAPSHOT_KEEPS_EPOCH:
            self.epoch += 1
        self._set(data)
        return taken

    def evict_lease(self) -> bool:
        """The lease key alone vanishes (maxmemory eviction, an operator's DEL)."""
        if self.data.lease is None:
            return False
        self._set(replace(self.data, lease=None))
        return True
