"""How a process's main loop is doing: when it last turned, and what holds it.

One :class:`LoopLiveness` per process, for the loop the process lives by:
the worker's consumer loop, or beat's loop. The loop calls :meth:`tick`
each time it turns; the process records when it has started competing
(:meth:`start`), when it is stopping, and each wait on the broker that
keeps the loop from turning (:meth:`wait_begins` / :meth:`wait_ends`).

Two readers, one record:

* the lease thread, before every renewal and every attempt to acquire,
  through the process's own ``is_live`` (the worker and beat each add their
  own rules on top of :meth:`turning`);
* the health probe (:mod:`celery_leader.observe.health`), which tells
  "starting", "stopping", "reconnecting" and "stuck" apart from it.

Threads: the loop writes, the lease thread and the probe read. Every write
replaces one attribute or one dict item, which is atomic in CPython, so no
lock is taken and a reader never waits on the loop. Times are on the
monotonic clock (*clock*, injectable for tests).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

#: A wait on the broker: the consumer is disconnected (the worker), or beat connects.
CONNECTING = "connecting"
#: A wait on the broker: beat's publish (and its send mark) is in flight.
PUBLISHING = "publishing"


class LoopLiveness:
    """The liveness record of one process's loop; see the module docstring.

    *window* is the longest gap between two ticks of a loop that turns, in
    seconds (the process widens it when its loop turns more slowly by
    design, see :meth:`widen`).
    """

    def __init__(self, window: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.window = window
        self._clock = clock
        #: When the loop last turned (monotonic clock); tests move it back to age the loop.
        self.last_tick = clock()
        #: True once the process competes (its lease threads started); never reset.
        self.started = False
        #: True once the process is stopping (a warm shutdown, beat's close); never reset.
        self.stopping = False
        #: Each wait on the broker in progress, by reason, with when it began (monotonic).
        self.waits: dict[str, float] = {}

    def tick(self) -> None:
        """The loop turned."""
        self.last_tick = self._clock()

    def age(self) -> float:
        """Seconds since the loop last turned."""
        return self._clock() - self.last_tick

    def turning(self) -> bool:
        """True when the loop turned within its window."""
        return self.age() < self.window

    def widen(self, window: float) -> None:
        """Allow at least *window* seconds between two ticks (never narrows)."""
        self.window = max(self.window, window)

    def start(self) -> None:
        """The process competes from now on."""
        self.started = True

    def wait_begins(self, reason: str) -> None:
        """The loop waits on the broker for *reason* (:data:`CONNECTING`, :data:`PUBLISHING`)."""
        self.waits[reason] = self._clock()

    def wait_ends(self, reason: str) -> None:
        """The wait for *reason* is over (nothing happens when none was going on)."""
        self.waits.pop(reason, None)

    @contextmanager
    def waiting(self, reason: str) -> Iterator[None]:
        """A wait on the broker for *reason*, for the length of the ``with`` block."""
        self.wait_begins(reason)
        try:
            yield
        finally:
            self.wait_ends(reason)

    def waiting_since(self, reason: str) -> float | None:
        """When the wait for *reason* began (monotonic clock), or None when none goes on."""
        return self.waits.get(reason)

    @property
    def waiting_on_broker(self) -> bool:
        """True while any wait on the broker goes on: a restart would not end it."""
        return bool(self.waits)
