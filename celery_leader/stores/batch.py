"""One process's store calls, coalesced into one round trip (a store with ``call_many``).

A worker in many elections runs one lease manager per election, each on its
own thread. With a renew grid (:class:`~celery_leader.lease.LeaseManager`'s
``renew_grid``) the renewals of the leases it holds, and the attempts on the
leases it follows (when the current holder's lease would end), fall due at
the same moments of the worker's clock; :class:`CallBatch` gathers the calls
that arrive within a short window and sends them as one
:meth:`~celery_leader.stores.base.BatchCalls.call_many`, so the store sees
one round trip per grid point however many elections the worker is in.

Guarantees: each call gets the answer its own ``renew`` or ``acquire``
would have got (the store judges each lease on its own); a failed round
trip fails every call in it, as a failed single call would. A call waits
at most the window before it is sent; the lease manager's deadline on the
call still bounds the whole wait.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from celery_leader.exceptions import StoreError
from celery_leader.stores.base import AcquireRequest, AcquireResult, BatchCalls, Holder, LeaseStore

#: How long the first call of a batch waits for others (seconds).
DEFAULT_WINDOW = 0.05
#: A backstop: a call left without an answer this long fails (the lease manager's own
#: deadline on the call is far shorter; this only keeps a thread from waiting forever).
GIVE_UP_AFTER = 60.0


@dataclass
class _Call:
    """One renew (*lease_id*) or acquire (*request*) waiting for its batch."""

    ttl: float
    renewal: tuple[str, str] | None = None
    request: AcquireRequest | None = None
    done: threading.Event = field(default_factory=threading.Event)
    answer: bool | AcquireResult | None = None
    error: BaseException | None = None

    @property
    def name(self) -> str:
        if self.renewal is not None:
            return self.renewal[0]
        assert self.request is not None
        return self.request.name


class CallBatch:
    """Gathers renewals and acquires for one ``call_many``; see the module docstring."""

    def __init__(self, store: BatchCalls, window: float = DEFAULT_WINDOW) -> None:
        self.store = store
        self.window = window
        self._lock = threading.Lock()
        self._pending: list[_Call] = []

    def renew(self, name: str, lease_id: str, ttl: float) -> bool:
        """Renew one lease as part of the next batch; its own answer."""
        answer = self._join(_Call(ttl, renewal=(name, lease_id)))
        assert isinstance(answer, bool)
        return answer

    def acquire(self, name: str, holder: Holder, ttl: float, min_token: int = 0) -> AcquireResult:
        """Try to acquire one lease as part of the next batch; its own answer."""
        answer = self._join(_Call(ttl, request=AcquireRequest(name, holder, min_token)))
        assert isinstance(answer, AcquireResult)
        return answer

    def _join(self, call: _Call) -> bool | AcquireResult | None:
        with self._lock:
            self._pending.append(call)
            sends = len(self._pending) == 1  # the first one sends the batch
        if sends:
            batch: list[_Call] = []
            try:
                time.sleep(max(0.0, self.window))
            finally:
                # Whatever happens to this thread, the batch is taken and answered:
                # a batch left pending would stop every later call.
                with self._lock:
                    batch, self._pending = self._pending, []
                self._send(batch)
        if not call.done.wait(GIVE_UP_AFTER):
            raise StoreError(f"{call.name}: no answer from the batch in {GIVE_UP_AFTER:g} s")
        if call.error is not None:
            raise call.error
        return call.answer

    def _send(self, batch: list[_Call]) -> None:
        by_ttl: dict[float, list[_Call]] = {}
        for call in batch:
            by_ttl.setdefault(call.ttl, []).append(call)
        # A store that cannot batch now (a cluster-mode Redis refusing a script across
        # slots) makes one call per lease: then renewals are sent and answered first, and
        # the acquires go out on a thread of their own, so a slow acquire never holds up
        # a renewal past its deadline (nor the sending thread, when it renews).
        split = not getattr(self.store, "batches", True)
        for ttl, group in by_ttl.items():
            if split:
                acquiring = [call for call in group if call.request is not None]
                self._send_group(ttl, [call for call in group if call.renewal is not None])
                if acquiring:
                    threading.Thread(
                        target=self._send_group,
                        args=(ttl, acquiring),
                        name="celery-leader-acquires",
                        daemon=True,
                    ).start()
            else:
                self._send_group(ttl, group)

    def _send_group(self, ttl: float, group: list[_Call]) -> None:
        if not group:
            return
        renewing = [call for call in group if call.renewal is not None]
        acquiring = [call for call in group if call.request is not None]
        try:
            renewed, acquired = self.store.call_many(
                [call.renewal for call in renewing if call.renewal is not None],
                [call.request for call in acquiring if call.request is not None],
                ttl,
            )
            if len(renewed) != len(renewing) or len(acquired) != len(acquiring):
                raise StoreError(  # noqa: TRY301 - one path for every failure of the call
                    f"batch: {len(renewed)} + {len(acquired)} answers for "
                    f"{len(renewing)} + {len(acquiring)} calls"
                )
            for call, renew_answer in zip(renewing, renewed, strict=True):
                call.answer = bool(renew_answer)
            for call, acquire_answer in zip(acquiring, acquired, strict=True):
                if isinstance(acquire_answer, BaseException):
                    call.error = acquire_answer
                else:
                    call.answer = acquire_answer
        except BaseException as exc:  # noqa: BLE001 - handed to every caller, raised there
            for call in group:
                call.error = exc
        finally:
            for call in group:
                call.done.set()

    def view(self, store: LeaseStore) -> LeaseStore:
        """*store* with its renewals and acquires sent through this batch (the rest unchanged)."""
        return _Batched(store, self)


class _Batched:
    """One election's store, renewing and acquiring through a :class:`CallBatch`.

    Every other call goes to the store by ``__getattr__``; check optional
    protocols (``Presence``, ``TokenHistory``) on the store, not on a view:
    from Python 3.12 ``isinstance`` against a runtime protocol does not see
    attributes that ``__getattr__`` provides.
    """

    def __init__(self, store: LeaseStore, batch: CallBatch) -> None:
        self._store = store
        self._batch = batch

    def renew(self, name: str, lease_id: str, ttl: float) -> bool:
        return self._batch.renew(name, lease_id, ttl)

    def acquire(self, name: str, holder: Holder, ttl: float, min_token: int = 0) -> AcquireResult:
        return self._batch.acquire(name, holder, ttl, min_token)

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._store, attribute)
