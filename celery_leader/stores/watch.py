"""One helper for "tell me when the lease may be free": a daemon thread per watch.

A store's :meth:`~celery_leader.stores.base.LeaseStore.watch` returns a
:class:`WatchThread`. The store gives it what only the store knows: how to
hear of a release (Redis: a pub/sub loop, as *body*), or how to look
whether the lease was freed since the last look (SQLite, Azure: :func:`poll`).
The thread, its name, closing, and the rule that a failing callback or look
never ends the watch live here.

What every watch guarantees: the callback runs on the watch's thread, never
after :meth:`WatchThread.close` was called before it started, and an
exception it raises is logged and the watch goes on. Spurious calls are
allowed (the caller looks at the lease again); missed ones are not.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)


class WatchThread:
    """A daemon thread named ``celery-leader-watch[<label>]`` that runs *body* until closed.

    *body* receives the watch: it loops until :attr:`closed` is set, and
    calls :meth:`notify` whenever the lease may be free.
    """

    def __init__(
        self, label: str, callback: Callable[[], None], body: Callable[[WatchThread], None]
    ) -> None:
        self.closed = threading.Event()
        self._callback = callback
        self._thread = threading.Thread(
            target=body, args=(self,), name=f"celery-leader-watch[{label}]", daemon=True
        )
        self._thread.start()

    def notify(self) -> None:
        """Call back, unless the watch is closed; a failing callback is logged, not raised."""
        if self.closed.is_set():
            return
        try:
            self._callback()
        except Exception:
            logger.exception("release watch callback failed")

    def close(self) -> None:
        """Stop watching: the thread ends at its next look (or wait), within its interval."""
        self.closed.set()


def poll(
    label: str,
    callback: Callable[[], None],
    *,
    interval: float,
    freed: Callable[[], bool],
    expected: tuple[type[BaseException], ...],
    on_end: Callable[[], None] | None = None,
) -> WatchThread:
    """A watch that asks *freed* every *interval* seconds, and calls back when it says True.

    *freed* answers "was the lease freed since the last look?" and keeps
    what it needs between looks. An exception of the *expected* kinds (the
    store unreachable for a moment) skips one look quietly; any other is
    logged, and the watch goes on. *on_end* runs once when the thread ends
    (to close a connection of the watch's own).
    """

    def body(watch: WatchThread) -> None:
        try:
            while not watch.closed.wait(interval):
                try:
                    due = freed()
                except expected:
                    continue
                except Exception:
                    logger.exception("release watch on %s failed", label)
                    continue
                if due:
                    watch.notify()
        finally:
            if on_end is not None:
                on_end()

    return WatchThread(label, callback, body)
