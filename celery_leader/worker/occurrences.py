"""One occurrence runs once: the gate skips another message of an occurrence that runs or ran.

A message whose header ``leader_occurrence`` names an occurrence (the slot
of a beat entry; see :mod:`celery_leader.tasks.occurrence_record`) is
acknowledged without running, its result ``SKIPPED`` with reason
``"occurrence"``, when a run of the same task and the same header

* **runs** on this leader now (another message: another task id), or
* **completed** (returned without raising) under this election, here or on
  an earlier leader whose record reached the lease store.

A run that was killed, raised, retried, or ended with its term does not
count: the message runs again when redelivered. The same message delivered
again while its run goes on is :mod:`celery_leader.worker.redelivery`'s to
decide (it parks); a message with the running run's task id (its retry) is
never skipped here. Messages without the header are untouched.

:class:`Occurrences` is one election's state in this worker, in memory: the
runs in progress by (task name, header) and the completed record of each
task. What is stored, and when, is :mod:`celery_leader.worker.occurrence_sync`'s.
A run is recorded as running only once the gate hands it to the pool
(:meth:`Occurrences.claim`, after the overlap policy admitted it), so a
message skipped or kept waiting by that policy never counts as a run.

Threads: the gate's questions run on the consumer's loop thread, settlement
on any thread, loads and snapshots on the election's sync thread: state sits
under a lock.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from celery_leader.tasks.occurrence_record import OccurrenceRecord
from celery_leader.worker.redelivery import COMPLETED

#: The message header (and ``self.request`` attribute) that names an occurrence.
OCCURRENCE_HEADER = "leader_occurrence"
#: Prefix of the lease-state key of one task's completed record: ``occurrences:<task name>``.
STATE_PREFIX = "occurrences:"
#: Why a message is skipped: its occurrence runs now, or completed.
RUNNING, COMPLETED_ALREADY = "running", "completed"
#: Runs recorded at which dead references are swept out.
_SWEEP_AT = 1024


def occurrence_of(request: Any) -> str | None:
    """The occurrence header of *request*'s message, or None when it has none."""
    header = request._request_dict.get(OCCURRENCE_HEADER)
    return header if isinstance(header, str) and header else None


def wall_ms() -> int:
    """Now, in epoch milliseconds (what slots are written in)."""
    return int(time.time() * 1000)


class Occurrences:
    """One election's occurrences on this worker: running now, and completed (per task)."""

    def __init__(self, clock_ms: Callable[[], int] = wall_ms) -> None:
        self._lock = threading.Lock()
        self._clock_ms = clock_ms
        self._running: dict[tuple[str, str], weakref.ref[Any]] = {}
        self._records: dict[str, OccurrenceRecord] = {}

    # -- the gate (loop thread) -----------------------------------------------

    def verdict(self, request: Any, occurrence: str) -> str | None:
        """Why *request* must be skipped (:data:`RUNNING`, :data:`COMPLETED_ALREADY`), or None.

        A message of the running run itself (the same request, or its task
        id: a retry) is never skipped.
        """
        task = request.task.name
        with self._lock:
            ref = self._running.get((task, occurrence))
            running = ref() if ref is not None else None
            if running is not None and running is not request and running.id != request.id:
                return RUNNING
            record = self._records.get(task)
            if record is not None and occurrence in record:
                return COMPLETED_ALREADY
            return None

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

    def settle(self, request: Any, outcome: str) -> str | None:
        """The run of *request* ended with *outcome*: the task name if its record grew.

        Only :data:`~celery_leader.worker.redelivery.COMPLETED` counts.
        Idempotent: a second report of the same run changes nothing.
        """
        key: tuple[str, str] | None = getattr(request, "leader_occurrence_key", None)
        if key is None:
            return None
        with self._lock:
            ref = self._running.get(key)
            if ref is None or ref() is not request:
                return None
            del self._running[key]
            if outcome != COMPLETED:
                return None
            task, occurrence = key
            self._records.setdefault(task, OccurrenceRecord()).add(occurrence, self._clock_ms())
            return task

    # -- the store's side (the election's sync thread) ------------------------

    def absorb(self, state: Mapping[str, str]) -> tuple[list[str], list[str]]:
        """Merge the records in lease *state* into memory.

        Returns (the tasks whose stored record lacks something this worker
        remembers: to be written, the keys that could not be read).
        """
        stored: dict[str, OccurrenceRecord] = {}
        unreadable = []
        for key, value in state.items():
            if not key.startswith(STATE_PREFIX):
                continue
            try:
                stored[key[len(STATE_PREFIX) :]] = OccurrenceRecord.loads(value)
            except ValueError:
                unreadable.append(key)
        with self._lock:
            for task, record in stored.items():
                self._records.setdefault(task, OccurrenceRecord()).merge(record)
            behind = [
                task
                for task, record in self._records.items()
                if len(record) and not stored.get(task, OccurrenceRecord()).covers(record)
            ]
        return behind, unreadable

    def snapshot(self, task: str, token: int) -> str:
        """Task *task*'s record, pruned to now, serialised as written under term *token*."""
        with self._lock:
            record = self._records.setdefault(task, OccurrenceRecord())
            record.prune(self._clock_ms())
            return record.dumps(token)

    def running(self) -> int:
        """How many occurrences run now."""
        with self._lock:
            return sum(1 for ref in self._running.values() if ref() is not None)
