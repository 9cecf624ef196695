"""A model of the etcd lease store: expiry on the server, whole seconds, revisions, witnesses.

What the real store does (:mod:`celery_leader.stores.etcd`, one election):

* **Data**: ``lease/<name>`` (the holder's record, attached to an etcd lease
  of the term), ``term/<name>`` (the last token and the cluster it was
  granted on, with the revision that wrote it) and ``end/<name>`` (the
  earliest end of the last term: the acquire's ``Date`` reading plus the
  ttl; 0 after a release). The cluster's revision counts every write of
  every election (one counter for the cluster, :class:`EtcdCluster`).
* **Expiry** is the server's: an etcd lease lasts its TTL, the ttl rounded
  up to whole seconds and never below etcd's minimum (:data:`MIN_TTL`), so
  never shorter than the ttl, counted by the leader from the grant or the
  last keep-alive (on real time here: the leader's monotonic clock, which
  the store clock's steps back do not move). At its end the key is deleted
  (a revision of its own), which the watch reports like a release; etcd's
  lessor only ever deletes later than that, never earlier.
* **acquire** (one atomic step here; the store's look, grant and
  transaction are made atomic by its compare on the term record's
  revision): refused while another's key exists, with ``retry_in`` the
  whole seconds left plus one; otherwise ``max(last + 1, clock, min + 1)``
  with the clock the ``Date`` header, which reads whole seconds, taken at
  the end of its second; holds off one ttl when there is no term record, a
  term record of another cluster, a term record written at or below a
  revision this process saw the data go back to (its witness, below), or a
  key gone before its recorded end. Its own key again (a lost reply) is
  kept alive and keeps its remaining hold-off.
* **renew** keeps the term's etcd lease alive while the key is still the
  caller's (no write: the revision stays); **release** deletes the key and
  records end 0 (one write), and the watch reports it.
* **The witness** (:class:`Witness`, one per worker process, as the store's
  ``_Witness`` is): the highest revision the process saw in any reply, and
  the revision it saw the data go back to. A reply with a lower revision to
  a call sent after the highest was seen (or from another cluster) means
  the data was replaced: every term record written up to that revision may
  be older than a term that was granted and forgotten.

Faults, and what they do here:

* a restart keeping the data (:meth:`EtcdModel.restart_keeping_data`) and a
  leader change (:meth:`EtcdModel.leader_change`) change nothing of the
  data (Raft persists it) and need no hold-off; both give every lease its
  full TTL again from then (etcd's lessor promotes the leases on a new
  leader): leases only last longer;
* a snapshot restored keeping the cluster id (:meth:`EtcdModel.restore`):
  the data and the revision of the snapshot (its leases with a full TTL
  again); noticed only by processes whose witness saw a higher revision
  before. A process that saw none acquires without holding off: one
  started after the restore (**the store's documented gap**: its docstring
  advises restarting the workers one ttl after etcd), and also a running
  one whose last reply came before the lost writes (say, it released the
  lease and has not called since), which the docstring's "noticed by every
  running worker" does not name. The snapshot restored is one taken
  between two terms (:meth:`EtcdModel.snapshot_time`), the case the witness
  is for. The default fault mix keeps to what the store covers: such a
  snapshot only when every running process saw a later revision, and no
  process starts from the restore until one ttl after etcd is back
  (:attr:`.faults.Menu.uncovered`, ``--with-gaps`` drops both);
* a snapshot restored into a new cluster (:meth:`EtcdModel.restore_new_cluster`)
  and a new empty cluster (:meth:`EtcdModel.restart_empty`): another cluster
  id, so every term record is another cluster's: always a hold-off.

Assumptions (the store's docstring): the members' clocks agree (one
``Date`` clock here, which may step back, only in runs that lose no data);
data goes back only more than a second after the last acquisition (the
clock reads whole seconds: within one, a token after the loss could equal
one before it). Not modelled: ``--bump-revision``; the etcd leases a failed
transaction revokes; the members' list (balancing), which is the
simulation's own model of presence.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

from celery_leader.simulation.model_store import WORKER_BREAKS, Broken, LeaseModel, Log
from celery_leader.stores import rules
from celery_leader.stores.base import AcquireResult, Capability, Holder, LeaseRecord
from celery_leader.stores.etcd import EtcdLeaseStore

if TYPE_CHECKING:
    from celery_leader.simulation.network import Caller, Network

#: etcd's shortest lease TTL: 1.5 x its default election timeout (1 s), rounded up.
MIN_TTL = 2
#: What a ``Date`` reading may stand for beyond itself (it reads whole seconds), in us.
DATE_STEP_US = 999_999


@dataclass(frozen=True)
class KeyLease:
    """``lease/<name>``, and the etcd lease it is attached to (its TTL and its end)."""

    lease_id: str
    nodename: str
    token: int
    acquired_at: float
    """The acquire's ``Date`` reading (s)."""
    hold_until_us: int
    ttl: int
    """The etcd lease's TTL, whole seconds."""
    expires_at: float
    """When the etcd lease runs out, on real time (the leader's monotonic clock)."""


@dataclass(frozen=True)
class TermRecord:
    """``term/<name>``: the last token, the cluster it was granted on, the revision of the write."""

    token: int
    cluster: int
    mod_revision: int


@dataclass(frozen=True)
class EtcdData:
    """One election's keys (the revision is the cluster's, see :class:`EtcdCluster`)."""

    lease: KeyLease | None = None
    term: TermRecord | None = None
    end_us: int = 0
    """``end/<name>``: the earliest end of the last term (0: released, or never written)."""


class EtcdCluster:
    """What the elections' models share: the cluster id and the revision (with its history)."""

    def __init__(self, clock: Callable[[], float], *, keep_history: bool) -> None:
        self._clock = clock
        self.cluster_id = 1
        self.revision = 1
        self._history: list[tuple[float, int]] | None = [(0.0, 1)] if keep_history else None
        #: While a call is applied: the witness of the calling process and when it sent it.
        self.caller: tuple[Witness, float] | None = None
        #: Every process's witness (of processes that ended too).
        self.witnesses: list[Witness] = []
        self._replaced_at: float | None = None

    def write(self) -> int:
        """One more revision (a transaction that changed keys); returns it."""
        self.revision += 1
        if self._history is not None:
            self._history.append((self._clock(), self.revision))
        return self.revision

    def revision_at(self, time: float) -> int:
        """The revision at real time *time*."""
        assert self._history is not None, "restores need keep_history=True"
        times = [when for when, _ in self._history]
        return self._history[max(0, bisect.bisect_right(times, time) - 1)][1]

    def seen_by_all(self) -> int:
        """The highest revision every running process has seen (0: one saw none)."""
        return min((w.highest for w in self.witnesses if w.alive()), default=0)

    def _set_revision(self, revision: int) -> None:
        self.revision = revision
        if self._history is not None:
            self._history.append((self._clock(), revision))

    def replace_data(self, as_of: float | None, *, new_cluster: bool) -> None:
        """The data was replaced now: by the snapshot of *as_of* (None: by nothing).

        With *new_cluster*, in a new cluster (another id). Every election's
        model calls it; it acts once per instant.
        """
        now = self._clock()
        if self._replaced_at == now:
            return
        self._replaced_at = now
        self._set_revision(1 if as_of is None else self.revision_at(as_of))
        if new_cluster:
            self.cluster_id += 1


class Witness:
    """One worker process's ``_Witness``: what it saw of the cluster's revision.

    :meth:`call` is how the process's store calls go: the reply's header
    (cluster id, revision) is seen when the reply arrives, with the time the
    call was sent; an acquire also sees its own first look, at the store.
    """

    def __init__(
        self, cluster: EtcdCluster, process: str, alive: Callable[[], bool], log: Log | None
    ) -> None:
        self._cluster = cluster
        self._process = process
        #: Whether its process still runs.
        self.alive = alive
        self._log = log
        self.cluster_id: int | None = None
        self.highest = 0
        #: When the last reply was seen (real time; the process's monotonic clock).
        self.highest_at = -1.0
        #: The revision this process saw the data go back to (0: never).
        self.replaced_up_to = 0

    def see(self, cluster_id: int, revision: int, sent_at: float, now: float) -> None:
        """A reply with *cluster_id* and *revision*, to a call sent at *sent_at*, seen at *now*."""
        other = self.cluster_id is not None and cluster_id != self.cluster_id
        back = revision < self.highest and sent_at > self.highest_at
        if other or back:
            if self._log is not None:
                self._log(
                    "%s saw the revision go from %d to %d%s: holds off its next terms",
                    (self._process, self.highest, revision, " on another cluster" if other else ""),
                )
            self.replaced_up_to = max(self.replaced_up_to, revision)
            self.highest = revision
        elif revision >= self.highest:
            self.highest = revision
        self.highest_at = now
        self.cluster_id = cluster_id

    def call(
        self, network: Network, caller: Caller, fn: Callable[[], Any], timeout: float, what: str
    ) -> Any:
        """Send *fn* through *network* for *caller*; see the reply's header if one comes."""
        sent = network.sched.now
        cluster = self._cluster

        def at_store() -> tuple[Any, int, int]:
            cluster.caller = (self, sent)
            try:
                value = fn()
            finally:
                cluster.caller = None
            return value, cluster.cluster_id, cluster.revision

        value, cluster_id, revision = network.call(caller, at_store, timeout, what)
        self.see(cluster_id, revision, sent, network.sched.now)
        return value


class EtcdModel(LeaseModel[EtcdData]):
    """The etcd store's state machine for one election; see the module docstring."""

    name: ClassVar[str] = "etcd"
    #: Not a whole number of seconds: the etcd lease (3 s) outlasts the ttl (2.5 s).
    ttl: ClassVar[float] = 2.5
    capabilities: ClassVar[frozenset[Capability]] = EtcdLeaseStore.capabilities
    ttl_range: ClassVar[tuple[float | None, float | None]] = EtcdLeaseStore.ttl_range
    breaks: ClassVar[frozenset[Broken]] = WORKER_BREAKS | {
        Broken.NO_HOLD_OFF,
        Broken.ETCD_NO_WITNESS,
        Broken.ETCD_TTL_ROUNDED_DOWN,
    }

    def __init__(
        self,
        clock: Callable[[], float],
        cluster: EtcdCluster | None = None,
        *,
        broken: Broken | None = None,
        keep_history: bool = False,
        log: Log | None = None,
    ) -> None:
        super().__init__(clock, EtcdData(), broken=broken, keep_history=keep_history, log=log)
        self.cluster = EtcdCluster(clock, keep_history=keep_history) if cluster is None else cluster
        #: The members are down (a restart): no lease runs out until they are back.
        self.down = False

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
        """One model per election, all in one cluster (one revision, one cluster id)."""
        cluster = EtcdCluster(clock, keep_history=keep_history)
        return {
            name: cls(clock, cluster, broken=broken, keep_history=keep_history, log=logs[name])
            for name in names
        }

    def incarnation(self) -> str:
        """The cluster id and the revision."""
        return f"cluster {self.cluster.cluster_id}, revision {self.cluster.revision}"

    def process_witness(self, process: str, alive: Callable[[], bool]) -> Witness:
        """A new worker process's witness (it has seen nothing yet)."""
        witness = Witness(self.cluster, process, alive, self._log)
        self.cluster.witnesses.append(witness)
        return witness

    # -- time ---------------------------------------------------------------------

    def _date_us(self) -> int:
        """The ``Date`` header: the store's clock in whole seconds, in microseconds."""
        return math.floor(self._clock()) * 1_000_000

    def _lease_ttl(self, ttl: float) -> int:
        """The etcd lease's TTL for a lease of *ttl* seconds."""
        if self.broken is Broken.ETCD_TTL_ROUNDED_DOWN:
            return max(1, math.floor(ttl))
        return max(MIN_TTL, math.ceil(ttl - 1e-9))

    def _arm(self, lease: KeyLease) -> None:
        if self.schedule is not None:
            self.schedule(lease.expires_at, self._expire)

    def _expire(self) -> None:
        """The lessor deletes the key whose etcd lease ran out (a write; the watch reports it)."""
        lease = self.data.lease
        if self.down or lease is None or lease.expires_at > self._real_clock():
            return
        self.cluster.write()
        self._set(replace(self.data, lease=None))
        self._say("lease of %s ran out (token %d)", self.label(lease.lease_id), lease.token)
        if self.on_release is not None:
            self.on_release()

    # -- the store protocol ---------------------------------------------------------

    def holds(self, lease_id: str) -> bool:
        """True while *lease_id*'s key exists."""
        self._expire()
        lease = self.data.lease
        return lease is not None and lease.lease_id == lease_id

    def acquire(self, name: str, holder: Holder, ttl: float, min_token: int = 0) -> AcquireResult:
        """Take the lease when no key exists, or it is ours; see the module docstring."""
        self._expire()
        cluster, real = self.cluster, self._real_clock()
        witness: Witness | None = None
        if cluster.caller is not None:
            witness, sent = cluster.caller
            witness.see(cluster.cluster_id, cluster.revision, sent, real)  # the look's reply
        now_us = self._date_us()
        latest_us = now_us + DATE_STEP_US
        ttl_us = int(ttl * 1e6)
        data = self.data
        lease = data.lease
        who = self.label(holder.lease_id, holder.nodename)
        if lease is not None and lease.lease_id != holder.lease_id:
            self._say("acquire by %s refused: held by %s", who, self.label(lease.lease_id))
            record = self._record(lease, now_us)
            return AcquireResult(acquired=False, holder=record, retry_in=record.expires_in + 1.0)
        # Our own key (the reply of an earlier acquire was lost): keep its etcd lease.
        own_hold_until = lease.hold_until_us if lease is not None else 0
        lease_ttl = lease.ttl if lease is not None else self._lease_ttl(ttl)
        term = data.term
        replaced = witness.replaced_up_to if witness is not None else 0
        if self.broken is Broken.ETCD_NO_WITNESS:
            replaced = 0
        forgot = rules.store_forgot(
            counter_missing=term is None,
            data_replaced=term is not None
            and (term.cluster != cluster.cluster_id or term.mod_revision <= replaced),
            vanished_early=rules.lease_vanished_early(lease is not None, data.end_us, latest_us),
        )
        hold_until, wait_us = rules.hold_off(
            now=now_us,
            ttl=ttl_us,
            own_hold_until=own_hold_until,
            forgot=forgot and self.broken is not Broken.NO_HOLD_OFF,
            now_latest=latest_us,
        )
        token = rules.next_token(term.token if term is not None else None, latest_us, min_token)
        revision = cluster.write()
        key = KeyLease(
            holder.lease_id,
            holder.nodename,
            token,
            now_us / 1e6,
            hold_until,
            lease_ttl,
            real + lease_ttl,
        )
        self._set(EtcdData(key, TermRecord(token, cluster.cluster_id, revision), now_us + ttl_us))
        self._arm(key)
        self._say(
            "acquire by %s granted: token %d, hold-off %.3f, revision %d",
            who,
            token,
            wait_us / 1e6,
            revision,
        )
        if self.on_grant is not None:
            self.on_grant(token, who, real)
        return AcquireResult(acquired=True, token=token, hold_off=wait_us / 1e6)

    def renew(self, name: str, lease_id: str, ttl: float) -> bool:
        """Keep the term's etcd lease alive while its key is still ours (no write)."""
        self._expire()
        lease = self.data.lease
        who = self.label(lease_id)
        if lease is None or lease.lease_id != lease_id:
            self._say("renew by %s rejected", who)
            return False
        kept = replace(lease, expires_at=self._real_clock() + lease.ttl)
        self._set(replace(self.data, lease=kept))
        self._arm(kept)
        self._say("renew by %s ok (token %d)", who, lease.token)
        return True

    def release(self, name: str, lease_id: str) -> bool:
        """Delete our key and record end 0 (one write), revoke its etcd lease; the watch tells."""
        self._expire()
        lease = self.data.lease
        who = self.label(lease_id)
        if lease is None or lease.lease_id != lease_id:
            self._say("release by %s: not its lease", who)
            return False
        self.cluster.write()
        self._set(replace(self.data, lease=None, end_us=0))
        self._say("release by %s ok (token %d)", who, lease.token)
        if self.on_release is not None:
            self.on_release()
        return True

    def read(self, name: str) -> LeaseRecord | None:
        """The key as a record, or None."""
        self._expire()
        lease = self.data.lease
        return None if lease is None else self._record(lease, self._date_us())

    def _record(self, lease: KeyLease, now_us: int) -> LeaseRecord:
        # etcd answers the time to live in whole seconds, rounded down.
        left = float(max(0, math.floor(lease.expires_at - self._real_clock())))
        return LeaseRecord(
            nodename=lease.nodename,
            hostname="sim",
            pid=0,
            token=lease.token,
            acquired_at=lease.acquired_at,
            expires_in=left,
            hold_off=max(0.0, (lease.hold_until_us - now_us) / 1e6),
        )

    # -- faults -------------------------------------------------------------------

    def _promote(self) -> None:
        """A new leader's lessor gives every lease its full TTL again, from now."""
        lease = self.data.lease
        if lease is not None:
            promoted = replace(lease, expires_at=self._real_clock() + lease.ttl)
            self._set(replace(self.data, lease=promoted))
            self._arm(promoted)

    def go_down(self) -> None:
        """The members stop: no lease runs out until they are back."""
        self.down = True

    def leader_change(self) -> None:
        """A new etcd leader: every live lease lasts its full TTL from now (never shorter)."""
        self._promote()

    def restart_keeping_data(self) -> None:
        """The members are back with all their data (Raft persists it): nothing to notice.

        The leases get their full TTL again (a new leader), nothing else changes.
        """
        self.down = False
        self._promote()

    def restore(self, as_of: float) -> float:
        """A snapshot of *as_of* restored under the same cluster id: its data and revision.

        Only witnesses that saw a higher revision notice it. Returns the
        time of the snapshot.
        """
        return self._replace(as_of, new_cluster=False)

    def snapshot_time(self, as_of: float, *, covered: bool = True) -> float:
        """The last snapshot by *as_of* taken between two terms (no key, a term record).

        The case the witness is for: restored, it lets the next acquire go
        ahead at once, while the holder of a term granted after the snapshot
        may still act. (A snapshot with a key in it keeps every acquire
        waiting for that key's full TTL, which outlasts any holder since; one
        without a term record makes the next holder hold off.)

        With *covered*, what the store's docstring covers ("noticed by every
        running worker"): a snapshot between terms only when every running
        process saw a later revision; otherwise the last snapshot by *as_of*
        that needs no witness (a key in it, or no term record). Without, any
        snapshot between terms (else *as_of*).
        """
        assert self._history is not None, "restores need keep_history=True"
        history = self._history
        seen = self.cluster.seen_by_all()
        fallback: float | None = None
        for index in range(len(history) - 1, -1, -1):
            taken, data = history[index]
            ended = history[index + 1][0] if index + 1 < len(history) else math.inf
            if taken > as_of or ended <= taken:
                continue
            at = as_of if ended > as_of else (taken + ended) / 2
            if data.lease is None and data.term is not None:  # between two terms
                if not covered or self.cluster.revision_at(at) < seen:
                    return at
            elif fallback is None:
                fallback = at  # needs no witness
        return fallback if covered and fallback is not None else as_of

    def restore_new_cluster(self, as_of: float) -> float:
        """A snapshot of *as_of* restored into a new cluster (another id: always noticed)."""
        return self._replace(as_of, new_cluster=True)

    def restart_empty(self) -> None:
        """A new, empty cluster (the data directories lost): another id, revision 1."""
        self.down = False
        self.cluster.replace_data(None, new_cluster=True)
        self.epoch = self.cluster.cluster_id
        self._set(EtcdData())

    def _replace(self, as_of: float, *, new_cluster: bool) -> float:
        self.down = False
        taken, data = self._snapshot(as_of)
        self.cluster.replace_data(as_of, new_cluster=new_cluster)
        self.epoch = self.cluster.cluster_id
        self._set(data)
        self._promote()
        return taken
