"""A model of the PostgreSQL lease store: the Redis model's decisions on a row, and its faults.

What the real store does (:mod:`celery_leader.stores.postgres`): one row per
election, expiry on the server's clock, an acquire in one statement (a
server-side function) that applies :mod:`celery_leader.stores.rules`
exactly as the Redis script does, renew and release as compare-and-set
updates, a release announced with ``NOTIFY``. So the decisions are those
of :class:`~.model_store.ModelStore` (the lease record is the row's lease
columns; the meta record is its ``lease_end_us`` and ``incarnation``; the
counter is the sequence). What differs is what can happen to the data, and
what the epoch is:

* **Epoch** (the row's ``incarnation``): the cluster's system identifier,
  its timeline and the server's start time. Every restart changes the start
  time, so every restart changes it, also one that lost nothing
  (:meth:`~.model_store.ModelStore.restart_keeping_data`, the usual restart
  of a durable server). When the start time is all that changed, the next
  holder holds off only until one ttl after the server started
  (:meth:`PostgresModel.restarted_since`; nothing once that passed): a
  holder whose term such a restart lost wrote it before the server stopped.
  Another system identifier or timeline holds it off one ttl from its
  acquire.
* **Older data** comes back two ways, both changing the epoch:
  :meth:`PostgresModel.restore` (a file-system snapshot or a backup started
  as the server: a new start time, the same timeline, as crash recovery
  keeps it: the bounded hold-off of a restart) and
  :meth:`PostgresModel.promote_standby` (an asynchronous
  standby that missed the last commits promoted: a new timeline, and a
  server started at another time). The sequence is restored with the data
  it belongs to, so tokens rest on the server's clock after either, by the
  same rule as Redis: ``max(last + 1, server time in us, min + 1)``.
* **Empty data** (:meth:`PostgresModel.restart_empty`): a new cluster
  (``initdb``, the database recreated): another system identifier, no row,
  a new sequence (which starts at 1: the same tokens as a missing counter).
* **No eviction**: a row is never removed behind the store's back, except
  by hand (:meth:`PostgresModel.delete_by_hand`): the row deleted (the next
  acquire finds no incarnation recorded) or its lease cleared (the next
  acquire finds the recorded lease end still ahead). Both hold off.

Assumptions: the store's sessions commit synchronously (as the store sets
them), so a crash that keeps the data loses none of the store's writes; its
clock may step back, only in runs that lose no data (the token rule's
assumption). Not modelled: a dump loaded into the same running server (the
store's docstring names it as not told apart).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import ClassVar

from celery_leader.simulation.model_store import Broken, Data, Log, ModelStore
from celery_leader.stores.base import Capability
from celery_leader.stores.postgres import PostgresLeaseStore


class PostgresModel(ModelStore):
    """The Redis model's decisions, under PostgreSQL's incarnation and faults."""

    name: ClassVar[str] = "postgres"
    capabilities: ClassVar[frozenset[Capability]] = PostgresLeaseStore.capabilities
    ttl_range: ClassVar[tuple[float | None, float | None]] = PostgresLeaseStore.ttl_range
    breaks: ClassVar[frozenset[Broken]] = frozenset(
        ModelStore.breaks - {Broken.SNAPSHOT_KEEPS_EPOCH} | {Broken.POSTGRES_NO_START_TIME}
    )

    def __init__(
        self,
        clock: Callable[[], float],
        *,
        broken: Broken | None = None,
        keep_history: bool = False,
        log: Log | None = None,
    ) -> None:
        super().__init__(clock, broken=broken, keep_history=keep_history, log=log)
        #: System identifier, timeline, server start (a count of starts).
        self.system_id, self.timeline, self.started = 1, 1, 1
        #: When the server last started, on the store's clock.
        self.started_at = self._clock()
        self._epochs: dict[tuple[int, ...], int] = {}
        #: Epoch -> (system identifier, timeline): what a restart keeps.
        self._identity: dict[int, tuple[int, int]] = {}
        self._new_incarnation()

    def _new_incarnation(self) -> None:
        """The epoch the store reads now: a number per distinct incarnation it can tell apart."""
        seen: tuple[int, ...] = (self.system_id, self.timeline, self.started)
        if self.broken is Broken.POSTGRES_NO_START_TIME:
            seen = seen[:2]
        self.epoch = self._epochs.setdefault(seen, len(self._epochs) + 1)
        self._identity[self.epoch] = (self.system_id, self.timeline)
        self.started_at = self._clock()

    def restarted_since(self, recorded: int | None) -> float | None:
        """The start time, when the epoch *recorded* differs from this one only in it."""
        if recorded is None or recorded == self.epoch:
            return None
        if self._identity.get(recorded) != self._identity[self.epoch]:
            return None
        return self.started_at

    def incarnation(self) -> str:
        """As the store records it: system identifier, timeline, start."""
        return f"incarnation {self.system_id}:{self.timeline}:{self.started}"

    # -- faults -------------------------------------------------------------------

    def restart_keeping_data(self) -> None:
        """A restart (clean, or a crash with every commit on disk): a new start time."""
        self.started += 1
        self._new_incarnation()

    def restart_empty(self) -> None:
        """A new cluster (``initdb``): another system identifier, no row, a new sequence."""
        self.system_id += 1
        self.timeline = 1
        self.started += 1
        self._new_incarnation()
        self._set(Data())

    def restore(self, as_of: float) -> float:
        """A file-system snapshot (or backup) of *as_of* started as the server.

        Crash recovery keeps the timeline; the start time is new. Returns
        the time of the data. The lease keeps its absolute expiry (a column).
        """
        taken, data = self._snapshot(as_of)
        self.started += 1
        self._new_incarnation()
        self._set(data)
        return taken

    def promote_standby(self, as_of: float) -> float:
        """An asynchronous standby whose last replayed commit is of *as_of* is promoted.

        A new timeline, and the standby's own start time. Returns the time of the data.
        """
        taken, data = self._snapshot(as_of)
        self.timeline += 1
        self.started += 1
        self._new_incarnation()
        self._set(data)
        return taken

    def delete_by_hand(self, *, whole_row: bool) -> bool:
        """An operator deletes the election's row, or clears its lease; False if no lease.

        The row deleted: the next acquire inserts it again without an
        incarnation ("no record": hold off). The lease cleared (``lease_id``
        set to NULL): the recorded end stays, and is still ahead while the
        lease would have lived (hold off). The sequence is not touched.
        """
        if self.data.lease is None:
            return False
        if whole_row:
            self._set(replace(self.data, lease=None, meta=None))
        else:
            self._set(replace(self.data, lease=None))
        return True
