"""Run callbacks in order on one daemon thread, so the lease thread never waits on them."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)


class SerialDispatcher:
    """A single worker thread that runs submitted callables one after another."""

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[Callable[[], object] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], object]) -> None:
        """Run *fn* soon, after everything submitted before it."""
        self._queue.put(fn)

    def close(self, timeout: float = 2.0) -> None:
        """Run what is queued, then stop (waits at most *timeout* seconds)."""
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            fn = self._queue.get()
            if fn is None:
                return
            try:
                fn()
            except Exception:
                logger.exception("celery-leader: a signal receiver raised")
