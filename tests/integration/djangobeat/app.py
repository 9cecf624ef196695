"""The Celery app of the Django test project, as ``proj/celery.py`` is in a Django project."""

from __future__ import annotations

import os

import django
from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.integration.djangobeat.settings")
django.setup()

app = Celery("djangobeat")
app.config_from_object("django.conf:settings", namespace="CELERY")
