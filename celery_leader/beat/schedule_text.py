"""An entry's schedule as one short line, for the published view and ``schedule list``.

``str()`` of a schedule is whatever its class makes of it: django-celery-beat's
crontab spans three lines (its ``repr`` has two line breaks in it), which
broke the table of ``celery leader schedule list`` into pieces. Here a crontab
of any kind reads as cron does, ``crontab(*/5 * * * *)`` (minute, hour, day of
month, month, day of week), with its time zone when that is not UTC
(``crontab(0 9 * * 1-5, Europe/Paris)``); any other schedule as its own text
with every run of whitespace made one space. The text is for people: nothing
parses it back.
"""

from __future__ import annotations

from typing import Any

from celery.schedules import crontab

#: The crontab's own fields, in cron's order (minute, hour, day of month, month, weekday).
_CRON_FIELDS = (
    "_orig_minute",
    "_orig_hour",
    "_orig_day_of_month",
    "_orig_month_of_year",
    "_orig_day_of_week",
)
#: Zone names that add nothing to times shown in UTC.
_UTC_NAMES = frozenset({"UTC", "Etc/UTC", "utc", "UTC+00:00"})


def one_line(text: Any) -> str:
    """*text* as a string on one line: every run of whitespace made one space."""
    return " ".join(str(text).split())


def schedule_text(schedule: Any) -> str:
    """*schedule* on one line: a crontab as ``crontab(m h dom mon dow[, zone])``."""
    if isinstance(schedule, crontab):
        fields = [getattr(schedule, name, None) for name in _CRON_FIELDS]
        if all(field is not None for field in fields):
            cron = " ".join(_cron_field(field) for field in fields)
            zone = _zone(schedule)
            return f"crontab({cron}, {zone})" if zone else f"crontab({cron})"
    return one_line(schedule)


def _cron_field(value: Any) -> str:
    """One field as written (``*/5``), a collection of values as ``1,3,5``, never spaces."""
    if isinstance(value, (set, frozenset, list, tuple)):
        return ",".join(str(item) for item in sorted(value, key=str))
    return "".join(str(value).split())


def _zone(schedule: crontab) -> str | None:
    """The zone *schedule* is read in, when it is not UTC; None when it is or cannot be told."""
    try:
        zone = schedule.tz
    except Exception:  # noqa: BLE001 - no app to ask: the text does without the zone
        return None
    name = str(getattr(zone, "key", None) or zone or "")
    return None if not name or name in _UTC_NAMES else name
