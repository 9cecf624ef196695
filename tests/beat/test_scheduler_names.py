"""Beat was split by job: every name the scheduler module held still imports from it.

Users and tests import from ``celery_leader.beat.scheduler`` and from
``celery_leader.beat``; the names below are every top-level name that
module defined before the split, and every method of the mixin.
"""

from __future__ import annotations

import importlib

import pytest

#: Every top-level name of celery_leader/beat/scheduler.py before the split.
SCHEDULER_NAMES = [
    "BeatElection",
    "LeaderScheduler",
    "LeaderSchedulerMixin",
    "MAX_TICK",
    "SLOT_TOLERANCE",
    "STANDBY_REST",
    "STANDBY_TICK",
    "STEP_DOWN_KEY",
    "STEP_DOWN_POLL",
    "T",
    "TOKEN_HEADER",
    "_MarkWrite",
    "_check_metrics_extra",
    "_check_server_limits",
    "_classes",
    "_exit_cleanly_on_sigterm",
    "_limits_checked",
    "_shallow_copy",
    "_slot_already_sent",
    "_slot_missed",
    "_standby_mode",
    "_standby_sleep",
    "leader_scheduler_class",
    "logger",
    "requested_token",
    "step_down_channel",
    "step_down_request",
]

#: Every method and class attribute of LeaderSchedulerMixin before the split.
MIXIN_NAMES = [
    "__init__",
    "_election",
    "_ensure_connected",
    "_leader_catch_up",
    "_leader_count_skip",
    "_leader_election",
    "_leader_entries",
    "_leader_manual",
    "_leader_manual_request",
    "_leader_mode",
    "_leader_publish_view",
    "_leader_run_now",
    "_leader_sent_manual",
    "_leader_skip_paused",
    "_leader_steer",
    "_leader_step_down_if_asked",
    "_leader_step_down_looked_at",
    "_leader_step_down_token",
    "_leader_window_on_own_record",
    "_on_elected",
    "_save_anchors",
    "_take_over",
    "apply_async",
    "apply_entry",
    "close",
    "setup_schedule",
    "tick",
]


@pytest.mark.parametrize("name", SCHEDULER_NAMES)
def test_every_name_of_the_scheduler_module_still_imports_from_it_and_from_beat(name):
    """``from celery_leader.beat.scheduler import X`` and ``from celery_leader.beat import X``."""
    scheduler = importlib.import_module("celery_leader.beat.scheduler")
    beat = importlib.import_module("celery_leader.beat")
    assert hasattr(scheduler, name)
    assert getattr(beat, name) is getattr(scheduler, name)


@pytest.mark.parametrize("name", MIXIN_NAMES)
def test_the_mixin_keeps_every_method(name):
    """Its parts are mixed back in: each method is still found on LeaderSchedulerMixin."""
    from celery_leader.beat.scheduler import LeaderSchedulerMixin

    assert hasattr(LeaderSchedulerMixin, name)


def test_the_led_class_still_finds_the_scheduler_it_wraps():
    """The parts sit between the mixin and the wrapped class in the MRO; the wrapped one is
    still found (its name goes into the published view and the standby mode's checks)."""
    from celery.beat import PersistentScheduler

    from celery_leader.beat.scheduler import leader_scheduler_class

    led = leader_scheduler_class(PersistentScheduler)
    assert led._leader_wrapped() is PersistentScheduler
    assert led.__module__ == "celery_leader.beat.scheduler"
    assert led.__name__ == "LeaderPersistentScheduler"


def test_the_step_down_request_imports_without_celerys_beat():
    """``celery leader step-down --beat`` reads the request's format from its own module,
    which loads neither Celery's beat nor the scheduler (every ``celery`` command loads the
    CLI); the scheduler re-exports the same functions."""
    import subprocess
    import sys

    code = (
        "import sys, celery_leader.beat.step_down as s;"
        "assert s.requested_token({s.STEP_DOWN_KEY: s.step_down_request(7, 'me')}) == 7;"
        "print(sorted(m for m in ('celery.beat', 'celery_leader.beat.scheduler')"
        " if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
    from celery_leader.beat import scheduler, step_down

    assert step_down.step_down_request is scheduler.step_down_request
