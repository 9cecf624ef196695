"""One occurrence runs once: the gate skips another message of an occurrence that runs or ran.

A message whose header ``leader_occurrence`` names an occurrence (the slot
of a beat entry; see :mod:`celery_leader.tasks.occurrence_record`) is
acknowledged without running, its result ``SKIPPED`` with reason
``"occurrence"``, when a run of the same task and the same header

* **runs** on this leader now (another message: another task id), or
* **completed** (returned without raising) under this election, here or on
  an earlier leader whose record reached the lease store.

A run that was killed, raised, retried, or ended with its term does not
count: the message runs again when redelivered.

"Runs on this leader now" covers the runs of this leader's terms. A run
that goes on after its term (``on_loss="finish"``, or ``"cancel"`` without
polling :func:`celery_leader.lease_lost`: the only policy in the threads,
solo, gevent and eventlet pools) is in no record the next leader reads, so
the next leader may run its occurrence beside it. Only ``"terminate"`` in a
prefork pool ends every run with its term; the worker warns at start for
each task of ``beat_schedule`` where that is not so
(:mod:`celery_leader.worker.unkillable_runs`). The same message delivered
again while its run goes on is :mod:`celery_leader.worker.redelivery`'s to
decide (it parks); a message with the running run's task id (its retry) is
never skipped here. A message with the task id of the run that *completed*
its occurrence is that run's own message delivered again (its
acknowledgement was lost): it is acknowledged without running and without
touching its result (:data:`REDELIVERED`), as the redelivery record does.
The gate also never overwrites a result that is ready in the result backend
(:func:`result_ready`): the completing run's id is stored only for the
newest items of each entry, so a copy of an older run is told by its result.

Messages without the header are untouched, and so are messages whose header
is not a string (a number, a list): they run as any message does, with no
deduplication. A ``str`` subclass is read as the plain string it holds.

:class:`Occurrences` is one election's state in this worker, in memory: the
runs in progress by (task name, header) and the completed record, one
:class:`~celery_leader.tasks.occurrence_record.OccurrenceRecord` per
*shard*: per task and entry, and one per task for other headers. Each shard
is one key of the lease state (:func:`state_key`). What is stored, and when,
is :mod:`celery_leader.worker.occurrence_sync`'s. A run is recorded as
running only once the gate hands it to the pool (:meth:`Occurrences.claim`,
after the overlap policy admitted it), so a message skipped or kept waiting
by that policy never counts as a run.

Threads: the gate's questions run on the consumer's loop thread, settlement
on any thread, loads, snapshots and sweeps on the election's sync thread:
state sits under a lock, held only for dictionary work on one shard at a
time (never for a sort, a prune or serialisation: those run on copies).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

from celery_leader.tasks.occurrence_record import (
    MAX_ENTRIES,
    OTHER,
    OccurrenceRecord,
    parse_occurrence,
)
from celery_leader.worker.redelivery import COMPLETED

logger = logging.getLogger(__name__)

#: The message header (and ``self.request`` attribute) that names an occurrence.
OCCURRENCE_HEADER = "leader_occurrence"
#: Prefix of the lease-state keys of the record; see :func:`state_key`.
STATE_PREFIX = "occurrences:"
#: Why a message is not run: its occurrence runs now, or completed; or it is the completing
#: run's own message again (acknowledged, its result left as it is).
RUNNING, COMPLETED_ALREADY, REDELIVERED = "running", "completed", "redelivered"
#: Runs recorded at which dead references are swept out.
_SWEEP_AT = 1024

#: One shard of the record: (task name, entry), or (task name, None) for the task's other headers.
Shard: TypeAlias = tuple[str, str | None]


def state_key(shard: Shard) -> str:
    """The lease-state key of *shard*: ``occurrences:["<task>","<entry>"]``, or ``["<task>"]``.

    JSON (compact, ASCII), so any character in a task's or an entry's name,
    ``@`` and ``:`` included, gives one key and reads back as the same names.
    """
    task, entry = shard
    return STATE_PREFIX + json.dumps(
        [task] if entry is None else [task, entry], separators=(",", ":")
    )


def parse_state_key(key: str) -> Shard | None:
    """The shard of lease-state *key*; None unless it is exactly what :func:`state_key` writes."""
    if not key.startswith(STATE_PREFIX):
        return None
    try:
        names = json.loads(key[len(STATE_PREFIX) :])
    except Exception:  # noqa: BLE001 - not JSON, or nested deep enough to exhaust the parser
        return None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return None
    if len(names) == 1:
        shard: Shard = (names[0], None)
    elif len(names) == 2:  # noqa: PLR2004
        shard = (names[0], names[1])
    else:
        return None
    # Only the one spelling we write: another would be a second key for one shard.
    return shard if state_key(shard) == key else None


def shard_of(task: str, occurrence: str) -> Shard:
    """The shard that records *occurrence* of task *task*."""
    found = parse_occurrence(occurrence)
    return (task, None if found.kind == OTHER else found.entry)


def occurrence_of(request: Any) -> str | None:
    """The occurrence header of *request*'s message, or None when it has none.

    Only a non-empty string counts (a ``str`` subclass as the plain string it
    holds); any other value means no deduplication for the message.
    """
    header = request._request_dict.get(OCCURRENCE_HEADER)
    if not isinstance(header, str) or not header:
        return None
    return str.__str__(header)  # the exact str: a subclass's own __eq__ or __hash__ never applies


def result_ready(task: Any, task_id: str) -> bool:
    """True when the result backend holds a ready state (SUCCESS, FAILURE...) for *task_id*.

    The gate asks before it writes ``SKIPPED``, so as never to overwrite the
    result of a run that completed. False whenever it cannot tell: the task
    ignores results (nothing is written then anyway), the backend is disabled
    or the RPC one (results travel to the caller as messages: no state to
    read), or the read fails. One backend read, on the loop, per skipped
    message only.
    """
    if getattr(task, "ignore_result", False):
        return False
    from celery import states  # noqa: PLC0415 - Celery's own, imported where needed
    from celery.backends.base import DisabledBackend  # noqa: PLC0415
    from celery.backends.rpc import RPCBackend  # noqa: PLC0415

    try:
        backend = task.backend
        if isinstance(backend, (DisabledBackend, RPCBackend)):
            return False
        return bool(backend.get_state(task_id) in states.READY_STATES)
    except Exception:  # unknown means: write the skip as before
        logger.debug("celery-leader: could not read the result of %s", task_id, exc_info=True)
        return False


def wall_ms() -> int:
    """Now, in epoch milliseconds (what slots are written in)."""
    return int(time.time() * 1000)


class Occurrences:
    """One election's occurrences on this worker: running now, and completed (per shard)."""

    def __init__(self, clock_ms: Callable[[], int] = wall_ms) -> None:
        self._lock = threading.Lock()
        self._clock_ms = clock_ms
        self._running: dict[tuple[str, str], weakref.ref[Any]] = {}
        self._records: dict[Shard, OccurrenceRecord] = {}

    # -- the gate (loop thread) -----------------------------------------------

    def verdict(self, request: Any, occurrence: str) -> str | None:
        """Why *request* must not run (:data:`RUNNING`, :data:`COMPLETED_ALREADY`...), or None.

        A message of the running run itself (the same request, or its task
        id: a retry) is never skipped. One with the task id of the run that
        completed the occurrence is :data:`REDELIVERED`.
        """
        task = request.task.name
        found = parse_occurrence(occurrence)
        shard: Shard = (task, None if found.kind == OTHER else found.entry)
        with self._lock:
            ref = self._running.get((task, occurrence))
            running = ref() if ref is not None else None
            if running is not None and running is not request and running.id != request.id:
                return RUNNING
            record = self._records.get(shard)
            by = record.completed_by(found) if record is not None else None
        if by is None:
            return None
        return REDELIVERED if by and by == request.id else COMPLETED_ALREADY

    def claim(self, request: Any, occurrence: str) -> None:
        """*request* goes to the pool now: it is the running run of its occurrence."""
        key = (request.task.name, occurrence)
        request.leader_occurrence_key = key
        with self._lock:
            if len(self._running) >= _SWEEP_AT:
                # A run always settles; this only bounds what a missed settlement could leave.
                self._running = {k: r for k, r in self._running.items() if r() is not None}
            self._running[key] = weakref.ref(request)

    # -- settlement (any thread) ----------------------------------------------

    def settle(self, request: Any, outcome: str) -> Shard | None:
        """The run of *request* ended with *outcome*: the shard that grew, if one did.

        Only :data:`~celery_leader.worker.redelivery.COMPLETED` counts; the
        item keeps the run's task id. Idempotent: a second report of the same
        run changes nothing.
        """
        key: tuple[str, str] | None = getattr(request, "leader_occurrence_key", None)
        if key is None:
            return None
        task, occurrence = key
        found = parse_occurrence(occurrence)
        shard: Shard = (task, None if found.kind == OTHER else found.entry)
        task_id = str(request.id or "")
        with self._lock:
            ref = self._running.get(key)
            if ref is None or ref() is not request:
                return None
            del self._running[key]
            if outcome != COMPLETED:
                return None
            record = self._records.setdefault(shard, OccurrenceRecord())
            record.add(found, self._clock_ms(), task_id)
            return shard

    def running(self) -> int:
        """How many occurrences run now."""
        with self._lock:
            return sum(1 for ref in self._running.values() if ref() is not None)

    def unsettled(self, token: int, gone: Callable[[Any], bool] | None = None) -> int:
        """How many runs admitted under term *token* have not settled, not counting those *gone*.

        *gone(request)* says a run's process is known to have exited (killed):
        its completion cannot be on its way, and a stuck loop would never
        settle it.
        """
        with self._lock:
            runs = [run for ref in self._running.values() if (run := ref()) is not None]
        mine = [r for r in runs if getattr(r, "leader_token", None) == token]
        return sum(1 for r in mine if gone is None or not gone(r))

    # -- the store's side (the election's sync thread) ------------------------

    def absorb(self, state: Mapping[str, str]) -> tuple[list[Shard], list[str]]:
        """Merge the records in lease *state* into memory, pruned to now.

        Returns (the shards to write: those whose stored record lacks
        something this worker remembers, or holds only what is forgotten by
        now; the keys that could not be read). Parsing and pruning run
        outside the lock; each shard is merged under it on its own.
        """
        now = self._clock_ms()
        stored: dict[Shard, OccurrenceRecord] = {}
        had: dict[Shard, int] = {}
        unreadable = []
        for key, value in state.items():
            if not key.startswith(STATE_PREFIX):
                continue
            shard = parse_state_key(key)
            try:
                if shard is None:
                    raise ValueError("not a key of this version")  # noqa: TRY301 - one path
                record = OccurrenceRecord.loads(value)
            except ValueError:
                unreadable.append(key)
                continue
            had[shard] = len(record)
            record.prune(now)  # what the rules let go of by now is not merged
            stored[shard] = record
        behind = []
        for shard, record in stored.items():
            with self._lock:
                mine = self._records.get(shard)
                if mine is None:
                    if len(record):
                        self._records[shard] = record
                    elif had[shard]:
                        behind.append(shard)  # all forgotten by now: written empty
                    continue
                mine.merge(record)
                if not record.covers(mine):
                    behind.append(shard)
        with self._lock:
            behind += [s for s, r in self._records.items() if s not in stored and len(r)]
        return behind, unreadable

    def snapshot(self, shard: Shard, token: int) -> str:
        """Shard *shard*'s record, pruned to now, serialised as written under term *token*.

        A shard this worker forgot is written empty: the stored one is
        replaced by what is left of it (nothing). Copied under the lock,
        pruned and serialised outside it; what the prune let go of is then
        forgotten in memory too.
        """
        with self._lock:
            live = self._records.get(shard)
            copy = live.copy() if live is not None else OccurrenceRecord()
        forgotten = copy.prune(self._clock_ms())
        text = copy.dumps(token)
        if len(forgotten):
            self._forget(shard, forgotten)
        return text

    def sweep(self) -> list[Shard]:
        """Prune every shard to now, and cap each task at MAX_ENTRIES entries.

        Returns the shards forgotten whole (to be written empty). One shard
        at a time: each is copied under the lock and pruned outside it.
        """
        now = self._clock_ms()
        with self._lock:
            shards = list(self._records)
        emptied: list[Shard] = []
        newest: dict[str, list[tuple[int, Shard]]] = {}
        for shard in shards:
            with self._lock:
                live = self._records.get(shard)
                copy = live.copy() if live is not None else None
            if copy is None:
                continue
            forgotten = copy.prune(now)
            if len(forgotten) and self._forget(shard, forgotten):
                emptied.append(shard)
                continue
            task, entry = shard
            if entry is not None:
                newest.setdefault(task, []).append((copy.newest_ms() or 0, shard))
        for entries in newest.values():
            if len(entries) <= MAX_ENTRIES:
                continue
            entries.sort(reverse=True)
            with self._lock:
                for _, shard in entries[MAX_ENTRIES:]:
                    if self._records.pop(shard, None) is not None:
                        emptied.append(shard)
        return emptied

    def _forget(self, shard: Shard, forgotten: OccurrenceRecord) -> bool:
        """Forget *forgotten* from *shard*; True when the shard is gone as a result."""
        with self._lock:
            live = self._records.get(shard)
            if live is None:
                return False
            live.discard(forgotten)
            if len(live):
                return False
            del self._records[shard]
            return True
