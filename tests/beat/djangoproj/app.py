"""The Celery app of the test project, as ``proj/celery.py`` is in a Django project."""

from __future__ import annotations

import os

import django
from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.beat.djangoproj.settings")
django.setup()

app = Celery("djangoproj")
app.config_from_object("django.conf:settings", namespace="CELERY")
