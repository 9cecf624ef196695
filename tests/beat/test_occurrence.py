"""Occurrences: the slot a beat-sent message stands for, as the header gives it."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from celery import Celery
from celery.beat import ScheduleEntry
from celery.schedules import crontab, schedule

from celery_leader.beat.occurrence import (
    due_slot,
    format_slot,
    manual_occurrence,
    occurrence_of,
)

UTC = timezone.utc


def test_a_slot_is_utc_with_milliseconds_and_z():
    moment = datetime(2026, 11, 25, 10, 30, 0, 123456, tzinfo=timezone(timedelta(hours=1)))
    assert format_slot(moment) == "2026-11-25T09:30:00.123Z"
    assert format_slot(datetime(2026, 11, 25, 9, 30)) == "2026-11-25T09:30:00.000Z"
    assert manual_occurrence("nightly", moment) == "nightly@manual:2026-11-25T09:30:00.123Z"


def test_an_interval_entry_was_due_one_period_after_its_last_run():
    app = Celery("occurrence", set_as_current=False)
    last = datetime.now(UTC) - timedelta(seconds=30)
    entry = ScheduleEntry(
        name="every-10s", task="t", schedule=schedule(timedelta(seconds=10), app=app),
        last_run_at=last, app=app,
    )  # fmt: skip
    due = due_slot(entry)
    assert abs((due - (last + timedelta(seconds=10))).total_seconds()) < 0.01
    assert occurrence_of(entry) == f"every-10s@{format_slot(last + timedelta(seconds=10))}"


def test_a_crontab_entry_was_due_at_its_minute_not_when_it_was_sent():
    app = Celery("occurrence", set_as_current=False)
    app.conf.timezone = "UTC"
    last = datetime(2026, 11, 25, 9, 0, 0, tzinfo=UTC)
    entry = ScheduleEntry(
        name="half-past", task="t", schedule=crontab(minute=30, app=app), last_run_at=last, app=app
    )
    assert occurrence_of(entry) == "half-past@2026-11-25T09:30:00.000Z"
