"""Virtual time and the event queue of one simulated run.

There is one clock, the real time of the simulated world, in virtual seconds
from 0; the lease store keeps time on it and every node derives its own
local clock from it (rate and offset, see :mod:`celery_leader.simulation.node`).
Events are ordered by ``(time, seq)``, ``seq`` being the order in which they
were scheduled: two events due at one instant run in the order they were
scheduled, so a run depends on nothing but its seed.

Events may belong to an *owner* (a node, or the store). While an owner is
paused (a process stopped by SIGSTOP or a long GC, a store stopped for a
fork), its events do not run: they move to the end of the pause, keeping
their order.

:meth:`Scheduler.run_one` is re-entrant. A node's store call runs the queue
itself until its reply or its timeout comes (see
:mod:`celery_leader.simulation.network`), so the rest of the world keeps
acting while the call is in flight. Such nesting is bounded: a node inside a
call has no event of its own queued that would start another step of it.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Protocol


class Owner(Protocol):
    """Something whose events wait while it is paused."""

    @property
    def paused_until(self) -> float:
        """Its events wait until this (real) time."""


class Halt(BaseException):
    """Ends the run at once (a violation was found, or the run is stuck).

    A BaseException, so that the lease manager's ``except Exception`` (which
    keeps its thread alive through any store failure) lets it through.
    """


Action = Callable[[], None]


class Scheduler:
    """An event queue on virtual time."""

    __slots__ = ("_heap", "_seq", "after_event", "events", "halted", "max_events", "now")

    def __init__(self, *, max_events: int = 500_000) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Action, Owner | None]] = []
        self._seq = 0
        #: Events run so far (re-queued ones of a paused owner not counted).
        self.events = 0
        #: A bound on events per run, so that a livelock ends as a failure.
        self.max_events = max_events
        #: Called after every event when set (the checker's every-event mode).
        self.after_event: Action | None = None
        self.halted = False

    def at(self, time: float, action: Action, owner: Owner | None = None) -> None:
        """Run *action* at *time* (never earlier than now)."""
        heapq.heappush(self._heap, (max(time, self.now), self._seq, action, owner))
        self._seq += 1

    def next_time(self) -> float:
        """When the next event is due (infinity when none is)."""
        return self._heap[0][0] if self._heap else float("inf")

    def run_one(self) -> None:
        """Run the next event; raise :class:`Halt` once the run was halted."""
        if self.halted:
            raise Halt
        time, _, action, owner = heapq.heappop(self._heap)
        self.now = time
        if owner is not None and owner.paused_until > time:
            # Stopped: it runs when the pause ends, after what is already due then.
            self.at(owner.paused_until, action, owner)
            return
        self.events += 1
        if self.events > self.max_events:
            self.halted = True
            raise Halt
        action()
        if self.after_event is not None:
            self.after_event()

    def run_until(self, end: float) -> None:
        """Run every event due up to *end*."""
        heap = self._heap
        while heap and heap[0][0] <= end:
            self.run_one()
        self.now = max(self.now, end)
