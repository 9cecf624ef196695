"""The Celery app the demo runs: a leader-only task, sent by a single active beat.

Configured from the environment by the demo command:
``CELERY_LEADER_DEMO_DIR`` (a scratch directory), ``CELERY_LEADER_DEMO_BROKER``
(default: kombu's ``filesystem://`` transport in that directory, so no server
is needed), ``CELERY_LEADER_DEMO_STORE`` (default: a SQLite file there) and
``CELERY_LEADER_DEMO_TTL``.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from celery import Celery

from celery_leader import LeaderElection, clock, leader_only

DEMO_DIR = Path(
    os.environ.get("CELERY_LEADER_DEMO_DIR") or Path(tempfile.gettempdir()) / "celery-leader-demo"
)
RUNS_FILE = DEMO_DIR / "runs.jsonl"

app = Celery("demo")
_broker = os.environ.get("CELERY_LEADER_DEMO_BROKER") or "filesystem://"
app.conf.broker_url = _broker
if _broker.startswith("filesystem"):
    for folder in ("queue", "processed", "control"):
        (DEMO_DIR / folder).mkdir(parents=True, exist_ok=True)
    app.conf.broker_transport_options = {
        "data_folder_in": str(DEMO_DIR / "queue"),
        "data_folder_out": str(DEMO_DIR / "queue"),
        "processed_folder": str(DEMO_DIR / "processed"),
        "control_folder": str(DEMO_DIR / "control"),
        "store_processed": False,
        "polling_interval": 0.05,
    }
app.conf.leader_backend_url = os.environ.get("CELERY_LEADER_DEMO_STORE") or (
    f"sqlite:///{DEMO_DIR}/leader.db"
)
app.conf.leader_lease_ttl = float(os.environ.get("CELERY_LEADER_DEMO_TTL", "3"))
app.conf.beat_scheduler = "celery_leader.beat:LeaderScheduler"
app.conf.beat_schedule = {"tick": {"task": "celery_leader.demo.app.tick", "schedule": 0.5}}
app.conf.worker_prefetch_multiplier = 1
app.conf.worker_hijack_root_logger = False
app.steps["worker"].add(LeaderElection)


@leader_only
@app.task(bind=True)  # type: ignore[untyped-decorator]
def tick(self: Any) -> None:
    """The leader's periodic work: record which worker ran it, under which token."""
    row = {
        "worker": self.request.hostname,
        "token": self.request.leader_token,
        "at": clock.now(),
    }
    with RUNS_FILE.open("a") as runs:
        runs.write(json.dumps(row) + "\n")
