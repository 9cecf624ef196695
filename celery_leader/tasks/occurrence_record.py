"""Which occurrences of one task completed: a compact record, and what it remembers for how long.

An occurrence is the header ``leader_occurrence`` a message carries
(``self.request.leader_occurrence``): ``"<entry>@<slot>"`` from
``LeaderScheduler``, ``"<entry>@manual:<time>"`` for a run asked for by
hand, or any string a sender set itself. The leader remembers the
occurrences of a task whose runs completed, so that another message of the
same occurrence is skipped (:mod:`celery_leader.worker.occurrences`); this
module is the record alone: pure data, no clock of its own (every call that
prunes is given *now*), no I/O.

Parsing (:func:`parse_occurrence`): split at the **last** ``@`` (an entry's
name may hold ``@`` itself). A slot written exactly as beat writes it
(``2026-11-25T09:30:00.000Z``: UTC, milliseconds, ``Z``) is kept as epoch
milliseconds, ``manual:`` and such a time as a manual run of the entry; any
other header is kept whole, as a string. Only exactly that form is read as
a time, so two different headers never fall on one record item.

What is kept, per task:

* per entry, the epoch-ms slots of its completed scheduled occurrences;
* per entry, the request times of its completed manual occurrences;
* other headers whole, with the time their run completed.

Retention (the contract's "remembered for at least 24 hours or two periods
of the entry, whichever is longer"):

* an entry's *period* is the median gap between its retained slots, and its
  *horizon* ``max(24 h, 2 * period)`` (24 h while it has one slot);
* a slot is kept while it is no older than the horizon, measured from the
  slot (the time it was due), not from when its run completed: a run that
  completes long after its slot is remembered for correspondingly less;
* the newest two slots of an entry are kept whatever their age, so that
  the period of an entry rarer than daily is learnt from them; an entry
  with two slots or more is dropped whole once its newest slot is older
  than its horizon (it stopped, or nothing completed for two periods);
* **at most** :data:`MAX_SLOTS` **(2048) slots per entry**, newest kept: an
  entry due more often than every 24 h / 2048 (about 42.2 s) is remembered
  for its last 2048 slots, less than 24 h (a 1 s entry: about 34 minutes);
* manual occurrences: the entry's horizon from their request time, at most
  :data:`MAX_MANUAL` (256) per entry;
* other headers: 24 h from completion, at most :data:`MAX_OTHER` (256);
* at most :data:`MAX_ENTRIES` (1024) entries per task: beyond that, the
  entries whose newest slot is oldest are dropped first.

Serialised (:meth:`OccurrenceRecord.dumps`) as compact JSON with each
entry's slots sorted and delta-encoded (the first slot, then the gaps), and
the fencing token of the term that wrote it.
"""

from __future__ import annotations

import calendar
import itertools
import json
import re
import statistics
from dataclasses import dataclass
from datetime import datetime
from typing import Any

#: Retention floor of every occurrence, milliseconds.
DAY_MS = 24 * 3600 * 1000
#: Most scheduled slots kept per entry (newest first).
MAX_SLOTS = 2048
#: Most manual occurrences kept per entry.
MAX_MANUAL = 256
#: Most other (free-form) headers kept per task.
MAX_OTHER = 256
#: Most entries kept per task.
MAX_ENTRIES = 1024
#: Slots always kept per entry whatever their age: enough to tell its period.
KEPT_NEWEST = 2
#: The version of the serialised form.
VERSION = 1

SLOT, MANUAL, OTHER = "slot", "manual", "other"
_MANUAL_PREFIX = "manual:"
_SLOT_FORM = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z")


@dataclass(frozen=True)
class Occurrence:
    """One header, read: *kind* :data:`SLOT`, :data:`MANUAL` or :data:`OTHER`.

    For a slot or a manual run, *entry* and *at_ms* (epoch milliseconds);
    for another header, *entry* is the whole header and *at_ms* None.
    """

    kind: str
    entry: str
    at_ms: int | None


def slot_ms(text: str) -> int | None:
    """Epoch milliseconds of a slot written as beat writes it; None for any other text."""
    if not _SLOT_FORM.fullmatch(text):
        return None
    try:
        moment = datetime.strptime(text[:-1], "%Y-%m-%dT%H:%M:%S.%f")
    except ValueError:  # the right shape, not a date (February 30th, a leap second)
        return None
    return calendar.timegm(moment.timetuple()) * 1000 + moment.microsecond // 1000


def parse_occurrence(header: str) -> Occurrence:
    """*header* read as ``<entry>@<slot>``, ``<entry>@manual:<time>``, or kept whole."""
    entry, at, slot = header.rpartition("@")
    if at and entry:
        if slot.startswith(_MANUAL_PREFIX):
            moment = slot_ms(slot[len(_MANUAL_PREFIX) :])
            if moment is not None:
                return Occurrence(MANUAL, entry, moment)
        else:
            moment = slot_ms(slot)
            if moment is not None:
                return Occurrence(SLOT, entry, moment)
    return Occurrence(OTHER, header, None)


def period_ms(slots: list[int]) -> int | None:
    """The median gap between sorted *slots*; None with fewer than two."""
    if len(slots) < KEPT_NEWEST:
        return None
    return int(statistics.median_low(b - a for a, b in itertools.pairwise(slots)))


def horizon_ms(slots: list[int]) -> int:
    """How long an entry with sorted *slots* is remembered: ``max(24 h, 2 * period)``."""
    period = period_ms(slots)
    return DAY_MS if period is None else max(DAY_MS, 2 * period)


class OccurrenceRecord:
    """The completed occurrences of one task; see the module docstring. Not thread-safe."""

    def __init__(self) -> None:
        self._slots: dict[str, set[int]] = {}
        self._manual: dict[str, set[int]] = {}
        self._other: dict[str, int] = {}

    def add(self, header: str, now_ms: int) -> None:
        """Record that a run of *header* completed at *now_ms*."""
        occurrence = parse_occurrence(header)
        if occurrence.kind == OTHER:
            self._other[occurrence.entry] = now_ms
            if len(self._other) > 2 * MAX_OTHER:
                self.prune(now_ms)
            return
        assert occurrence.at_ms is not None
        kept = self._slots if occurrence.kind == SLOT else self._manual
        items = kept.setdefault(occurrence.entry, set())
        items.add(occurrence.at_ms)
        # Pruned here only once well past a cap: pruning sorts, and add() is on the per-run path.
        if len(items) > MAX_SLOTS + MAX_MANUAL:
            self.prune(now_ms)

    def __contains__(self, header: object) -> bool:
        if not isinstance(header, str):
            return False
        occurrence = parse_occurrence(header)
        if occurrence.kind == OTHER:
            return occurrence.entry in self._other
        kept = self._slots if occurrence.kind == SLOT else self._manual
        return occurrence.at_ms in kept.get(occurrence.entry, ())

    def __len__(self) -> int:
        return (
            sum(map(len, self._slots.values()))
            + sum(map(len, self._manual.values()))
            + len(self._other)
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, OccurrenceRecord):
            return NotImplemented
        return (self._slots, self._manual, self._other) == (
            other._slots,
            other._manual,
            other._other,
        )

    __hash__ = None  # type: ignore[assignment]  # mutable: not hashable

    def covers(self, other: OccurrenceRecord) -> bool:
        """True when every occurrence *other* holds is in this record too."""
        return (
            all(items <= self._slots.get(e, set()) for e, items in other._slots.items())
            and all(items <= self._manual.get(e, set()) for e, items in other._manual.items())
            and all(header in self._other for header in other._other)
        )

    def merge(self, other: OccurrenceRecord) -> None:
        """Add everything *other* holds (for a header in both, the later completion)."""
        for entry, items in other._slots.items():
            self._slots.setdefault(entry, set()).update(items)
        for entry, items in other._manual.items():
            self._manual.setdefault(entry, set()).update(items)
        for header, at in other._other.items():
            self._other[header] = max(at, self._other.get(header, at))

    def copy(self) -> OccurrenceRecord:
        """An independent copy."""
        twin = OccurrenceRecord()
        twin.merge(self)
        return twin

    def prune(self, now_ms: int) -> None:
        """Forget what the retention rules let go of at *now_ms* (module docstring)."""
        horizons: dict[str, int] = {}
        for entry in list(self._slots):
            slots = sorted(self._slots[entry])
            horizon = horizons[entry] = horizon_ms(slots)
            oldest = now_ms - horizon
            if len(slots) >= KEPT_NEWEST and slots[-1] < oldest:
                del self._slots[entry]  # stopped: two periods without a completed slot
                continue
            newest = slots[-KEPT_NEWEST:]
            kept = [s for s in slots[:-KEPT_NEWEST] if s >= oldest] + newest
            self._slots[entry] = set(kept[-MAX_SLOTS:])
        if len(self._slots) > MAX_ENTRIES:
            by_newest = sorted(self._slots, key=lambda e: max(self._slots[e]), reverse=True)
            for entry in by_newest[MAX_ENTRIES:]:
                del self._slots[entry]
        for entry in list(self._manual):
            oldest = now_ms - horizons.get(entry, DAY_MS)
            kept = sorted(t for t in self._manual[entry] if t >= oldest)[-MAX_MANUAL:]
            if kept:
                self._manual[entry] = set(kept)
            else:
                del self._manual[entry]
        if len(self._manual) > MAX_ENTRIES:
            by_newest = sorted(self._manual, key=lambda e: max(self._manual[e]), reverse=True)
            for entry in by_newest[MAX_ENTRIES:]:
                del self._manual[entry]
        recent = sorted(
            ((at, header) for header, at in self._other.items() if at >= now_ms - DAY_MS),
            reverse=True,
        )[:MAX_OTHER]
        self._other = {header: at for at, header in recent}

    def dumps(self, token: int) -> str:
        """The record as compact JSON, written under the term *token* (call :meth:`prune` first)."""
        document: dict[str, Any] = {
            "v": VERSION,
            "token": token,
            "slots": {e: _deltas(items) for e, items in sorted(self._slots.items())},
            "manual": {e: _deltas(items) for e, items in sorted(self._manual.items())},
            "other": dict(sorted(self._other.items())),
        }
        return json.dumps(document, separators=(",", ":"))

    @classmethod
    def loads(cls, text: str) -> OccurrenceRecord:
        """The record *text* holds; ValueError when it is not one (or of a later version)."""
        document = json.loads(text)
        if not isinstance(document, dict) or document.get("v") != VERSION:
            raise ValueError("not an occurrence record of version 1")
        record = cls()
        try:
            record._slots = {str(e): _undeltas(d) for e, d in document["slots"].items()}
            record._manual = {str(e): _undeltas(d) for e, d in document["manual"].items()}
            record._other = {str(h): int(at) for h, at in document["other"].items()}
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"a malformed occurrence record: {exc}") from None
        return record


def _deltas(items: set[int]) -> list[int]:
    ordered = sorted(items)
    return ordered[:1] + [b - a for a, b in itertools.pairwise(ordered)]


def _undeltas(deltas: list[Any]) -> set[int]:
    total = 0
    items = set()
    for delta in deltas:
        total += int(delta)
        items.add(total)
    return items
