"""The example's Celery app, configured from the environment.

=========================  ==========================================================
``PROJ_BROKER_URL``        broker, default ``redis://127.0.0.1:6379/0``
``PROJ_LEADER_URL``        lease store, default: the broker URL (any store URL
                           celery-leader accepts, e.g. ``azureblob://leases/proj``)
``PROJ_RESULT_URL``        result backend, optional (none by default)
``PROJ_LEADER_TTL``        lease length in seconds, optional (the package's default:
                           5 on Redis, 15 on Azure)
``PROJ_AGGREGATE_EVERY``   seconds between the aggregations beat sends, default 30
``PROJ_COMPACT_EVERY``     seconds between the compactions beat sends, default 600
``PROJ_DATA_URL``          where events and totals live (read by ``tasks.py``)
=========================  ==========================================================

What this configuration gives:

* every worker competes for one lease (election ``"proj"``); only the holder
  consumes the leader queue ``proj.leader``, so ``aggregate`` and ``compact``
  run on one worker at a time, and move to another within about one ttl when
  it dies (at once when it shuts down warm);
* any number of ``celery beat`` processes may run: only the one holding beat's
  own lease (``"proj.beat"``) sends the schedule below;
* processes that send the leader-only tasks by name without importing them
  (``celery call``, Flower) route them to the leader queue too (``leader_tasks``).
"""

from __future__ import annotations

import os

from celery import Celery

from celery_leader import LeaderElection

TASKS = "example_project.proj.tasks"
DEFAULT_BROKER_URL = "redis://127.0.0.1:6379/0"


def _seconds(variable: str, default: float) -> float:
    """A positive number of seconds from the environment."""
    value = float(os.environ.get(variable) or default)
    if value <= 0:
        raise ValueError(f"{variable}={value} must be a positive number of seconds")
    return value


broker_url = os.environ.get("PROJ_BROKER_URL") or DEFAULT_BROKER_URL
aggregate_every = _seconds("PROJ_AGGREGATE_EVERY", 30.0)
compact_every = _seconds("PROJ_COMPACT_EVERY", 600.0)

app = Celery("proj", include=[TASKS])
app.conf.update(
    broker_url=broker_url,
    result_backend=os.environ.get("PROJ_RESULT_URL") or None,
    leader_backend_url=os.environ.get("PROJ_LEADER_URL") or broker_url,
    leader_tasks=[f"{TASKS}.aggregate", f"{TASKS}.compact"],
    # One message at a time per process: leader tasks are acks_late, and a
    # prefetched message would wait on a worker that may lose the lease.
    worker_prefetch_multiplier=1,
    # Redis broker: a dead worker's unacknowledged messages come back after this
    # many seconds (kombu's default is an hour). Keep it above the longest task.
    broker_transport_options={"visibility_timeout": 600},
    broker_connection_retry_on_startup=True,
    beat_scheduler="celery_leader.beat:LeaderScheduler",
    leader_beat_scheduler="celery.beat:PersistentScheduler",
    beat_schedule={
        "aggregate-events": {
            "task": f"{TASKS}.aggregate",
            "schedule": aggregate_every,
            # A run that waited a whole period (no leader for a while) is stale.
            "options": {"expires": aggregate_every},
        },
        "compact-events": {
            "task": f"{TASKS}.compact",
            "schedule": compact_every,
            "kwargs": {"keep": 10_000},
            "options": {"expires": compact_every},
        },
    },
)
if os.environ.get("PROJ_LEADER_TTL"):
    app.conf.leader_lease_ttl = _seconds("PROJ_LEADER_TTL", 5.0)
app.steps["worker"].add(LeaderElection)
