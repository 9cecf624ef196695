"""Occurrences: which scheduled slot of which entry a beat-sent message stands for.

Every message :class:`~celery_leader.beat.LeaderScheduler` sends carries the
header ``leader_occurrence``: ``"<entry>@<slot>"``, where ``<slot>`` is the
time the entry was due (not the time it was sent), in UTC, ISO 8601 with
milliseconds and ``Z``: ``"nightly@2026-11-25T09:30:00.000Z"``. A task reads
it as ``self.request.leader_occurrence``; the attribute is None on runs not
sent by beat. Two messages of one slot (a beat failover that sent it twice)
carry the same occurrence; the next slot carries another.

The slot is read from the entry's own schedule, as Celery decides that the
entry is due: the time its schedule says follows the entry's last run
(``now + remaining_estimate(last_run_at)``; for an entry overdue, a moment
in the past). Assumes the entry given is the one before Celery reserved its
next run (what ``Scheduler.tick`` hands to ``apply_entry``).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone
from typing import Any

logger = logging.getLogger(__name__)

#: The message header, and the attribute of ``self.request``.
OCCURRENCE_HEADER = "leader_occurrence"


def format_slot(moment: datetime) -> str:
    """*moment* as an occurrence's slot: UTC, milliseconds, ``Z`` (naive means UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    utc = moment.astimezone(timezone.utc)
    utc = utc.replace(microsecond=utc.microsecond // 1000 * 1000)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


def due_slot(entry: Any) -> datetime:
    """When *entry* was due, by its schedule and its last run; now if that cannot be read."""
    try:
        slot = slot_after(entry.schedule, entry.last_run_at)
    except Exception:  # a schedule of its own kind: its send time then
        logger.debug("celery-leader beat: no due time for %s", entry.name, exc_info=True)
        slot = None
    return slot if slot is not None else datetime.now(timezone.utc)


def slot_after(schedule: Any, last: datetime) -> datetime | None:
    """The first slot of *schedule* after a run at *last*; None when it cannot tell.

    Crontabs and intervals by their own arithmetic (exact, whatever the
    clock says now); any other kind as ``now + remaining_estimate(last)``.
    """
    if hasattr(schedule, "remaining_delta"):  # crontab: the next minute after the last run
        # Matched in the crontab's own zone: Celery before 5.5 matched its fields in the
        # zone the last run came in (django-celery-beat's rows in UTC, its crontabs zoned).
        last = schedule.maybe_make_aware(last).astimezone(schedule.tz)
        start, ends_in, _now = schedule.remaining_delta(last)
        return _aware(start + ends_in)
    if isinstance(getattr(schedule, "run_every", None), timedelta):  # an interval
        return _aware(schedule.maybe_make_aware(last) + schedule.run_every)
    remaining = schedule.remaining_estimate(last)  # any other kind (solar, your own)
    if isinstance(remaining, timedelta):
        return _aware(schedule.now() + remaining)
    return None


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


def occurrence_of(entry: Any, slot: datetime | None = None) -> str:
    """The occurrence a send of *entry* stands for: ``"<entry>@<slot>"``.

    *slot* is the time it was due, when the caller read it already
    (:func:`due_slot`, before Celery reserved the entry's next run).
    """
    return f"{entry.name}@{format_slot(due_slot(entry) if slot is None else slot)}"


def manual_occurrence(entry_name: str, requested_at: datetime) -> str:
    """The occurrence of a send asked for by hand (``schedule run``)."""
    return f"{entry_name}@manual:{format_slot(requested_at)}"
