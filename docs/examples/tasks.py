"""Leader-only tasks in their three forms, and a cooperative one (docs: leader-only-tasks)."""

import time

from celery import Celery, shared_task

import celery_leader
from celery_leader import LeaderElection, check_leadership, leader_only, lease_lost

app = Celery("proj", broker="redis://127.0.0.1:6379/0")
app.conf.leader_backend_url = "redis://127.0.0.1:6379/1"
app.steps["worker"].add(LeaderElection)


# [forms]
@leader_only  # over @app.task or @shared_task, bare or with options
@app.task(bind=True)
def aggregate(self, day):
    return self.request.leader_token  # the fencing token of the term this run holds


@leader_only(on_loss="terminate")  # what happens to a running task when the lease is lost
@shared_task
def compact(): ...


@app.task(base=celery_leader.LeaderTask)  # the explicit form
def sweep(): ...


# [end forms]


# [cancel]
@leader_only(on_loss="cancel")
@app.task
def reindex(batches=100):
    for _ in range(batches):
        check_leadership()  # raises LeaseLost once the term is over: the message goes back
        time.sleep(0.01)  # ... one batch of work ...
    return batches


@leader_only(on_loss="cancel")
@app.task
def export_rows(rows=100):
    done = 0
    while done < rows and not lease_lost():  # or poll, and stop early: this run counts as done
        done += 1
    return done


# [end cancel]


def send_by_name():
    # [send-by-name]
    sender = Celery("proj", broker="redis://127.0.0.1:6379/0")
    celery_leader.install(sender, tasks=["proj.tasks.*"])  # names it sends without importing
    sender.send_task("proj.tasks.nightly_rollup")  # goes to the leader queue, proj.leader
    # [end send-by-name]
    return sender
