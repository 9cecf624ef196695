# shop.py
from celery import Celery

from celery_leader import LeaderElection, check_leadership, leader_only, lease_lost

app = Celery("shop", broker="redis://localhost:6379/0")
app.conf.leader_backend_url = "redis://localhost:6379/1"
app.steps["worker"].add(LeaderElection)


@leader_only
@app.task(bind=True)
def settle(self, day):
    return {"day": day, "token": self.request.leader_token, "lost": lease_lost()}


@leader_only(on_loss="cancel")
@app.task
def sweep():
    check_leadership()
    return "swept"
