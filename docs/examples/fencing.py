"""Fenced writes with RedisFence (docs: leader-only-tasks, "Fenced writes")."""

import os

import redis
from celery import Celery

from celery_leader import LeaderElection, leader_only
from celery_leader.fencing import RedisFence

app = Celery("proj", broker="redis://127.0.0.1:6379/0")
app.conf.leader_backend_url = "redis://127.0.0.1:6379/1"
app.steps["worker"].add(LeaderElection)

# [set]
fence = RedisFence(redis.Redis.from_url(os.environ.get("DATA_URL", "redis://127.0.0.1:6379/2")))


@leader_only(on_loss="finish")
@app.task(bind=True)
def publish_totals(self, result):
    if not fence.set("totals", "totals:today", result, token=self.request.leader_token):
        return "stale"  # a newer leader already wrote: our result is stale
    return "written"


# [end set]


# [transaction]
@leader_only
@app.task(bind=True)
def close_day(self, today):
    def add_day(pipe):
        month = int(pipe.get("totals:month") or 0)  # reads run at once
        pipe.multi()  # then queue the writes
        pipe.set("totals:month", month + today)
        pipe.delete("pending:today")

    fence.transaction("totals", self.request.leader_token, add_day, "totals:month")


# [end transaction]
