"""Recording leadership terms and checking that no two overlap.

A term's interval runs from the moment its manager started to believe it
leads to the earliest of: the moment it stopped (LOST/RELEASED), or the end of
its last known validity (a killed process reports no end). Times are
the lease clock (celery_leader.clock), one clock for all processes of a host.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

from celery_leader.lease import EventKind, LeaseEvent


@dataclass
class Interval:
    holder: str
    token: int
    start: float
    valid_until: float
    stopped_at: float | None = None

    @property
    def end(self) -> float:
        return (
            self.valid_until if self.stopped_at is None else min(self.stopped_at, self.valid_until)
        )


@dataclass
class History:
    """Thread-safe collector of lease events from many managers."""

    intervals: dict[tuple[str, int], Interval] = field(default_factory=dict)
    events: list[tuple[str, LeaseEvent]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def listener(self, holder: str):  # type: ignore[no-untyped-def]
        def record(event: LeaseEvent) -> None:
            self.add(
                holder,
                event.kind.value,
                event.term.token,
                event.term.elected_at,
                event.term.valid_until,
                event.at,
            )
            with self.lock:
                self.events.append((holder, event))

        return record

    def add(
        self, holder: str, kind: str, token: int, elected_at: float, valid_until: float, at: float
    ) -> None:
        with self.lock:
            key = (holder, token)
            interval = self.intervals.get(key)
            if interval is None:
                interval = self.intervals[key] = Interval(holder, token, elected_at, valid_until)
            interval.valid_until = max(interval.valid_until, valid_until)
            if kind in (EventKind.LOST.value, EventKind.RELEASED.value):
                interval.stopped_at = at

    def has_term(self, holder: str, token: int | None) -> bool:
        """True once *holder*'s term with *token* has been recorded."""
        with self.lock:
            return (holder, token) in self.intervals

    def load_jsonl(self, path: Path) -> None:
        for line in path.read_text().splitlines():
            row = json.loads(line)
            self.add(
                row["holder"],
                row["kind"],
                row["token"],
                row["elected_at"],
                row["valid_until"],
                row["at"],
            )

    def terms(self) -> list[Interval]:
        with self.lock:
            return sorted(self.intervals.values(), key=lambda i: i.start)

    def overlaps(self) -> list[tuple[Interval, Interval]]:
        """Pairs of terms of different holders that overlap in time."""
        found = []
        terms = self.terms()
        for i, a in enumerate(terms):
            for b in terms[i + 1 :]:
                if b.start >= a.end:
                    continue
                if a.holder != b.holder or a.token != b.token:
                    found.append((a, b))
        return found

    def tokens_in_order(self) -> list[int]:
        return [t.token for t in self.terms()]
