"""Which occurrences of one entry of a task completed: a compact record, and how long it keeps them.

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
(``2026-11-25T09:30:00.000Z``: UTC, milliseconds, ``Z``, ASCII digits only)
is kept as epoch milliseconds, ``manual:`` and such a time as a manual run
of the entry; any other header is kept whole, as a string. Only exactly
that form is read as a time, so two different headers never fall on one
record item.

One :class:`OccurrenceRecord` holds one *shard* of a task's record, which
is what one key of the store holds:

* an entry's shard: the epoch-ms slots of its completed scheduled
  occurrences and the request times of its completed manual occurrences;
* the task's *other* shard: other headers whole, with the time their run
  completed.

Each item keeps the task id of the run that completed it ("" when not known:
read from a store that kept none), so that the same message delivered again
is told from another message of the same occurrence.

Retention (the contract's "remembered for at least 24 hours or two periods
of the entry, whichever is longer", counted from when the run completed):

* an entry's *period* is the median gap between its retained slots, and its
  *horizon* ``max(24 h, 2 * period)`` (24 h while it has one slot);
* an item is kept while ``max(its time, its completion) >= now - horizon``.
  Completions at most :data:`LATE_MS` (15 min) after the item's time are not
  stored: such an item counts as completed :data:`LATE_MS` after its time
  (kept up to that much longer than needed); a later completion is stored
  with the item (a slot run in a catch-up or a backlog is remembered for a
  full horizon from when it completed);
* the newest two slots of an entry are kept whatever their age, so that the
  period of an entry rarer than daily is learnt from them; an entry with
  two slots or more is dropped whole once its newest completion is older
  than its horizon (it stopped, or nothing completed for two periods);
* an entry with one slot (a one-off entry, or the first run of a rare one)
  keeps it :data:`LONE_MS` (32 days) from its completion: a monthly entry
  learns its period, an entry rarer than that is remembered 32 days per slot;
* **at most** :data:`MAX_SLOTS` **(2048) slots per entry**, newest kept: an
  entry due more often than every 24 h / 2048 (about 42.2 s) is remembered
  for its last 2048 slots, less than 24 h (a 1 s entry: about 34 minutes);
* manual occurrences: the entry's horizon (24 h for an entry with fewer than
  two slots) from their completion, at most :data:`MAX_MANUAL` (256) per entry;
* other headers: 24 h from completion, at most :data:`MAX_OTHER` (256) per task;
* at most :data:`MAX_ENTRIES` (1024) entries per task (applied across shards
  by :mod:`celery_leader.worker.occurrences`): beyond that, the entries whose
  newest completion is oldest are dropped first.

Serialised (:meth:`OccurrenceRecord.dumps`) as compact JSON, version
:data:`VERSION`, with the fencing token of the term that wrote it: each
kind's times sorted and delta-encoded (the first time, then the gaps), the
late completions as ``[index, completion - time]`` pairs, and the task ids of
the newest :data:`STORED_IDS` items of each kind as ``[index, id]`` pairs
(of every other header). :meth:`OccurrenceRecord.loads` refuses anything
else with ValueError, whatever is wrong with it.
"""

from __future__ import annotations

import calendar
import itertools
import json
import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

#: Retention floor of every occurrence, milliseconds.
DAY_MS = 24 * 3600 * 1000
#: How long the lone slot of an entry is kept from its completion, milliseconds.
LONE_MS = 32 * DAY_MS
#: A completion up to this long after its item's time is not stored (ms): see the module.
LATE_MS = 15 * 60 * 1000
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
#: Completing task ids stored per kind of an entry's shard (the newest items'); all in memory.
STORED_IDS = 8
#: The version of the serialised form.
VERSION = 2

SLOT, MANUAL, OTHER = "slot", "manual", "other"
_MANUAL_PREFIX = "manual:"
# ASCII: \d would also match other scripts' digits, which strptime reads as the same slot.
_SLOT_FORM = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z", re.ASCII)
#: Times and deltas read from a store are refused outside this range (epoch ms fit easily).
_LIMIT = 2**62


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


@dataclass
class _Kept:
    """The completed items of one kind (slots, or manual runs) of one entry."""

    #: Item time (epoch ms) -> the task id of the run that completed it ("": not known).
    ids: dict[int, str] = field(default_factory=dict)
    #: Item time -> completion time, only for completions more than LATE_MS after the item.
    late: dict[int, int] = field(default_factory=dict)

    def add(self, at: int, done: int, task_id: str) -> None:
        self.ids[at] = task_id
        if done - at > LATE_MS:
            self.late[at] = max(done, self.late.get(at, done))

    def effective(self, at: int) -> int:
        """When item *at* counts as completed for retention (see the module docstring)."""
        return self.late.get(at, at + LATE_MS)

    def newest(self) -> int | None:
        return max(map(self.effective, self.ids), default=None)

    def merge(self, other: _Kept) -> None:
        for at, task_id in other.ids.items():
            if not self.ids.get(at):  # a known id wins over an unknown one; ours over theirs
                self.ids[at] = task_id
        for at, done in other.late.items():
            self.late[at] = max(done, self.late.get(at, done))

    def keep(self, kept: Iterable[int], forgotten: _Kept) -> None:
        """Keep only the items *kept*; the others move to *forgotten*."""
        wanted = set(kept)
        for at in [at for at in self.ids if at not in wanted]:
            forgotten.ids[at] = self.ids.pop(at)
            done = self.late.pop(at, None)
            if done is not None:
                forgotten.late[at] = done

    def copy(self) -> _Kept:
        return _Kept(dict(self.ids), dict(self.late))

    def dump(self, document: dict[str, Any], name: str, stored_ids: int) -> None:
        if not self.ids:
            return
        ordered = sorted(self.ids)
        document[name] = ordered[:1] + [b - a for a, b in itertools.pairwise(ordered)]
        late = [[i, self.late[at] - at] for i, at in enumerate(ordered) if at in self.late]
        if late:
            document[f"{name}_late"] = late
        first = max(len(ordered) - stored_ids, 0)
        ids = [
            [i, self.ids[ordered[i]]] for i in range(first, len(ordered)) if self.ids[ordered[i]]
        ]
        if ids:
            document[f"{name}_ids"] = ids

    @classmethod
    def load(cls, document: dict[str, Any], name: str) -> _Kept:
        ordered = list(itertools.accumulate(_ints(document.get(name, []))))
        kept = cls(dict.fromkeys(ordered, ""))
        for index, delta in _pairs(document.get(f"{name}_late", []), len(ordered), int):
            kept.late[ordered[index]] = ordered[index] + _int(delta)
        for index, task_id in _pairs(document.get(f"{name}_ids", []), len(ordered), str):
            kept.ids[ordered[index]] = task_id
        return kept


class OccurrenceRecord:
    """One shard of a task's completed occurrences; see the module docstring. Not thread-safe."""

    def __init__(self) -> None:
        self._slots = _Kept()
        self._manual = _Kept()
        #: Other header -> (completion time, completing task id).
        self._other: dict[str, tuple[int, str]] = {}

    def add(self, occurrence: Occurrence | str, now_ms: int, task_id: str = "") -> None:
        """Record that a run (task id *task_id*) of *occurrence* completed at *now_ms*."""
        if isinstance(occurrence, str):
            occurrence = parse_occurrence(occurrence)
        if occurrence.kind == OTHER:
            self._other[occurrence.entry] = (now_ms, task_id)
            if len(self._other) > 2 * MAX_OTHER:
                self.prune(now_ms)
            return
        assert occurrence.at_ms is not None
        kept = self._slots if occurrence.kind == SLOT else self._manual
        kept.add(occurrence.at_ms, now_ms, task_id)
        # Pruned here only once well past a cap: pruning sorts, and add() is on the per-run path.
        if len(kept.ids) > MAX_SLOTS + MAX_MANUAL:
            self.prune(now_ms)

    def completed_by(self, occurrence: Occurrence | str) -> str | None:
        """The task id of the run that completed *occurrence* ("": unknown); None: not completed."""
        if isinstance(occurrence, str):
            occurrence = parse_occurrence(occurrence)
        if occurrence.kind == OTHER:
            found = self._other.get(occurrence.entry)
            return None if found is None else found[1]
        assert occurrence.at_ms is not None
        kept = self._slots if occurrence.kind == SLOT else self._manual
        return kept.ids.get(occurrence.at_ms)

    def __contains__(self, header: object) -> bool:
        if not isinstance(header, (str, Occurrence)):
            return False
        return self.completed_by(header) is not None

    def __len__(self) -> int:
        return len(self._slots.ids) + len(self._manual.ids) + len(self._other)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, OccurrenceRecord):
            return NotImplemented
        return (self._slots, self._manual, self._other) == (
            other._slots,
            other._manual,
            other._other,
        )

    __hash__ = None  # type: ignore[assignment]  # mutable: not hashable

    def newest_ms(self) -> int | None:
        """When the newest completion kept counts as completed (for retention); None when empty."""
        times = [self._slots.newest(), self._manual.newest()]
        times += [at for at, _ in self._other.values()]
        return max((t for t in times if t is not None), default=None)

    def covers(self, other: OccurrenceRecord) -> bool:
        """True when every occurrence *other* holds is in this record too."""
        return (
            other._slots.ids.keys() <= self._slots.ids.keys()
            and other._manual.ids.keys() <= self._manual.ids.keys()
            and other._other.keys() <= self._other.keys()
        )

    def merge(self, other: OccurrenceRecord) -> None:
        """Add everything *other* holds (for an item in both, the later completion)."""
        self._slots.merge(other._slots)
        self._manual.merge(other._manual)
        for header, (at, task_id) in other._other.items():
            mine = self._other.get(header)
            if mine is None:
                self._other[header] = (at, task_id)
            else:
                self._other[header] = (max(at, mine[0]), mine[1] or task_id)

    def copy(self) -> OccurrenceRecord:
        """An independent copy."""
        twin = OccurrenceRecord()
        twin._slots = self._slots.copy()
        twin._manual = self._manual.copy()
        twin._other = dict(self._other)
        return twin

    def discard(self, dropped: OccurrenceRecord) -> None:
        """Forget the items of *dropped* (what :meth:`prune` returned for a copy of this record).

        An item recorded again since (another completing task id) is kept.
        """
        for mine, theirs in ((self._slots, dropped._slots), (self._manual, dropped._manual)):
            for at, task_id in theirs.ids.items():
                if mine.ids.get(at) == task_id:
                    del mine.ids[at]
                    mine.late.pop(at, None)
        for header, item in dropped._other.items():
            if self._other.get(header) == item:
                del self._other[header]

    def prune(self, now_ms: int) -> OccurrenceRecord:
        """Forget what the retention rules let go of at *now_ms*; returns what was forgotten."""
        forgotten = OccurrenceRecord()
        slots = sorted(self._slots.ids)
        horizon = horizon_ms(slots)
        if len(slots) < KEPT_NEWEST:
            kept = [s for s in slots if self._slots.effective(s) >= now_ms - LONE_MS]
        elif (self._slots.newest() or 0) < now_ms - horizon:
            kept = []  # stopped: two periods without a completed slot
        else:
            oldest = now_ms - horizon
            older = [s for s in slots[:-KEPT_NEWEST] if self._slots.effective(s) >= oldest]
            kept = (older + slots[-KEPT_NEWEST:])[-MAX_SLOTS:]
        self._slots.keep(kept, forgotten._slots)
        oldest = now_ms - horizon  # the entry's horizon; 24 h with fewer than two slots
        manual = sorted(t for t in self._manual.ids if self._manual.effective(t) >= oldest)
        self._manual.keep(manual[-MAX_MANUAL:], forgotten._manual)
        recent = sorted(
            ((item, header) for header, item in self._other.items() if item[0] >= now_ms - DAY_MS),
            reverse=True,
        )[:MAX_OTHER]
        forgotten._other = dict(self._other)
        self._other = {header: item for item, header in recent}
        for header in self._other:
            del forgotten._other[header]
        return forgotten

    def dumps(self, token: int) -> str:
        """The record as compact JSON, written under the term *token* (call :meth:`prune` first)."""
        document: dict[str, Any] = {"v": VERSION, "token": token}
        self._slots.dump(document, "slots", STORED_IDS)
        self._manual.dump(document, "manual", STORED_IDS)
        if self._other:
            document["other"] = {
                header: [at, task_id] if task_id else [at]
                for header, (at, task_id) in sorted(self._other.items())
            }
        return json.dumps(document, separators=(",", ":"))

    @classmethod
    def loads(cls, text: str) -> OccurrenceRecord:
        """The record *text* holds; ValueError when it is not one of this version.

        Any malformed value, however it fails (a float such as ``1e999``,
        nesting deep enough to exhaust the parser, a wrong type anywhere),
        is a ValueError: the caller skips that key, whatever is in it.
        """
        try:
            return cls._read(json.loads(text))
        except Exception as exc:  # noqa: BLE001 - any failure at all means: not a record
            raise ValueError(
                f"a malformed occurrence record: {type(exc).__name__}: {exc}"
            ) from None

    @classmethod
    def _read(cls, document: Any) -> OccurrenceRecord:
        if not isinstance(document, dict) or document.get("v") != VERSION:
            raise ValueError(f"not an occurrence record of version {VERSION}")
        record = cls()
        record._slots = _Kept.load(document, "slots")
        record._manual = _Kept.load(document, "manual")
        other = document.get("other", {})
        if not isinstance(other, dict):
            raise TypeError("other is not an object")
        for header, item in other.items():
            if not isinstance(item, list) or not 1 <= len(item) <= 2:  # noqa: PLR2004
                raise TypeError(f"other header {header!r}: not [time] or [time, id]")
            task_id = item[1] if len(item) == 2 else ""  # noqa: PLR2004
            if not isinstance(task_id, str):
                raise TypeError(f"other header {header!r}: the task id is no string")
            record._other[str(header)] = (_int(item[0]), task_id)
        return record


def _int(value: Any) -> int:
    """*value* when it is an int in range (not a bool, not a float); TypeError otherwise."""
    if type(value) is not int or not -_LIMIT < value < _LIMIT:
        raise TypeError(f"{value!r} is not an integer in range")
    return value


def _ints(values: Any) -> list[int]:
    if not isinstance(values, list):
        raise TypeError("not a list")
    return [_int(v) for v in values]


def _pairs(values: Any, size: int, kind: type) -> list[tuple[int, Any]]:
    """``[[index, value], ...]`` with each index into a list of *size*, each value a *kind*."""
    if not isinstance(values, list):
        raise TypeError("not a list")
    pairs = []
    for pair in values:
        if not isinstance(pair, list) or len(pair) != 2:  # noqa: PLR2004
            raise TypeError(f"{pair!r} is not a pair")
        index, value = _int(pair[0]), pair[1]
        if not 0 <= index < size or not isinstance(value, kind):
            raise TypeError(f"{pair!r}: index out of range or a value of the wrong type")
        pairs.append((index, value))
    return pairs
