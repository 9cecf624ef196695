"""The beat leader's side of the schedule controls: pauses, run-now requests, the view.

One :class:`Steering` per beat. While the beat leads it

* reads the control slot (:mod:`celery_leader.beat.controls`) every
  :data:`CONTROL_POLL` seconds on a helper thread, and once, before anything
  is sent, when it takes a term over (a beat that cannot read it then sends
  nothing until it can: a pause must hold across failovers);
* answers "is this entry paused now" from what it read last, so a pause takes
  effect within :data:`CONTROL_POLL` plus one tick of being written;
* lists the run-now requests it has not carried out (each is carried out
  once per request id: in memory for its own term, and through the record
  the send writes into beat's state, under the publish guard, for the terms
  after it; a leader that dies
  between the send and that record leaves the request to the next, which
  sends it again under the same manual occurrence, so the worker's
  occurrence record skips it if the first run completed);
* publishes its view of the schedule into beat's state: after a control
  changed or an entry was sent, at most once per :data:`VIEW_MIN_GAP`, and
  every :data:`VIEW_EVERY` seconds regardless.

Every store call is bounded by ``leader_store_timeout`` (the election's
bounded calls); a failure is logged and tried again at the next poll.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from celery_leader.beat.controls import (
    VIEW_KEY,
    Controls,
    RunRequest,
    control_slot,
    ran_records,
)
from celery_leader.beat.occurrence import slot_after
from celery_leader.beat.schedule_text import schedule_text
from celery_leader.beat.state import schedule_time
from celery_leader.exceptions import StoreError

logger = logging.getLogger(__name__)

#: The longest the beat leader goes between two reads of the control slot, seconds.
CONTROL_POLL = 0.5
#: The shortest gap between two publishes of the view, seconds.
VIEW_MIN_GAP = 1.0
#: The longest gap between two publishes of the view, seconds.
VIEW_EVERY = 5.0
#: How far a commanding host's clock may be ahead before its expired request counts as over.
CLOCK_ALLOWANCE = 60.0
#: The shortest gap between two warnings that the control slot cannot be read, seconds.
WARN_EVERY = 30.0


class Steering:
    """Pauses and run-now requests as the beat leader last read them, and its published view.

    *read_state* reads a lease name's state; *write_state* writes one key of
    beat's own state under the lease id it is given (False when the store
    refuses: that lease is gone). Both are bounded by the store timeout and
    raise :class:`~celery_leader.exceptions.StoreError`.

    Threads: beat's loop asks and tells (``paused_until``, ``pending_runs``,
    ``ran``, ``publish``) without waiting on the store; a helper thread of its
    own reads the control slot every :data:`CONTROL_POLL` seconds while beat
    leads and writes what the loop left for it (the latest view, run-now
    records). So a slow store costs beat's tick nothing here. Only
    :meth:`take_over` reads on the loop: once per term, before the first
    send, while beat counts as taking over.
    """

    def __init__(
        self,
        beat_election: str,
        read_state: Callable[[str], Mapping[str, str]],
        write_state: Callable[[str, str, str], bool],
    ) -> None:
        self._slot = control_slot(beat_election)
        self._read_state = read_state
        self._write_state = write_state
        #: Replaced whole by the helper thread; read by beat's loop.
        self.controls = Controls.empty()
        #: Entry -> the run-now request id carried out last (by this beat or an earlier leader).
        self._ran: dict[str, str] = {}
        #: Run-now request id -> when this beat first saw it (monotonic).
        self._first_seen: dict[str, float] = {}
        #: When an unreadable control slot was last reported (monotonic).
        self._warned_at = -math.inf
        self._published_at = -math.inf
        self._view_dirty = True
        #: The lease id of the term that writes, while beat leads; None otherwise.
        self._lease_id: str | None = None
        #: Beat-state key -> (lease id, value) left for the helper thread to write.
        self._writes: dict[str, tuple[str, str]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = False
        self._thread: threading.Thread | None = None

    # -- the helper thread ----------------------------------------------------

    def _run(self) -> None:
        while not self._stopped:
            self._wake.wait(CONTROL_POLL)
            self._wake.clear()
            if self._stopped:
                return
            if self._lease_id is not None:
                self._read()
            self._flush()

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="celery-leader-beat-steering", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        """Stop the helper thread (beat closes)."""
        self._stopped = True
        self._wake.set()

    def _read(self) -> bool:
        try:
            state = self._read_state(self._slot)
        except StoreError as exc:
            now = time.monotonic()
            if now - self._warned_at >= WARN_EVERY:  # a tick's retry is no news
                self._warned_at = now
                logger.warning(
                    "celery-leader beat: could not read the schedule controls (lease name %s): %s",
                    self._slot,
                    exc,
                )
            return False
        controls = Controls.from_state(state)
        if controls != self.controls:
            self._log_changes(self.controls, controls)
            self.controls = controls
            self._view_dirty = True
        return True

    def _flush(self) -> None:
        with self._lock:
            writes, self._writes = self._writes, {}
        for key, (lease_id, value) in writes.items():
            try:
                if not self._write_state(lease_id, key, value):
                    logger.debug("celery-leader beat: %s not written: the term is over", key)
            except StoreError as exc:
                logger.warning("celery-leader beat: could not write %s: %s", key, exc)
                with self._lock:  # tried again at the next poll, unless a newer value came
                    self._writes.setdefault(key, (lease_id, value))

    def _write(self, key: str, value: str) -> None:
        lease_id = self._lease_id
        if lease_id is None:
            return
        with self._lock:
            self._writes[key] = (lease_id, value)
        self._wake.set()

    # -- beat's loop ------------------------------------------------------------

    def take_over(self, beat_state: Mapping[str, str], lease_id: str) -> bool:
        """A term begins: read the controls now; False when they could not be read.

        *beat_state* is beat's own state as just read (its run-now records);
        *lease_id* the new term's, under which the view and records are written.
        """
        records = ran_records(beat_state)
        self._ran = {entry: str(record.get("id")) for entry, record in records.items()}
        self._view_dirty = True
        if not self._read():
            return False
        self._lease_id = lease_id
        self._ensure_thread()
        return True

    def term_over(self) -> None:
        """Beat stopped leading: stop reading the controls; nothing more is written."""
        self._lease_id = None
        with self._lock:
            self._writes.clear()

    def paused_until(self, entry: str) -> float | None:
        """When *entry*'s pause ends (``inf``: until resumed), or None when it is not paused."""
        return self.controls.paused_until(entry)

    def pending_runs(self) -> list[RunRequest]:
        """The run-now requests not carried out yet and not expired.

        A request lives ``lifetime`` seconds from when this beat first saw
        it, on this beat's own clock; one whose ``expires`` passed more than
        :data:`CLOCK_ALLOWANCE` ago by this beat's wall clock is over too (the
        command gave up on it long ago: no beat led then).
        """
        now, wall = time.monotonic(), time.time()
        # Only the requests the slot still holds are remembered (a new one replaces its entry's).
        asked = {request.id for request in self.controls.runs.values()}
        self._first_seen = {key: at for key, at in self._first_seen.items() if key in asked}
        pending = []
        for entry, request in self.controls.runs.items():
            if self._ran.get(entry) == request.id:
                continue
            seen = self._first_seen.setdefault(request.id, now)
            if now - seen > request.lifetime or wall > request.expires + CLOCK_ALLOWANCE:
                continue
            pending.append(request)
        return pending

    def attempted(self, request: RunRequest) -> None:
        """*request* was carried out (or tried) in this term: never again in it."""
        self._ran[request.entry] = request.id

    def sent(self) -> None:
        """An entry was sent or its slot skipped: the view changed."""
        self._view_dirty = True

    # -- the view ---------------------------------------------------------------

    def publish_due(self) -> bool:
        """True when the view should be published now."""
        since = time.monotonic() - self._published_at
        return since >= VIEW_EVERY or (self._view_dirty and since >= VIEW_MIN_GAP)

    def publishing(self) -> None:
        """A view is about to be built: what changes from now on makes the next one due."""
        self._published_at = time.monotonic()
        self._view_dirty = False

    def publish(self, view: dict[str, Any]) -> None:
        """Leave *view* for the helper thread to write into beat's state."""
        self._write(VIEW_KEY, json.dumps(view))

    def view(
        self,
        entries: Iterable[Any],
        marks: Mapping[str, Mapping[str, Any]],
        describe: Callable[[Any], dict[str, Any]],
    ) -> list[dict[str, Any]]:
        """One row per entry: the contract's keys, plus what *describe* adds."""
        rows = []
        for entry in entries:
            until = self.paused_until(entry.name)
            row: dict[str, Any] = {
                "name": entry.name,
                "task": entry.task,
                "schedule": schedule_text(entry.schedule),
                "last_sent": last_sent(marks.get(entry.name)),
                "next_due": next_due(entry, marks.get(entry.name)),
                "paused": until is not None,
                "paused_until": None if until is None or math.isinf(until) else until,
                # The pause or resume this view reflects (the command waits for its own).
                "control_at": self.controls.stamps.get(entry.name),
            }
            row.update(describe(entry))
            rows.append(row)
        return sorted(rows, key=lambda row: str(row["name"]))

    @staticmethod
    def _log_changes(before: Controls, after: Controls) -> None:
        for entry in sorted(set(before.pauses) | set(after.pauses)):
            was, now = before.pauses.get(entry), after.pauses.get(entry)
            if now is not None and was != now:
                until = "until resumed" if math.isinf(now) else f"until {_utc(now)}"
                logger.info("celery-leader beat: %s is paused %s", entry, until)
            elif now is None and was is not None:
                logger.info("celery-leader beat: %s is resumed", entry)


def last_sent(mark: Mapping[str, Any] | None) -> float | None:
    """When an entry was last sent, from its mark (a paused slot's mark keeps the send's time)."""
    if not mark:
        return None
    sent = mark.get("sent", mark.get("at"))
    return float(sent) if isinstance(sent, (int, float)) else None


def next_due(entry: Any, mark: Mapping[str, Any] | None) -> float | None:
    """When *entry* is next due (unix time): its schedule's first slot after its latest run.

    The latest run is the latest of what the entry says (``last_run_at``),
    what its database row says (django-celery-beat moves the row's
    ``last_run_at`` at each send, while the entry its scheduler keeps by name
    holds the time it was loaded with until the table is read again), and
    the send mark (*mark*'s ``at``: the last send, or the slot a pause
    skipped). So the next due time never comes before the last send it
    follows. Naive times count as UTC, as Celery and django-celery-beat read
    them. None for a schedule whose next slot cannot be told.
    """
    runs: list[dt.datetime] = []
    for run in (
        getattr(entry, "last_run_at", None),
        getattr(getattr(entry, "model", None), "last_run_at", None),
    ):
        if isinstance(run, dt.datetime):
            runs.append(run if run.tzinfo is not None else run.replace(tzinfo=dt.timezone.utc))
    at = mark.get("at") if mark else None
    if isinstance(at, (int, float)):
        runs.append(schedule_time(entry, float(at)))
    if not runs:
        return None
    try:
        slot = slot_after(entry.schedule, max(runs))
    except Exception:  # noqa: BLE001 - a schedule of its own kind: unknown
        return None
    return None if slot is None else float(slot.timestamp())


def _utc(moment: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(moment))
