"""The helpers for "tell me when the lease may be free": the threads that watch.

A store's :meth:`~celery_leader.stores.base.LeaseStore.watch` returns a
:class:`WatchThread` (a daemon thread per watch), or a watch on its
process's :class:`Fanout` when one connection brings the releases of every
election (PostgreSQL, etcd). The store gives a :class:`WatchThread` what
only the store knows: how to hear of a release (Redis: a pub/sub loop, as
*body*), or how to look whether the lease was freed since the last look
(SQLite, Azure: :func:`poll`).
The thread, its name, closing, and the rule that a failing callback or look
never ends the watch live here.

What every watch guarantees: the callback runs on the watch's thread, never
after :meth:`WatchThread.close` was called before it started, and an
exception it raises is logged and the watch goes on. Spurious calls are
allowed (the caller looks at the lease again); missed ones are not.
"""

from __future__ import annotations

import logging
import os
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


class _Subscription:
    """One watch of one election on a :class:`Fanout`."""

    def __init__(self, fanout: Fanout, name: str, callback: Callable[[], None]) -> None:
        self.fanout = fanout
        self.name = name
        self.callback = callback
        self.closed = False

    def notify(self) -> None:
        if self.closed:
            return
        try:
            self.callback()
        except Exception:
            logger.exception("release watch callback failed")

    def close(self) -> None:
        self.closed = True
        self.fanout.remove(self)


class Fanout:
    """One thread of a process for every watch on one store, whatever the number of elections.

    For stores whose notifications come down one connection for every
    election (PostgreSQL's ``LISTEN``, an etcd watch stream): 200 followers
    in a process then cost one connection and one thread, not 200. The
    store gives *body*, which runs on the thread while :meth:`keep_running`
    says so, (re)connects, and calls :meth:`notify` with an election's name
    on each release, or with None (every watch) whenever a release may have
    gone unheard (each new connection). A watch added while the thread runs
    is called back once at once (the lease may be free); the first ones are
    called back by *body* once it is connected. The thread ends once no
    watch is left; the next watch starts a new one.
    """

    def __init__(self, label: str, body: Callable[[Fanout], None]) -> None:
        self._label = label
        self._body = body
        self._lock = threading.Lock()
        self._subscriptions: list[_Subscription] = []
        self._thread: threading.Thread | None = None

    def add(self, name: str, callback: Callable[[], None]) -> _Subscription:
        """Watch election *name*; close the returned watch when done."""
        subscription = _Subscription(self, name, callback)
        with self._lock:
            self._subscriptions.append(subscription)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._body,
                    args=(self,),
                    name=f"celery-leader-watch[{self._label}]",
                    daemon=True,
                )
                self._thread.start()
                return subscription  # body calls every watch back once it is connected
        subscription.notify()  # already connected: the lease may be free now
        return subscription

    def remove(self, subscription: _Subscription) -> None:
        """Stop calling *subscription* back (its ``close``)."""
        with self._lock:
            if subscription in self._subscriptions:
                self._subscriptions.remove(subscription)

    def watching(self) -> bool:
        """Whether any watch is left."""
        with self._lock:
            return bool(self._subscriptions)

    def keep_running(self) -> bool:
        """False once no watch is left, and the thread must then end.

        Decided under the lock, so a watch added meanwhile starts a new thread
        instead of waiting on this one.
        """
        with self._lock:
            if self._subscriptions:
                return True
            self._thread = None
            return False

    def notify(self, name: str | None) -> None:
        """Call back the watches of election *name*, or every watch when None."""
        with self._lock:
            subscriptions = list(self._subscriptions)
        for subscription in subscriptions:
            if name is None or subscription.name == name:
                subscription.notify()


_fanouts: dict[tuple[str, ...], Fanout] = {}
_fanouts_lock = threading.Lock()


def shared_fanout(key: tuple[str, ...], make: Callable[[], Fanout]) -> Fanout:
    """The :class:`Fanout` of this process for *key* (a store and its address), made once.

    A forked child starts with none: its parent's threads and connections
    are not its own.
    """
    with _fanouts_lock:
        fanout = _fanouts.get(key)
        if fanout is None:
            fanout = _fanouts[key] = make()
        return fanout


def _forget_after_fork() -> None:
    global _fanouts_lock  # noqa: PLW0603 - the child's own registry
    _fanouts.clear()
    _fanouts_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)
