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
* **anywhere else** (a scheduler this module does not know): treated as
  shared, so ``auto`` keeps its standbys idle, and re-anchored on the marks
  in memory (its ``last_run_at``), as for a local one.

This module is the one place that knows these families. The beat logic in
:mod:`celery_leader.beat` asks it to reload, to combine the marks with the
scheduler's own record, to re-anchor an entry and to drop what a former
leader had not saved, and never touches a scheduler's private state itself.
Times given to a schedule are in the schedule's own time zone: Celery
before 5.7 matches crontab fields in the zone of the time it is given.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from typing import Any

logger = logging.getLogger(__name__)

#: Names per database query when reading many entries' last runs.
_QUERY_CHUNK = 500


def schedule_time(entry: Any, unix_time: float) -> dt.datetime:
    """*unix_time* as an aware datetime in the time zone of *entry*'s schedule."""
    zone = getattr(getattr(entry, "schedule", None), "tz", None) or dt.timezone.utc
    return dt.datetime.fromtimestamp(unix_time, tz=zone)


class ScheduleState:
    """A scheduler whose entries (``celery.beat.ScheduleEntry``) live in the beat process."""

    #: Several beats share the entries' state: a standby that ticks would advance it.
    shared = False
    #: What ``leader_beat_standby = "auto"`` picks.
    auto_mode = "reserve"
    #: A new leader re-anchors entries on the lease store's send marks.
    uses_marks = True

    def reload(self, scheduler: Any) -> None:
        """Take the entries afresh from where the scheduler keeps them (at takeover)."""

    def entries(self, scheduler: Any) -> dict[str, Any]:
        """Every entry of the schedule by name, due or not (the schedule view, run-now)."""
        return dict(scheduler.schedule)

    def entry_names(self, scheduler: Any) -> AbstractSet[str]:
        """The names of the entries the scheduler holds in memory now, read without I/O.

        Beat's loop asks at every tick (the metrics make each entry's series
        at 0 before its first send), on standbys too: no store, Redis or
        database call. Here the schedule itself, which the beat process keeps.
        """
        names: AbstractSet[str] = scheduler.schedule.keys()
        return names

    def last_sent(self, scheduler: Any, marks: Mapping[str, float]) -> dict[str, float]:
        """For each entry name with a mark (unix time), when to count it from.

        An entry left out of the answer is counted as the scheduler has it.
        Here the marks are the only record of another beat's sends.
        """
        return dict(marks)

    def note_sent(self, scheduler: Any, entry: Any, sent_at: float) -> None:
        """Record that a leader sent *entry* at *sent_at*, where the scheduler counts runs."""

    def anchor(self, scheduler: Any, entry: Any, sent_at: float) -> None:
        """Count *entry*'s schedule from a send at *sent_at* (unix time)."""
        current = scheduler.schedule.get(entry.name, entry)
        current.last_run_at = schedule_time(current, sent_at)
        scheduler._heap = None  # Celery rebuilds its heap from the schedule on the next tick

    def forget_unsaved(self, scheduler: Any) -> None:
        """Beat stopped leading: drop run times it has not saved to shared storage yet."""

    def save_anchors(self, scheduler: Any) -> None:
        """Save what :meth:`anchor` and :meth:`note_sent` changed, where shared storage keeps it."""


class UnknownState(ScheduleState):
    """A scheduler of unknown storage: its standbys stay idle unless told otherwise."""

    auto_mode = "idle"

    def entry_names(self, scheduler: Any) -> AbstractSet[str]:
        """The entries of ``beat_schedule``: its ``schedule`` may read its storage."""
        return _configured(scheduler)


class RedBeatState(ScheduleState):
    """RedBeat: entries and their last run in Redis, saved when the leader reserves them."""

    shared = True
    auto_mode = "idle"
    uses_marks = False

    def entries(self, scheduler: Any) -> dict[str, Any]:
        """Every entry in RedBeat's sorted set (its ``schedule`` holds only the due ones).

        Two round trips whatever the number of entries: the keys, then every
        entry's definition and meta in one pipeline, decoded as RedBeat's
        ``Entry.from_key`` does. Assumes RedBeat's layout since 2.0
        (``app.redbeat_conf.schedule_key``, hash fields ``definition`` and
        ``meta``). An entry whose key is gone meanwhile is left out.
        """
        from redbeat.schedulers import get_redis  # type: ignore[import-untyped]  # noqa: PLC0415

        app = scheduler.app
        client = get_redis(app)
        keys = client.zrange(app.redbeat_conf.schedule_key, 0, -1)
        with client.pipeline() as pipe:
            for key in keys:
                pipe.hget(key, "definition")
                pipe.hget(key, "meta")
            fields = pipe.execute()
        entry_class = scheduler.Entry
        found: dict[str, Any] = {}
        for definition, meta in zip(fields[::2], fields[1::2], strict=True):
            if not definition:
                continue
            decoded = entry_class.decode_definition(definition)
            last = entry_class.decode_meta(meta)
            decoded.update(last)
            entry = entry_class(app=app, **decoded)
            entry.last_run_at = last["last_run_at"]
            found[entry.name] = entry
        return found

    def anchor(self, scheduler: Any, entry: Any, sent_at: float) -> None:
        """Count *entry* from *sent_at* in Redis, where RedBeat keeps its last run."""
        entry.reschedule(last_run_at=schedule_time(entry, sent_at))

    def entry_names(self, scheduler: Any) -> AbstractSet[str]:
        """The entries of ``beat_schedule`` (RedBeat's static ones).

        RedBeat's ``schedule`` holds only the due entries and reads Redis:
        an entry added to Redis alone is counted from its first send.
        """
        return _configured(scheduler)


class DjangoDatabaseState(ScheduleState):
    """django-celery-beat's ``DatabaseScheduler``: entries in a database table.

    Assumes the attributes django-celery-beat has had since 2.5
    (``_initial_read``, ``_schedule``, ``_dirty``, ``Model``, ``ModelEntry.model``,
    ``_default_now``).
    """

    shared = True
    auto_mode = "idle"

    def reload(self, scheduler: Any) -> None:
        """Re-read the table on the next access to ``schedule`` (after writing our own runs)."""
        scheduler._initial_read = True
        scheduler._heap = None

    def entries(self, scheduler: Any) -> dict[str, Any]:
        """Every enabled row, not only those the scheduler loaded.

        django-celery-beat 2.8 and later load only what may fall due soon (a
        crontab whose hour is hours away is left out until then); the view
        and run-now need every entry. Rows it loaded come as it has them.
        """
        found = dict(scheduler.schedule)
        for model in scheduler.Model._default_manager.enabled():
            if model.name in found:
                continue
            try:
                found[model.name] = scheduler.Entry(model, app=scheduler.app)
            except Exception:
                logger.debug("celery-leader beat: row %s left out", model.name, exc_info=True)
        return found

    def last_sent(self, scheduler: Any, marks: Mapping[str, float]) -> dict[str, float]:
        """The later of the mark and the table's ``last_run_at``, read in a few queries.

        A mark older than the row's last change, on a row with no
        ``last_run_at`` (django-celery-beat clears it when an entry is
        disabled; a deleted and re-created entry has none), belongs to an
        earlier life of the entry: the entry counts as the table has it.
        """
        names = list(marks)
        rows: list[tuple[str, dt.datetime | None, dt.datetime | None]] = []
        manager = scheduler.Model._default_manager
        for start in range(0, len(names), _QUERY_CHUNK):
            chunk = names[start : start + _QUERY_CHUNK]
            rows += manager.filter(name__in=chunk).values_list(
                "name", "last_run_at", "date_changed"
            )
        last_sent: dict[str, float] = {}
        for name, last_run_at, date_changed in rows:
            mark = marks[name]
            if last_run_at is None:
                if date_changed is not None and _unix(date_changed) > mark:
                    continue
                last_sent[name] = mark
            else:
                last_sent[name] = max(mark, _unix(last_run_at))
        return last_sent

    def note_sent(self, scheduler: Any, entry: Any, sent_at: float) -> None:
        """A one-off entry that a leader sent has run, though the table may not say so yet.

        Its run count is saved with ``last_run_at`` (minutes later), and a
        clocked schedule is due again whatever the last run: without this a
        new leader would send a one-off task a second time. A one-off entry
        changed after that send (re-enabled in the admin) is left alone.
        """
        current = self._entry(scheduler, entry)
        model = current.model
        changed = model.date_changed
        if not model.one_off or model.total_run_count:
            return
        if changed is not None and _unix(changed) > sent_at:
            return
        model.total_run_count = 1
        current.total_run_count = 1
        self._changed(scheduler)[entry.name] = model

    def anchor(self, scheduler: Any, entry: Any, sent_at: float) -> None:
        """Set the entry's ``last_run_at`` to *sent_at*; the scheduler's next sync saves it."""
        current = self._entry(scheduler, entry)
        now = current._default_now()
        when = schedule_time(current, sent_at)
        # The same kind of datetime the entry makes itself: aware in its zone, or naive UTC.
        if now.tzinfo is None:
            when = when.astimezone(dt.timezone.utc).replace(tzinfo=None)
        current.model.last_run_at = when
        current.last_run_at = when
        self._changed(scheduler)[entry.name] = current.model
        scheduler._heap = None

    def save_anchors(self, scheduler: Any) -> None:
        """Write the changed rows in a few bulk updates, not one save per row.

        django-celery-beat's own sync saves row by row (several queries
        each): thousands of re-anchored entries would hold beat's loop for
        seconds. Like that sync, it writes only ``last_run_at`` and
        ``total_run_count``, and signals no schedule change. Rows it could
        not write are left to that sync.
        """
        changed = self._changed(scheduler)
        if not changed:
            return
        models = list(changed.values())
        changed.clear()
        try:
            scheduler.Model._default_manager.bulk_update(
                models, ["last_run_at", "total_run_count"], batch_size=_QUERY_CHUNK
            )
        except Exception:
            scheduler._dirty.update(model.name for model in models)
            raise

    def forget_unsaved(self, scheduler: Any) -> None:
        """Drop the runs not yet synced: the new leader's would be overwritten with older ones."""
        scheduler._dirty.clear()
        self._changed(scheduler).clear()

    def entry_names(self, scheduler: Any) -> AbstractSet[str]:
        """The rows the scheduler loaded (read at start, again when the table changed).

        django-celery-beat 2.8 and later load a row once it may fall due
        within minutes; its ``schedule`` property would ask the database.
        """
        loaded = getattr(scheduler, "_schedule", None) or {}
        return loaded.keys()

    @staticmethod
    def _changed(scheduler: Any) -> dict[str, Any]:
        """The rows this module changed on *scheduler* and has not saved yet, by entry name."""
        changed: dict[str, Any] = scheduler.__dict__.setdefault("_celery_leader_changed", {})
        return changed

    @staticmethod
    def _entry(scheduler: Any, entry: Any) -> Any:
        # The loaded schedule itself: the ``schedule`` property would ask the
        # database whether anything changed, once per entry.
        loaded = getattr(scheduler, "_schedule", None) or {}
        return loaded.get(entry.name, entry)


def _configured(scheduler: Any) -> AbstractSet[str]:
    """The names of the entries in the app's ``beat_schedule``."""
    return (scheduler.app.conf.beat_schedule or {}).keys()


def _unix(when: dt.datetime) -> float:
    """A datetime from the table as unix time (naive means UTC, as django-celery-beat reads it)."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return float(when.timestamp())


#: Scheduler families by the module their classes come from.
_FAMILIES: tuple[tuple[str, ScheduleState], ...] = (
    ("redbeat", RedBeatState()),
    ("django_celery_beat", DjangoDatabaseState()),
)
#: Celery's own schedulers, whose entries live in the beat process.
_LOCAL = ("celery.beat.Scheduler", "celery.beat.PersistentScheduler")


def state_of(scheduler_class: type) -> ScheduleState:
    """How *scheduler_class* (or the family it subclasses) keeps its entries' last runs."""
    for cls in scheduler_class.__mro__:
        for module, state in _FAMILIES:
            if cls.__module__ == module or cls.__module__.startswith(f"{module}."):
                return state
    # A subclass of PersistentScheduler keeps its state as that does; a subclass of
    # the base Scheduler may keep it anywhere.
    names = {f"{cls.__module__}.{cls.__qualname__}" for cls in scheduler_class.__mro__}
    own = f"{scheduler_class.__module__}.{scheduler_class.__qualname__}"
    if "celery.beat.PersistentScheduler" in names or own in _LOCAL:
        return ScheduleState()
    return UnknownState()
