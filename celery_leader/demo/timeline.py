"""The demo's timeline: each line stamped with the time of what it tells, printed in that order.

The demo learns of an event some time after it happened: a leader task run
when it next reads the workers' files, the end of a burst of runs once a
later run came. A line printed when the demo learnt of its event would carry
the wrong time, and could come after the line of a later event. So lines are
given to :class:`Timeline` with their event's own time (on the lease clock,
:func:`celery_leader.clock.now`, which the workers stamp their rows with) and
held back :data:`HOLD_BACK` seconds before they are printed, in time order.

Guarantee: the printed stamps never decrease. An event learnt of more than
:data:`HOLD_BACK` seconds after it happened (a worker stalled between
stamping a row and writing it) is stamped with the time up to which lines
were already printed, not earlier.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

from celery_leader import clock

#: Seconds a line waits before it is printed: longer than the demo takes to learn of an
#: event (a read of the workers' files every 50 ms, a burst's end one tick after it).
HOLD_BACK = 1.0


class Timeline:
    """Lines ``[  1.23s] text``, stamped from *started*, printed in the order of their stamps."""

    def __init__(
        self,
        out: Callable[[str], None],
        started: float,
        *,
        hold_back: float = HOLD_BACK,
        now: Callable[[], float] = clock.now,
    ) -> None:
        self._out = out
        self._started = started
        self._hold_back = hold_back
        self._now = now
        self._pending: list[tuple[float, int, str]] = []
        self._order = itertools.count()  # lines of one stamp keep the order they came in
        #: No line stamped earlier than this is printed any more (see the module docstring).
        self._printed_until = started

    def add(self, at: float, text: str) -> None:
        """Print *text* stamped *at* (lease clock) once no earlier line can come."""
        heapq.heappush(self._pending, (max(at, self._printed_until), next(self._order), text))

    def say(self, text: str) -> None:
        """Print *text* stamped now: what the demo does or sees at this moment."""
        self.add(self._now(), text)

    def flush(self, *, everything: bool = False) -> None:
        """Print the lines held back long enough (every line with *everything*), oldest first."""
        upto = float("inf") if everything else self._now() - self._hold_back
        while self._pending and self._pending[0][0] <= upto:
            at, _, text = heapq.heappop(self._pending)
            self._out(f"[{at - self._started:6.2f}s] {text}")
            self._printed_until = max(self._printed_until, at)
        if not everything:
            self._printed_until = max(self._printed_until, upto)
