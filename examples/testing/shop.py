"""A project's Celery app with leader-only tasks, as the tests next to it see it.

The example of "Testing your code" in the README: ``test_shop.py`` tests
these tasks with celery-leader's pytest fixtures, eagerly and on a worker
that leads.
"""

from __future__ import annotations

from celery import Celery

from celery_leader import LeaderElection, check_leadership, leader_only, lease_lost

app = Celery("shop")
app.conf.leader_lease_ttl = 10.0
app.steps["worker"].add(LeaderElection)


@leader_only
@app.task(bind=True)
def settle(self, day: str) -> dict:
    """Settle one day's orders; the token fences the write in real code."""
    return {"day": day, "token": self.request.leader_token, "lost": lease_lost()}


@leader_only(on_loss="cancel")
@app.task(bind=True)
def sweep(self) -> str:
    """A long job that stops once the lease is gone."""
    check_leadership()
    return "swept"
