"""A led beat and its settings (docs: beat)."""

from celery import Celery
from celery.schedules import crontab

app = Celery("proj", broker="redis://127.0.0.1:6379/0")
app.conf.leader_backend_url = "redis://127.0.0.1:6379/1"

# [scheduler]
app.conf.beat_scheduler = "celery_leader.beat:LeaderScheduler"  # or the alias "leader"
app.conf.leader_beat_scheduler = "celery.beat:PersistentScheduler"  # the scheduler it wraps
# [end scheduler]

# [missed]
app.conf.beat_schedule = {
    "nightly-report": {"task": "proj.tasks.report", "schedule": crontab(hour=2, minute=0)},
    "sync-accounts": {"task": "proj.tasks.sync", "schedule": 300.0},
}
app.conf.leader_beat_missed_default = "skip"  # slots missed while no beat led: not sent
app.conf.leader_beat_missed = {"nightly-report": 3600}  # ... but this one within an hour
# [end missed]
