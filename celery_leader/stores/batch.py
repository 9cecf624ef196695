"""Renewals of one process's leases, coalesced into one store call (a store with ``renew_many``).

A worker in many elections renews each lease on its own thread. With a
renew grid (:class:`~celery_leader.lease.LeaseManager`'s ``renew_grid``)
those renewals fall due at the same moments; :class:`RenewBatch` gathers the
ones that arrive within a short window and sends them as one
:meth:`~celery_leader.stores.base.BatchRenew.renew_many` call, so the store
sees one round trip per renew interval however many leases the worker holds.

Guarantees: each renewal gets the answer its own ``renew`` would have got
(the script checks each lease on its own); a failed call fails every
renewal in it, as a failed ``renew`` would. A renewal waits at most the
window before it is sent; the lease manager's deadline on the call still
bounds the whole wait.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from celery_leader.exceptions import StoreError
from celery_leader.stores.base import BatchRenew, LeaseStore

#: How long the first renewal of a batch waits for others (seconds).
DEFAULT_WINDOW = 0.02
#: A backstop: a renewal left without an answer this long fails (the lease manager's own
#: deadline on the call is far shorter; this only keeps a thread from waiting forever).
GIVE_UP_AFTER = 60.0


@dataclass
class _Renewal:
    name: str
    lease_id: str
    ttl: float
    done: threading.Event = field(default_factory=threading.Event)
    answer: bool = False
    error: BaseException | None = None


class RenewBatch:
    """Gathers renewals for one ``renew_many`` call; see the module docstring."""

    def __init__(self, store: BatchRenew, window: float = DEFAULT_WINDOW) -> None:
        self.store = store
        self.window = window
        self._lock = threading.Lock()
        self._pending: list[_Renewal] = []

    def renew(self, name: str, lease_id: str, ttl: float) -> bool:
        """Renew one lease as part of the next batch; its own answer."""
        renewal = _Renewal(name, lease_id, ttl)
        with self._lock:
            self._pending.append(renewal)
            sends = len(self._pending) == 1  # the first one sends the batch
        if sends:
            batch: list[_Renewal] = []
            try:
                time.sleep(max(0.0, self.window))
            finally:
                # Whatever happens to this thread, the batch is taken and answered:
                # a batch left pending would stop every later renewal.
                with self._lock:
                    batch, self._pending = self._pending, []
                self._send(batch)
        if not renewal.done.wait(GIVE_UP_AFTER):
            raise StoreError(f"renew {name}: no answer from the batch in {GIVE_UP_AFTER:g} s")
        if renewal.error is not None:
            raise renewal.error
        return renewal.answer

    def _send(self, batch: list[_Renewal]) -> None:
        by_ttl: dict[float, list[_Renewal]] = {}
        for renewal in batch:
            by_ttl.setdefault(renewal.ttl, []).append(renewal)
        for ttl, group in by_ttl.items():
            try:
                answers = self.store.renew_many([(r.name, r.lease_id) for r in group], ttl)
                if len(answers) != len(group):
                    raise StoreError(  # noqa: TRY301 - one path for every failure of the call
                        f"renew: {len(answers)} answers for {len(group)} leases"
                    )
                for renewal, answer in zip(group, answers, strict=True):
                    renewal.answer = bool(answer)
            except BaseException as exc:  # noqa: BLE001 - handed to every caller, raised there
                for renewal in group:
                    renewal.error = exc
            finally:
                for renewal in group:
                    renewal.done.set()

    def view(self, store: LeaseStore) -> LeaseStore:
        """*store* with its renewals sent through this batch (every other call unchanged)."""
        return _Batched(store, self)


class _Batched:
    """One election's store, renewing through a :class:`RenewBatch`.

    Every other call goes to the store by ``__getattr__``; check optional
    protocols (``Presence``, ``TokenHistory``) on the store, not on a view:
    from Python 3.12 ``isinstance`` against a runtime protocol does not see
    attributes that ``__getattr__`` provides.
    """

    def __init__(self, store: LeaseStore, batch: RenewBatch) -> None:
        self._store = store
        self._batch = batch

    def renew(self, name: str, lease_id: str, ttl: float) -> bool:
        return self._batch.renew(name, lease_id, ttl)

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._store, attribute)
