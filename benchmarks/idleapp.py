"""The app ``benchmarks.idle`` starts: one no-op task, leader election only when asked.

``IDLE_LEADER=1`` adds the ``LeaderElection`` step and makes the task
leader-only; otherwise the app is plain Celery. Broker and store come from
``IDLE_BROKER``.
"""

from __future__ import annotations

import os

from celery import Celery

from celery_leader import LeaderElection, leader_only

app = Celery("idlebench")
app.conf.update(
    broker_url=os.environ["IDLE_BROKER"],
    leader_backend_url=os.environ["IDLE_BROKER"],
    task_default_queue="idlebench.default",
    worker_hijack_root_logger=False,
)


@app.task
def noop() -> None:
    """Never sent: the worker stays idle."""


if os.environ.get("IDLE_LEADER") == "1":
    app.steps["worker"].add(LeaderElection)
    noop = leader_only(noop)
