"""Store calls bounded in wall time, whatever the store client does.

A client's own timeouts bound one read or one connect, not one call: after a
reconnect a single renewal can be several round trips (connect, AUTH,
SELECT, EVALSHA, SCRIPT LOAD), and a name lookup is bounded by nothing. The
lease thread must never wait past its deadline, so every store call it makes
runs on a helper thread and is waited for at most its bound.

Guarantee: :meth:`BoundedCaller.call` returns or raises within *timeout*
seconds (plus scheduling delay). A call given up on keeps running on its
helper thread until the client returns; its result is discarded. The store
protocol makes such late landings harmless: an acquire that lands late is
recognised as the caller's own on the next attempt, a late renewal only
extends a lease in the store that the caller already stopped trusting, and a
late release frees it. At most ``max_abandoned`` calls may be in that state
at once; past that, calls fail at once rather than pile up threads.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from celery_leader._masking import mask_text
from celery_leader.exceptions import StoreCallTimeoutError, StoreError

T = TypeVar("T")


class _Job:
    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.value = self.fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
            self.error = exc
        finally:
            self.done.set()


class _Helper:
    """One thread that runs jobs in order until told to stop."""

    def __init__(self, name: str) -> None:
        self.jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:
            job.run()


class BoundedCaller:
    """Runs callables on a helper thread and waits for each at most its bound."""

    def __init__(self, name: str, *, max_abandoned: int = 4) -> None:
        self._name = name
        self._max_abandoned = max_abandoned
        self._lock = threading.Lock()
        self._helper: _Helper | None = None
        self._abandoned: list[_Job] = []

    def call(self, fn: Callable[[], T], timeout: float, what: str = "store call") -> T:
        """Run *fn*: its result, its exception, or StoreCallTimeoutError after *timeout* s."""
        with self._lock:
            self._abandoned = [job for job in self._abandoned if not job.done.is_set()]
            if len(self._abandoned) >= self._max_abandoned:
                raise StoreCallTimeoutError(
                    f"{what} not sent: {len(self._abandoned)} earlier store calls still hang"
                )
            if self._helper is None:
                self._helper = _Helper(f"celery-leader-store[{self._name}]")
            helper = self._helper
        job = _Job(fn)
        helper.jobs.put(job)
        if not job.done.wait(max(timeout, 0.0)):
            with self._lock:
                # The helper is busy with a call nobody waits for: retire it
                # once that call returns, and use a fresh one from now on.
                self._abandoned.append(job)
                if self._helper is helper:
                    self._helper = None
            helper.jobs.put(None)
            raise StoreCallTimeoutError(f"{what} timed out after {timeout:.3g} s")
        if job.error is not None:
            raise job.error
        return job.value  # type: ignore[no-any-return]

    def close(self) -> None:
        """Let the helper thread end once its queue is empty."""
        with self._lock:
            helper, self._helper = self._helper, None
        if helper is not None:
            helper.jobs.put(None)


def store_call(
    call: Callable[[Callable[[], T], float, str], T],
    fn: Callable[[], T],
    timeout: float,
    what: str,
    url: str,
) -> T:
    """Run store call *fn* through *call* (a bounded caller) within *timeout* seconds.

    Any error it raises comes out as a :class:`StoreError` naming the store
    (*url*, masked by the store) and the call, with secrets masked: the one
    shape of a failed store call for the lease thread and beat alike.
    """
    try:
        return call(fn, timeout, what)
    except StoreError:
        raise
    except Exception as exc:  # noqa: BLE001 - a store that raises anything failed this call
        raise StoreError(
            f"lease store {url}: {what} failed: {type(exc).__name__}: {mask_text(str(exc))}"
        ) from None
