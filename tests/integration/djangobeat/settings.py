"""Django settings of the django-celery-beat tests, written as a Django user writes them.

Everything Celery reads is under ``namespace="CELERY"``; the test fixture
passes the servers, the database file and the election name in the
environment.
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

CELERY_BROKER_URL = os.environ["LEADER_BROKER"]
CELERY_TASK_DEFAULT_QUEUE = f"{os.environ['LEADER_NAME']}.default"
CELERY_BEAT_SCHEDULER = "celery_leader.beat:LeaderScheduler"
CELERY_LEADER_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_LEADER_BACKEND_URL = os.environ["LEADER_STORE"]
CELERY_LEADER_NAME = os.environ["LEADER_NAME"]
CELERY_LEADER_LEASE_TTL = float(os.environ.get("LEADER_TTL", "2"))
if os.environ.get("LEADER_BEAT_STANDBY"):
    CELERY_LEADER_BEAT_STANDBY = os.environ["LEADER_BEAT_STANDBY"]
if os.environ.get("LEADER_BEAT_MISSED"):
    CELERY_LEADER_BEAT_MISSED_DEFAULT = os.environ["LEADER_BEAT_MISSED"]
