"""Which configurations count as using celery-leader: those a beat under another scheduler refuses.

Real Celery apps, configured as a plain app and as a Django project is
(``namespace="CELERY"``); the beat processes themselves are in
tests/beat/test_unled_beat.py.
"""

from __future__ import annotations

import pytest
from celery import Celery

from celery_leader.beat.unled import leader_settings_present, written


class DjangoProject:
    """A Django project's settings without any celery-leader setting."""

    CELERY_BROKER_URL = "redis://127.0.0.1:6379/0"
    TEAM_LEADER_EMAIL = "lead@example.com"
    LEADER_BOARD_PAGE_SIZE = 20


def django_app(**settings) -> Celery:
    app = Celery("proj", set_as_current=False)
    app.config_from_object(DjangoProject, namespace="CELERY")
    for key, value in settings.items():
        app.conf[key] = value
    return app


def plain_app(**settings) -> Celery:
    return Celery("proj", set_as_current=False, config_source=settings)


@pytest.mark.parametrize(
    ("settings", "present"),
    [
        ({}, False),
        ({"CELERY_LEADER_LEASE_TTL": 7}, True),
        ({"CELERY_LEADER_TASKS": ["billing.*"]}, True),
        ({"CELERY_BEAT_SCHEDULER": "leader"}, True),
        ({"CELERY_BEAT_SCHEDULER": "celery_leader.beat:LeaderScheduler"}, True),
        ({"CELERY_BEAT_SCHEDULER": "django_celery_beat.schedulers:DatabaseScheduler"}, False),
        # Unset in effect: settings.py often reads os.environ.get(...).
        ({"CELERY_LEADER_BACKEND_URL": None}, False),
        ({"CELERY_LEADER_BACKEND_URL": ""}, False),
        # The way out is not a reason to refuse.
        ({"CELERY_LEADER_BEAT_UNLED": True}, False),
        # Not a key celery-leader reads.
        ({"CELERY_LEADER_LEASE_TLL": 7}, False),
    ],
)
def test_under_django_s_namespace(settings, present):
    """A Django setting that merely contains LEADER is the project's, not celery-leader's."""
    assert leader_settings_present(django_app(**settings).conf) is present


@pytest.mark.parametrize(
    ("settings", "present"),
    [
        ({}, False),
        ({"leader_name": "billing"}, True),
        ({"beat_scheduler": "celery_leader.beat.LeaderScheduler"}, True),
        ({"beat_scheduler": "celery.beat:PersistentScheduler"}, False),
        ({"team_leader_email": "lead@example.com"}, False),
    ],
)
def test_in_a_plain_app(settings, present):
    assert leader_settings_present(plain_app(**settings).conf) is present


def test_a_scheduler_class_given_as_such():
    """beat_scheduler may be the class itself."""
    from celery.beat import PersistentScheduler

    from celery_leader.beat import LeaderScheduler

    assert leader_settings_present(plain_app(beat_scheduler=LeaderScheduler).conf)
    assert not leader_settings_present(plain_app(beat_scheduler=PersistentScheduler).conf)


def test_keys_are_named_as_the_project_writes_them():
    """Set or not: CELERY_BEAT_SCHEDULER under the namespace, beat_scheduler without."""
    conf = django_app(CELERY_LEADER_LEASE_TTL=7).conf
    assert written(conf, "beat_scheduler") == "CELERY_BEAT_SCHEDULER"
    assert written(conf, "leader_lease_ttl") == "CELERY_LEADER_LEASE_TTL"
    assert written(conf, "leader_beat_unled") == "CELERY_LEADER_BEAT_UNLED"
    assert written(plain_app().conf, "beat_schedule_filename") == "beat_schedule_filename"
