"""Singleton jobs: overlap policies and occurrences (docs: singleton-jobs)."""

from celery import Celery

from celery_leader import LeaderElection, leader_only

app = Celery("proj", broker="redis://127.0.0.1:6379/0")
app.conf.leader_backend_url = "redis://127.0.0.1:6379/1"
app.steps["worker"].add(LeaderElection)


# [overlap]
@leader_only(overlap="skip")  # a message sent while a run goes on is skipped
@app.task(bind=True)
def rebuild_index(self):
    return self.request.leader_occurrence  # "<entry>@<slot>" when beat sent it, else None


@leader_only(overlap="buffer_one", overlap_key=["account_id"])  # one per account
@app.task
def sync_account(account_id, full=False): ...


# [end overlap]
