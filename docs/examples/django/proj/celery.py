# proj/celery.py
import os

from celery import Celery

from celery_leader import LeaderElection

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")

app = Celery("proj")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.steps["worker"].add(LeaderElection)
app.autodiscover_tasks()
