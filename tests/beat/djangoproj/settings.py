"""Django settings written as a Django user writes them, every Celery key under ``CELERY_``.

The test passes the servers and the database file in the environment.
Without ``LEADER_STORE`` the project does not use celery-leader at all.
``LEADER_DJANGO_BEAT_SCHEDULER`` replaces ``CELERY_BEAT_SCHEDULER``, and
``LEADER_BEAT_UNLED`` (``True``, ``False`` or any other text, given as is)
sets ``CELERY_LEADER_BEAT_UNLED``.
"""

from __future__ import annotations

import os

SECRET_KEY = "celery-leader-tests-only"  # a throwaway test project
INSTALLED_APPS = ["django_celery_beat"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ["LEADER_DJANGO_DB"],
        "OPTIONS": {"timeout": 20},
    }
}
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
# A setting of the project itself whose name merely contains LEADER: not celery-leader's.
TEAM_LEADER_EMAIL = "lead@example.com"

CELERY_BROKER_URL = os.environ["LEADER_BROKER"]
CELERY_TASK_DEFAULT_QUEUE = f"{os.environ['LEADER_NAME']}.default"
if os.environ.get("LEADER_STORE"):
    CELERY_BEAT_SCHEDULER = "celery_leader.beat:LeaderScheduler"
    CELERY_LEADER_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
    CELERY_LEADER_BACKEND_URL = os.environ["LEADER_STORE"]
    CELERY_LEADER_NAME = os.environ["LEADER_NAME"]
    CELERY_LEADER_LEASE_TTL = 2.0
if os.environ.get("LEADER_DJANGO_BEAT_SCHEDULER"):
    CELERY_BEAT_SCHEDULER = os.environ["LEADER_DJANGO_BEAT_SCHEDULER"]
if "LEADER_BEAT_UNLED" in os.environ:
    _unled = os.environ["LEADER_BEAT_UNLED"]
    CELERY_LEADER_BEAT_UNLED = {"True": True, "False": False}.get(_unled, _unled)
