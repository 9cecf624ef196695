"""The catch-up window: which missed slot a takeover judges, and the settings that give it."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from celery import Celery
from celery.beat import ScheduleEntry
from celery.schedules import crontab, schedule

from celery_leader.beat.catch_up import catch_up
from celery_leader.exceptions import ConfigurationError
from celery_leader.settings import beat_settings

app = Celery("catch-up", set_as_current=False)


def entry(every: object) -> ScheduleEntry:
    return ScheduleEntry(name="nightly", task="t", schedule=every, app=app)


def test_interval_judges_the_latest_slot_counted_from_the_last_send() -> None:
    now = time.time()
    tick = entry(schedule(timedelta(seconds=60)))
    last = now - 150  # slots at -90 and -30: the latest is 30 s old
    assert catch_up(tick, last, window=45, now=now)
    assert not catch_up(tick, last, window=20, now=now)
    assert not catch_up(tick, now - 30, window=3600, now=now)  # nothing missed yet
    assert catch_up(tick, last, window=float("inf"), now=now)  # "once"
    assert not catch_up(tick, last, window=0.0, now=now)  # "skip"


def test_crontab_judges_whether_a_slot_fell_in_the_window() -> None:
    now = time.time()
    minutely = entry(crontab(minute="*"))
    since_minute = now % 60
    # Missed for ten minutes: the latest slot is since_minute old.
    assert catch_up(minutely, now - 600, window=since_minute + 1, now=now)
    if since_minute > 2:
        assert not catch_up(minutely, now - 600, window=since_minute - 1, now=now)
    assert not catch_up(minutely, now - 600, window=0, now=now)
    hourly = entry(crontab(minute=0))
    since_hour = now % 3600
    assert catch_up(hourly, now - 7200, window=since_hour + 1, now=now)
    if since_hour > 2:
        assert not catch_up(hourly, now - 7200, window=since_hour - 1, now=now)


def test_policies_map_to_windows() -> None:
    settings = beat_settings({"leader_beat_missed": {"a": "once", "b": "skip", "c": 30}})
    assert settings.catch_up_window("a") == float("inf")
    assert settings.catch_up_window("b") == 0.0
    assert settings.catch_up_window("c") == 30.0
    assert settings.catch_up_window("other") == float("inf")  # the default default: once
    assert beat_settings({"leader_beat_missed_default": 120}).catch_up_window("x") == 120.0
    assert beat_settings({"leader_beat_missed_default": "90"}).catch_up_window("x") == 90.0


@pytest.mark.parametrize("bad", [-1, True, "soon", float("nan"), [30]])
def test_a_bad_window_names_the_setting_and_what_is_allowed(bad: object) -> None:
    with pytest.raises(ConfigurationError) as raised:
        beat_settings({"leader_beat_missed": {"nightly": bad}})
    message = str(raised.value)
    assert "leader_beat_missed['nightly']" in message
    assert "once, skip or a catch-up window in seconds" in message
    with pytest.raises(ConfigurationError, match="leader_beat_missed_default"):
        beat_settings({"leader_beat_missed_default": bad})
