"""Create the test database and one interval entry, as an admin would in Django's admin.

``python -m tests.integration.djangobeat.setup_db``; the entry runs
``leaderapp.beat_tick`` every ``LEADER_DJANGO_EVERY`` seconds on the cluster's
default queue, where the test's worker records who sent it.
"""

from __future__ import annotations

import json
import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.integration.djangobeat.settings")
django.setup()

from django.core.management import call_command  # noqa: E402 - after django.setup()
from django_celery_beat.models import IntervalSchedule, PeriodicTask  # noqa: E402

call_command("migrate", verbosity=0)
every, _ = IntervalSchedule.objects.get_or_create(
    every=int(os.environ["LEADER_DJANGO_EVERY"]), period=IntervalSchedule.SECONDS
)
PeriodicTask.objects.update_or_create(
    name="tick",
    defaults={
        "task": "tests.integration.leaderapp.beat_tick",
        "interval": every,
        "args": json.dumps(["tick"]),
        "queue": f"{os.environ['LEADER_NAME']}.default",
    },
)
