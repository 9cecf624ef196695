"""celery_leader.beat.schedule_text: every schedule on one line, a crontab as cron writes it."""

from __future__ import annotations

from datetime import timedelta
from zoneinfo import ZoneInfo

from celery import Celery
from celery.schedules import crontab, schedule
from django_celery_beat.tzcrontab import TzAwareCrontab

from celery_leader.beat.schedule_text import one_line, schedule_text


def test_django_celery_beats_crontab_is_one_line_with_its_zone() -> None:
    """Its str() spans three lines; the text is cron's order, then the zone."""
    zoned = TzAwareCrontab("*/5", tz=ZoneInfo("Europe/Paris"))
    assert "\n" in str(zoned), "the str() this module exists for"
    assert schedule_text(zoned) == "crontab(*/5 * * * *, Europe/Paris)"
    weekdays = TzAwareCrontab("0", "9", day_of_week="1-5", day_of_month="*", tz=ZoneInfo("UTC"))
    assert schedule_text(weekdays) == "crontab(0 9 * * 1-5)", "UTC adds nothing: times are UTC"


def test_celerys_crontab_in_cron_order_lists_as_commas() -> None:
    """Minute, hour, day of month, month, weekday; a list of values without spaces."""
    app = Celery(set_as_current=False)
    entry = crontab(minute=[30, 0], hour=9, day_of_month="1", month_of_year="*/3", app=app)
    assert schedule_text(entry) == "crontab(0,30 9 1 */3 *)"


def test_any_other_schedule_is_its_own_text_on_one_line() -> None:
    """An interval, or a schedule of its own kind: its own words, on one line."""
    app = Celery(set_as_current=False)
    assert schedule_text(schedule(timedelta(minutes=5), app=app)) == "<freq: 5.00 minutes>"

    class Fortnightly(schedule):  # a project's own schedule, with a str() of two lines
        def __repr__(self) -> str:
            return "<every other\n   week>"

    assert schedule_text(Fortnightly(timedelta(days=14), app=app)) == "<every other week>"
    assert one_line("a\n   b\tc ") == "a b c"
