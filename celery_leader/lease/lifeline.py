"""Failover at the speed of death: a lifeline per process, and the rule that makes it safe.

A lease ends by itself only at its expiry, a ttl after its last renewal.
Most leaders that stop renewing died on a host that lives (an OOM kill, a
SIGKILL at the end of a grace period, a crash in a C extension), and then
the kernel closes the dead process's sockets and files at once, and the
store's server sees it within milliseconds. A store with
:attr:`~celery_leader.stores.base.Capability.LIFELINE` keeps something of
each process that it drops then (a connection of its own, or a lock):
the process's :class:`~celery_leader.stores.base.Lifeline`. A holder ties
each term to its lifeline's key (written into the lease record), and a
follower that sees the holder's lifeline end takes the lease over
(:meth:`~celery_leader.stores.base.Lifelines.take_over`) instead of
waiting for it to expire.

The rule
--------
A lifeline also ends while its process lives: the server restarts or fails
over, an admin kills the connection, a timeout or a partition closes it. So
the end of a lifeline alone never lets anyone act. Two halves make it safe:

1. **The holder's work is bounded by its lifeline.** The holder confirms its
   lifeline every :data:`CONFIRM_EVERY` seconds with a round trip on the
   lifeline's own connection. A term tied to a lifeline is valid only until
   :data:`GRACE` seconds after the *sending* of the last confirmation that
   came back, as well as until its lease validity: ``is_leader``, the
   shared memory the pool children and the run watchdog read, and so every
   place that starts or ends leader work. No confirmation can come back once
   the server dropped the lifeline, so the holder's work stops at most
   :data:`GRACE` seconds after the lifeline ended, whether the holder heard
   of the end or not (a lost FIN, a partition): the run watchdog ends
   ``terminate`` runs at that deadline from outside the main process.
2. **The follower waits that bound out.** A follower reads the holder's
   lifeline every :data:`POLL_EVERY` seconds on one connection of its own.
   Seen kept, then not kept, *on the same connection* (one server process,
   in order), it ended before the reading that showed it gone came back.
   The follower takes over no sooner than :data:`TAKEOVER_WAIT` (``GRACE``
   plus the watchdog's kill allowance) after that reading came back, and
   only from that very term (compare-and-set on its token and lifeline key).

From 1 and 2: when the follower acts, the holder's work tied to that
lifeline has stopped, provided the holder's and the follower's clocks
advance at about the same rate over :data:`TAKEOVER_WAIT` (the same
assumption as guarantee 1, over a far shorter span) and the run watchdog
is scheduled on time. Runs under ``cancel`` or ``finish`` are not ended at
a deadline by anyone (the guarantees say so for a lease's end too).

What follows from "the same connection":

* a key is never confirmed on, or read through, another connection than
  the one it was seen on: a store restart or a failover to a replica (whose
  server never kept the key) ends every reader's session, and with it what
  it had seen; the fast path is off for that lifeline, and the lease ends
  at its expiry as before;
* a key is never reopened: a holder whose lifeline ended loses the terms tied
  to it (:attr:`~celery_leader.lease.manager.LossReason.LIFELINE_ENDED`),
  opens a new lifeline with a new key, and ties only later terms to it;
* a term is tied only to a lifeline confirmed when the term is acquired, so
  a lease manager waits (at most :data:`OPEN_WAIT`) for the first
  confirmation before it first competes.

A holder stopped whole (SIGSTOP, a frozen container) keeps its sockets open:
its lifeline is kept, no follower takes over early, and its lease expires
as before. A holder whose confirmations come back later than :data:`GRACE`
(a process so starved, a store so slow) stops leading until the next one
comes back (its terminate runs are ended at the deadline), and goes on
under the same terms then; a confirmation unanswered for
:data:`CONFIRM_TIMEOUT` ends the lifeline. Leading with a lifeline asks the
lifeline's thread to be scheduled within a quarter of a second.

Who keeps the lifeline: the worker's (or beat's) main process, alone.
Forked children drop their copy of its descriptor at fork (a child that
exits never closes the connection under its parent, nor keeps it alive
after its parent died). While the main process lives, work in a pool
child is bounded by rule 1, since the watchdog and the child's own check
read the validity rule 1 publishes. When it dies, its prefork children are
SIGKILLed by the kernel (each asked for it: :mod:`celery_leader.term_end.orphans`),
and the successor's wait of rule 2 covers the delivery of those signals.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from celery_leader import clock
from celery_leader._masking import mask_text
from celery_leader.exceptions import StoreError
from celery_leader.stores.base import Lifeline, LifelineEndedError, Lifelines

logger = logging.getLogger(__name__)

#: Seconds between two confirmations of a holder's lifeline.
CONFIRM_EVERY = 0.05
#: Seconds a term tied to a lifeline stays valid after the sending of its last confirmation
#: that came back. Longer survives longer stalls of the lease thread; shorter fails over sooner.
GRACE = 0.25
#: Seconds the run watchdog may take past a deadline to end a ``terminate`` run (its
#: pass interval, with room): a follower waits it out on top of :data:`GRACE`.
KILL_ALLOWANCE = 0.05
#: Seconds a follower waits, after a reading showed the holder's lifeline gone, before it
#: takes over: the holder's work tied to that lifeline has stopped by then.
TAKEOVER_WAIT = GRACE + KILL_ALLOWANCE
#: Seconds between two readings of the lifelines a process follows (one round trip each,
#: whatever the number of elections).
POLL_EVERY = 0.05
#: Seconds before a holder whose lifeline could not be opened or ended tries a new one.
REOPEN_AFTER = 1.0
#: Seconds a confirmation may take before the holder gives its lifeline up (closes it and
#: opens a new one). Longer than :data:`GRACE` on purpose: an answer later than the grace
#: only pauses the holder's terms (their validity counts from the sending), and they
#: resume with the next confirmation, where ending the lifeline would end them.
CONFIRM_TIMEOUT = 1.0
#: Seconds a lease manager waits at its start for the first confirmation of its process's
#: lifeline before it competes: a term is tied only to a lifeline confirmed when it is
#: acquired, and a worker's first term is often its longest.
OPEN_WAIT = 1.0
#: Seconds a lease manager waits, after its process's confirmed lifeline ended, for the next
#: one to be confirmed before it competes without (its open after :data:`REOPEN_AFTER`, and
#: a round trip): a store restart ends every lifeline at once, and a term won in the second
#: before they reopen would be tied to none for its whole life.
REOPEN_WAIT = REOPEN_AFTER + 0.5
#: Seconds from its first confirmation past which a lifeline counts as steady. Lifelines that
#: keep ending sooner (a proxy that reconnects by itself, a store that keeps dropping the
#: connection or answering later than CONFIRM_TIMEOUT) are not awaited (:data:`REOPEN_WAIT`)
#: after the second in a row: each term won after a wait would be tied to the next such
#: lifeline and end with it, where one won without a lifeline lasts (waiting every time kept
#: a process from holding any term for longer than its lifelines lasted, and from leading at
#: all when its terms hold off).
STEADY_FOR = 10.0


Callback = Callable[[], None]


class HolderLifeline:
    """The lifeline of this process on one store, confirmed every :data:`CONFIRM_EVERY` seconds.

    A daemon thread opens it, confirms it, and after it ended opens a new
    one (a new key) after :data:`REOPEN_AFTER`. :meth:`valid_until` is
    rule 1 of the module docstring; listeners hear of each confirmation
    (elections republish their validity) and of each end (the terms tied
    to the ended key are lost).
    """

    def __init__(
        self,
        store: Lifelines,
        label: str,
        *,
        now: Callable[[], float] = clock.now,
    ) -> None:
        self._store = store
        self._label = label
        self._now = now
        self._lock = threading.Lock()
        self._lifeline: Lifeline | None = None
        self._valid_until = 0.0
        self._confirmed: list[Callback] = []
        self._ended: list[Callable[[str], None]] = []
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._opened = threading.Event()
        self._open_failures = 0
        #: Until when (lease clock) a lifeline is expected confirmed again: set when a
        #: confirmed one ends, cleared when an open fails (none may come: do not wait).
        self._expected_until = 0.0
        #: The key of the last lifeline confirmed at least once, and when (lease clock) its
        #: first confirmation was sent.
        self._confirmed_key = ""
        self._confirmed_since = 0.0
        #: The last lifeline that ended had not been confirmed for STEADY_FOR.
        self._young_end = False
        _LIVE.add(self)

    # -- reading (any thread) -------------------------------------------------

    def key(self) -> str:
        """The key of the lifeline now confirmed; empty while none is.

        Empty before the first confirmation, after the lifeline ended, and
        while its last confirmation is older than :data:`GRACE` (an answer is
        late): a term acquired then is tied to no lifeline.
        """
        lifeline = self._lifeline
        if lifeline is None or self._now() >= self._valid_until:
            return ""
        return lifeline.key

    def reopening_in(self) -> float:
        """Seconds until a new lifeline is expected confirmed, when one is awaited; else 0.

        Awaited for :data:`REOPEN_WAIT` after a lifeline that had been
        confirmed ended, and no longer once an open failed: a store that
        refuses lifelines never holds an election back for more than that.
        Not awaited after a lifeline that ended within :data:`STEADY_FOR` of
        its first confirmation when the one before it did too: lifelines that
        keep ending young hold an election back twice at most in a row.
        0 while a lifeline is confirmed, before the first, and while a
        confirmation is late (an answer that never comes ends the lifeline,
        and the wait starts then).
        """
        if self.key():
            return 0.0
        return max(0.0, self._expected_until - self._now())

    def is_open(self, key: str) -> bool:
        """True while *key* names the lifeline now open (confirmed lately or not).

        Keys are never reopened: once this is False for a key, that
        lifeline has ended for good.
        """
        lifeline = self._lifeline
        return bool(key) and lifeline is not None and lifeline.key == key

    def valid_until(self, key: str) -> float:
        """Until when a term tied to *key* may act (lease clock); 0 when *key* is not current."""
        lifeline = self._lifeline
        if not key or lifeline is None or lifeline.key != key:
            return 0.0
        return self._valid_until

    def add_listeners(
        self, confirmed: Callback | None = None, ended: Callable[[str], None] | None = None
    ) -> None:
        """Call *confirmed* after each confirmation, *ended* with the key of each that ended.

        Both run on the lifeline's thread; what they raise is logged.
        """
        with self._lock:
            if confirmed is not None:
                self._confirmed.append(confirmed)
            if ended is not None:
                self._ended.append(ended)

    def remove_listeners(
        self, confirmed: Callback | None = None, ended: Callable[[str], None] | None = None
    ) -> None:
        """Stop calling the listeners given (as added)."""
        with self._lock:
            if confirmed in self._confirmed:
                self._confirmed.remove(confirmed)
            if ended in self._ended:
                self._ended.remove(ended)

    def wait_opened(self, timeout: float) -> bool:
        """Block until a first lifeline was confirmed, at most *timeout* seconds; True if one was.

        It does not start the thread (:meth:`start` does; the simulation steps it instead).
        """
        return self._opened.wait(timeout)

    # -- the thread -------------------------------------------------------------

    def start(self) -> None:
        """Open and confirm in a daemon thread; returns at once (a second call does nothing)."""
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(
                target=self._run, name=f"celery-leader-lifeline[{self._label}]", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        """Stop confirming and close the lifeline (the server drops it)."""
        self._stopping.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(2.0)
        self._close()

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._stopping.wait(self.step())

    def step(self) -> float:
        """Open a lifeline when none is open, else confirm it once; seconds until the next step.

        The thread calls it in a loop; the simulation calls it on its own clock.
        """
        if self._lifeline is None:
            try:
                opened = self._store.open_lifeline()
            except Exception as exc:  # noqa: BLE001 - retried; a lifeline is never fatal
                self._open_failures += 1
                self._expected_until = 0.0
                if self._open_failures == 1:
                    logger.warning(
                        "celery-leader: cannot open a lifeline on %s (failover waits for "
                        "the lease to expire meanwhile): %s",
                        self._label,
                        mask_text(str(exc)),
                    )
                return REOPEN_AFTER
            self._open_failures = 0
            self._lifeline = opened
        return CONFIRM_EVERY if self._confirm_once() else REOPEN_AFTER

    def _confirm_once(self) -> bool:
        """One confirmation; False when the lifeline ended."""
        lifeline = self._lifeline
        assert lifeline is not None
        sent = self._now()
        try:
            # A late answer is waited for (up to CONFIRM_TIMEOUT): meanwhile the terms'
            # validity, counted from this sending, runs out and they pause; the answer, once
            # in, lets the next confirmation resume them. No answer at all ends the lifeline:
            # an answer after the timeout would be read as the next confirmation's.
            lifeline.confirm(timeout=CONFIRM_TIMEOUT)
        except (LifelineEndedError, StoreError) as exc:
            self._end(lifeline, str(exc))
            return False
        except Exception as exc:  # noqa: BLE001 - a client failure we do not know: ended
            self._end(lifeline, str(exc))
            return False
        self._valid_until = max(self._valid_until, sent + GRACE)
        if self._confirmed_key != lifeline.key:
            self._confirmed_key, self._confirmed_since = lifeline.key, sent
        self._opened.set()
        for listener in self._listeners_confirmed():
            try:
                listener()
            except Exception:
                logger.exception("celery-leader: a lifeline listener raised")
        return True

    def _end(self, lifeline: Lifeline, why: str) -> None:
        # Only a lifeline that was confirmed is awaited again, and not the second of two in a
        # row that ended young: lifelines that end at or soon after their first confirmation
        # (a proxy that reconnects) would otherwise hold elections back at every end, and
        # each term won after a wait would end with the next of them. Set before the key is
        # cleared: a manager never sees neither a key nor a wait.
        now = self._now()
        confirmed = lifeline.key == self._confirmed_key
        young = not confirmed or now - self._confirmed_since < STEADY_FOR
        awaited = confirmed and not (young and self._young_end)
        self._young_end = young
        self._expected_until = now + REOPEN_WAIT if awaited else 0.0
        self._valid_until = 0.0
        self._lifeline = None
        with suppress(Exception):
            lifeline.close()
        logger.warning(
            "celery-leader: the lifeline of this process on %s ended (%s); the terms tied to "
            "it end, and a new lifeline opens",
            self._label,
            mask_text(why) or "closed",
        )
        with self._lock:
            listeners = list(self._ended)
        for listener in listeners:
            try:
                listener(lifeline.key)
            except Exception:
                logger.exception("celery-leader: a lifeline listener raised")

    def _listeners_confirmed(self) -> list[Callback]:
        with self._lock:
            return list(self._confirmed)

    def _close(self) -> None:
        lifeline, self._lifeline = self._lifeline, None
        self._valid_until = 0.0
        if lifeline is not None:
            with suppress(Exception):
                lifeline.close()

    def _drop_in_child(self) -> None:
        """In a forked child: let go of the lifeline without touching the connection."""
        lifeline, self._lifeline = self._lifeline, None
        self._valid_until = 0.0
        self._thread = None
        self._lock = threading.Lock()
        if lifeline is not None:
            _blind(lifeline)


@dataclass
class _Followed:
    """A key a follower asks about, and what its readings showed."""

    callbacks: list[Callback]
    seen_in: str | None = None
    """The session the key was last seen kept in; None when never seen kept."""
    ended_at: float | None = None
    """Lease-clock time the reading that showed it gone came back; None while not seen gone."""


class LifelineMonitor:
    """The lifelines this process follows on one store, read every :data:`POLL_EVERY` seconds.

    One thread and one round trip per reading, for every election the
    process follows (rule 2 of the module docstring). A key seen kept and
    then gone in one session is *ended*: its callbacks run once, and
    :meth:`ended_at` says when the reading came back. The thread runs only
    while a key is followed.
    """

    def __init__(
        self,
        store: Lifelines,
        label: str,
        *,
        now: Callable[[], float] = clock.now,
        threaded: bool = True,
    ) -> None:
        #: Without a thread, :meth:`step` is called by the owner (the simulation).
        self._threaded = threaded
        self._store = store
        self._label = label
        self._now = now
        self._lock = threading.Lock()
        self._followed: dict[str, _Followed] = {}
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        _LIVE.add(self)

    def follow(self, key: str, callback: Callback) -> None:
        """Read *key* from now on; call *callback* (on the monitor's thread) when it ends."""
        if not key:
            return
        with self._lock:
            followed = self._followed.setdefault(key, _Followed([]))
            if callback not in followed.callbacks:
                followed.callbacks.append(callback)
            if self._thread is None and self._threaded:
                self._thread = threading.Thread(
                    target=self._run, name=f"celery-leader-lifelines[{self._label}]", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def unfollow(self, key: str, callback: Callback) -> None:
        """Stop calling *callback* for *key*; the key is no longer read once nobody follows it."""
        with self._lock:
            followed = self._followed.get(key)
            if followed is None:
                return
            if callback in followed.callbacks:
                followed.callbacks.remove(callback)
            if not followed.callbacks:
                del self._followed[key]

    def ended_at(self, key: str) -> float | None:
        """When a reading showed *key* gone after it was seen kept; None otherwise."""
        with self._lock:
            followed = self._followed.get(key)
            return None if followed is None else followed.ended_at

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._followed:
                    self._thread = None
                    return
            self.step()
            self._wake.wait(POLL_EVERY)
            self._wake.clear()

    def step(self) -> float:
        """One reading of every key followed and not seen ended; seconds until the next."""
        with self._lock:
            keys = [k for k, f in self._followed.items() if f.ended_at is None]
        if keys:
            self._read(keys)
        return POLL_EVERY

    def _read(self, keys: list[str]) -> None:
        try:
            reading = self._store.read_lifelines(keys)
        except Exception as exc:  # noqa: BLE001 - a failed reading shows nothing; the next may
            logger.debug("lifeline reading on %s failed: %s", self._label, mask_text(str(exc)))
            return
        came_back = self._now()
        due: list[Callback] = []
        with self._lock:
            for key in keys:
                followed = self._followed.get(key)
                if followed is None or followed.ended_at is not None:
                    continue
                if key in reading.alive:
                    followed.seen_in = reading.session
                elif followed.seen_in == reading.session:
                    followed.ended_at = came_back
                    due.extend(followed.callbacks)
                else:
                    followed.seen_in = None  # another session: what was seen proves nothing
        for callback in due:
            try:
                callback()
            except Exception:
                logger.exception("celery-leader: a lifeline callback raised")

    def _drop_in_child(self) -> None:
        self._followed = {}
        self._thread = None
        self._lock = threading.Lock()
        self._wake = threading.Event()


# -- one of each per process and store ------------------------------------------

_LIVE: weakref.WeakSet[HolderLifeline | LifelineMonitor] = weakref.WeakSet()
_registry: dict[tuple[str, str], tuple[HolderLifeline, LifelineMonitor]] = {}
_registry_lock = threading.Lock()


def for_store(store: Lifelines, url: str) -> tuple[HolderLifeline, LifelineMonitor]:
    """The lifeline and monitor of this process on the store at *url* (masked), made once.

    *store* is any open store on that address (the first one asked serves
    every election of the process). Nothing starts here: the lifeline's
    thread starts with the first lease manager that uses it (after the
    worker forked its watchdog), the monitor's with the first key followed.
    """
    key = (type(store).__qualname__, url)
    with _registry_lock:
        found = _registry.get(key)
        if found is None:
            found = _registry[key] = (HolderLifeline(store, url), LifelineMonitor(store, url))
        return found


def manager_options(store: object, url: str, *, enabled: bool, label: str) -> dict[str, Any]:
    """The :class:`~celery_leader.lease.manager.LeaseManager` options that tie terms to lifelines.

    Empty when *enabled* is False (``leader_fast_failover``), and when the
    store has no lifelines: then one line says so (once per *label*, the
    process's role), and failover waits for the lease as before.
    """
    if not enabled:
        return {}
    if not isinstance(store, Lifelines):
        if label not in _warned:
            _warned.add(label)
            logger.warning(
                "celery-leader: leader_fast_failover is on, but the %s store cannot see a "
                "process die (no lifeline): %s waits for the lease to expire when a leader dies",
                url.split(":", 1)[0],
                label,
            )
        return {}
    lifeline, monitor = for_store(store, url)
    return {"lifeline": lifeline, "lifelines": monitor}


_warned: set[str] = set()


def close_all() -> None:
    """Close every lifeline of this process (at shutdown, after the terms ended)."""
    with _registry_lock:
        entries = list(_registry.values())
        _registry.clear()
    for holder, _ in entries:
        holder.stop()


def _blind(lifeline: Lifeline) -> None:
    """Point the child's copy of *lifeline*'s descriptor at /dev/null.

    The child's client object may still close or write to it at exit (a
    PostgreSQL client sends a goodbye that ends the session); /dev/null
    takes it, and the parent's connection is untouched.
    """
    with suppress(Exception):
        fd = lifeline.fileno()
        if fd >= 0:
            null = os.open(os.devnull, os.O_RDWR)
            try:
                os.dup2(null, fd)
            finally:
                os.close(null)


def _after_fork_in_child() -> None:
    global _registry_lock  # noqa: PLW0603 - the child's own registry
    for item in list(_LIVE):
        item._drop_in_child()
    _registry.clear()
    _registry_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
