"""Where a wrapped beat scheduler keeps "when did this entry last run", and how to move it.

A new beat leader must count each entry's schedule from the last send of any
earlier leader, or it sends early (a double send in all but name) or skips a
slot. Schedulers keep that time in different places:

* **in the beat process** (``celery.beat.Scheduler``, ``PersistentScheduler``):
  each beat has its own copy, which says nothing of another beat's sends.
  The lease store's send marks (written by the leader after each publish)
  are the truth; an entry is re-anchored on them at takeover.
* **in Redis** (RedBeat): shared, and written by the leader when it reserves
  an entry, before the publish. A new leader reads it as it stands: the
  marks add nothing. Standbys must not tick, or they would advance it.
* **in a database** (django-celery-beat's ``DatabaseScheduler``): shared, but
  written only every ``beat_sync_every`` (minutes), and read once at start.
  At takeover the leader re-reads the database, then counts each entry from
  the later of the database's ``last_run_at`` and the send mark, and saves
  that. Standbys must not tick, or they would write it.

This module is the one place that knows these families. The beat logic in
:mod:`celery_leader.beat` asks it to reload, to read an entry's shared last
run, and to re-anchor an entry, and never touches a scheduler's private state
itself.
"""

from __future__ import annotations

import datetime as dt
from typing import Any


class ScheduleState:
    """A scheduler whose entries (``celery.beat.ScheduleEntry``) live in the beat process."""

    #: Several beats share the entries' state: a standby that ticks would advance it.
    shared = False
    #: A new leader re-anchors entries on the lease store's send marks.
    uses_marks = True

    def reload(self, scheduler: Any) -> None:
        """Take the entries afresh from where the scheduler keeps them (at takeover)."""

    def last_run(self, scheduler: Any, entry: Any) -> float | None:
        """The entry's last run (unix time) as shared storage records it, or None."""
        return None

    def note_sent(self, scheduler: Any, entry: Any, sent_at: float) -> None:
        """Record that a leader sent *entry* at *sent_at*, where the scheduler counts runs."""

    def anchor(self, scheduler: Any, entry: Any, sent_at: float) -> None:
        """Count *entry*'s schedule from a send at *sent_at* (unix time)."""
        when = dt.datetime.fromtimestamp(sent_at, tz=dt.timezone.utc)
        schedule = scheduler.schedule
        current = schedule.get(entry.name, entry)
        schedule[entry.name] = current._next_instance(last_run_at=when)
        scheduler._heap = None  # Celery rebuilds its heap from the schedule on the next tick


class RedBeatState(ScheduleState):
    """RedBeat: entries and their last run in Redis, saved when the leader reserves them."""

    shared = True
    uses_marks = False


class DjangoDatabaseState(ScheduleState):
    """django-celery-beat's ``DatabaseScheduler``: entries in a database table.

    Assumes the attributes django-celery-beat has had since 2.5
    (``_initial_read``, ``_dirty``, ``ModelEntry.model``, ``_default_now``).
    """

    shared = True

    def reload(self, scheduler: Any) -> None:
        """Re-read the table on the next access to ``schedule`` (after writing our own runs)."""
        scheduler._initial_read = True
        scheduler._heap = None

    def last_run(self, scheduler: Any, entry: Any) -> float | None:
        """``last_run_at`` as the table holds it (an entry made without one fills in "now")."""
        model = entry.model
        stored = (
            type(model)
            ._default_manager.filter(pk=model.pk)
            .values_list("last_run_at", flat=True)
            .first()
        )
        if stored is None:
            return None
        if stored.tzinfo is None:  # django-celery-beat reads naive times as UTC
            stored = stored.replace(tzinfo=dt.timezone.utc)
        return float(stored.timestamp())

    def note_sent(self, scheduler: Any, entry: Any, sent_at: float) -> None:
        """A one-off entry that a leader sent has run, though the table may not say so yet.

        Its run count is saved with ``last_run_at`` (minutes later), and a
        clocked schedule is due again whatever the last run: without this a
        new leader would send a one-off task a second time. A one-off entry
        changed after that send (re-enabled in the admin) is left alone.
        """
        current = scheduler.schedule.get(entry.name, entry)
        model = current.model
        changed = model.date_changed
        if not model.one_off or model.total_run_count:
            return
        if changed is not None and changed.timestamp() > sent_at:
            return
        model.total_run_count = 1
        current.total_run_count = 1
        scheduler._dirty.add(entry.name)

    def anchor(self, scheduler: Any, entry: Any, sent_at: float) -> None:
        """Set the entry's ``last_run_at`` to *sent_at*; the scheduler's next sync saves it."""
        now = entry._default_now()
        when = dt.datetime.fromtimestamp(sent_at, tz=dt.timezone.utc)
        # The same kind of datetime the entry makes itself: aware in its zone, or naive UTC.
        when = when.astimezone(now.tzinfo) if now.tzinfo else when.replace(tzinfo=None)
        current = scheduler.schedule.get(entry.name, entry)
        current.model.last_run_at = when
        current.last_run_at = when
        scheduler._dirty.add(entry.name)
        scheduler._heap = None


#: Scheduler families by the module their classes come from.
_FAMILIES: tuple[tuple[str, ScheduleState], ...] = (
    ("redbeat", RedBeatState()),
    ("django_celery_beat", DjangoDatabaseState()),
)


def state_of(scheduler_class: type) -> ScheduleState:
    """How *scheduler_class* (or the family it subclasses) keeps its entries' last runs."""
    for cls in scheduler_class.__mro__:
        for module, state in _FAMILIES:
            if cls.__module__ == module or cls.__module__.startswith(f"{module}."):
                return state
    return ScheduleState()
