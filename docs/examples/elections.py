"""Named elections (docs: named-elections)."""

from celery import Celery

from celery_leader import LeaderElection, leader_only

app = Celery("proj", broker="redis://127.0.0.1:6379/0")
app.conf.leader_backend_url = "redis://127.0.0.1:6379/1"
app.steps["worker"].add(LeaderElection)


# [settle]
@leader_only(election="billing")  # its own lease, fencing tokens and queue
@app.task(bind=True)
def settle(self):
    return self.request.leader_token  # a token of election "billing"


# [end settle]


# [settings]
app.conf.leader_elections = ["reports"]  # compete in it although no imported task names it
app.conf.leader_elections_exclude = []  # elections this worker never leads
app.conf.leader_balance = True  # spread the elections over the workers (the default)
# A process that sends by name without importing the tasks: pattern -> election ("" default).
app.conf.leader_tasks = {"billing.*": "billing", "proj.tasks.*": ""}
# [end settings]
