"""A test app whose leader tasks differ only in what assumes their runs end with their term.

For the start-up warnings of :mod:`celery_leader.worker.unkillable_runs`
and :mod:`celery_leader.worker.one_slot`:
tasks with an overlap policy, one that ``beat_schedule`` names (its sends
carry occurrences), and ones with neither, under each ``on_loss``.
Configured from the environment as ``leaderapp`` is (LEADER_BROKER,
LEADER_STORE, LEADER_NAME, LEADER_TTL).
"""

from __future__ import annotations

import os

from celery import Celery

from celery_leader import LeaderElection, leader_only

app = Celery("keyedapp", broker=os.environ.get("LEADER_BROKER", "redis://127.0.0.1:6379/0"))
app.conf.leader_name = os.environ.get("LEADER_NAME", "keyedapp")
app.conf.leader_backend_url = os.environ.get("LEADER_STORE", app.conf.broker_url)
app.conf.leader_lease_ttl = float(os.environ.get("LEADER_TTL", "3"))
app.conf.task_default_queue = f"{app.conf.leader_name}.default"
app.conf.broker_connection_retry_on_startup = True
app.conf.worker_hijack_root_logger = False
app.steps["worker"].add(LeaderElection)
app.conf.beat_schedule = {
    "nightly": {"task": f"{__name__}.scheduled", "schedule": 3600.0},
    "plain": {"task": f"{__name__}.plain_scheduled", "schedule": 3600.0},
}


@leader_only(overlap="skip")
@app.task
def skip_default():
    """overlap, default on_loss: terminate in prefork, cancel elsewhere."""


@leader_only(overlap="buffer_one", on_loss="terminate")
@app.task
def buffer_terminate():
    """overlap, terminate asked for: cancel where the pool cannot kill."""


@leader_only(overlap="skip", on_loss="cancel")
@app.task
def skip_cancel():
    """overlap under cancel: a run that never polls outlives its term, in every pool."""


@leader_only
@app.task
def scheduled():
    """Named by a beat_schedule entry: its runs carry occurrences."""


@leader_only
@app.task
def unkeyed():
    """Neither overlap nor occurrences: nothing to warn about."""


@leader_only(on_loss="cancel")
@app.task
def unkeyed_cancel():
    """cancel without a key: nothing to warn about."""


@app.task
def plain_scheduled():
    """Not leader-only, though scheduled: not the gate's."""
