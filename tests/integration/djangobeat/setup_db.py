"""Create the test database and one interval entry, as an admin would in Django's admin.

``python -m tests.integration.djangobeat.setup_db``; the entry runs
``leaderapp.beat_tick`` every ``LEADER_DJANGO_EVERY`` seconds on the cluster's
default queue, where the test's worker records who sent it. With
``LEADER_DJANGO_ONE_OFF_IN`` set, a one-off entry runs once that many seconds
from now; with ``LEADER_DJANGO_FAR_CRONTAB`` set, a daily crontab entry
"far" falls due six hours from now; with ``LEADER_DJANGO_CRONTAB`` set to a
minute field (``*/5``), an entry "minutes" runs on that crontab, in the time
zone ``Europe/Paris``.
"""

from __future__ import annotations

import datetime as dt
import json
import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.integration.djangobeat.settings")
django.setup()

from django.core.management import call_command  # noqa: E402 - after django.setup()
from django_celery_beat.models import (  # noqa: E402
    ClockedSchedule,
    CrontabSchedule,
    IntervalSchedule,
    PeriodicTask,
)

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
if os.environ.get("LEADER_DJANGO_ONE_OFF_IN"):
    # A one-off entry on a clocked schedule, as the admin makes one: due once, at that time.
    at = dt.datetime.now(dt.timezone.utc) + dt.timedelta(
        seconds=float(os.environ["LEADER_DJANGO_ONE_OFF_IN"])
    )
    PeriodicTask.objects.update_or_create(
        name="once",
        defaults={
            "task": "tests.integration.leaderapp.beat_tick",
            "clocked": ClockedSchedule.objects.create(clocked_time=at),
            "one_off": True,
            "args": json.dumps(["once"]),
            "queue": f"{os.environ['LEADER_NAME']}.default",
        },
    )
if os.environ.get("LEADER_DJANGO_FAR_CRONTAB"):
    # A daily crontab six hours away: django-celery-beat 2.8+ does not load it until then.
    hour = (dt.datetime.now(dt.timezone.utc).hour + 6) % 24
    PeriodicTask.objects.update_or_create(
        name="far",
        defaults={
            "task": "tests.integration.leaderapp.beat_tick",
            "crontab": CrontabSchedule.objects.create(minute="0", hour=str(hour)),
            "args": json.dumps(["far"]),
            "queue": f"{os.environ['LEADER_NAME']}.default",
        },
    )
if os.environ.get("LEADER_DJANGO_CRONTAB"):
    # A crontab in a zone of its own, as the admin lets one pick.
    PeriodicTask.objects.update_or_create(
        name="minutes",
        defaults={
            "task": "tests.integration.leaderapp.beat_tick",
            "crontab": CrontabSchedule.objects.create(
                minute=os.environ["LEADER_DJANGO_CRONTAB"], timezone="Europe/Paris"
            ),
            "args": json.dumps(["minutes"]),
            "queue": f"{os.environ['LEADER_NAME']}.default",
        },
    )
