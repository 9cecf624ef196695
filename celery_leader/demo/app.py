"""The Celery app the demo runs: a leader-only task, sent by a single active beat.

Configured from the environment by the demo command:
``CELERY_LEADER_DEMO_DIR`` (a scratch directory), ``CELERY_LEADER_DEMO_BROKER``
(default: kombu's ``filesystem://`` transport in that directory, so no server
is needed), ``CELERY_LEADER_DEMO_STORE`` (default: a SQLite file there),
``CELERY_LEADER_DEMO_TTL`` and ``CELERY_LEADER_DEMO_TICK`` (seconds between
the beat's leader tasks).

Each worker appends what the demo measures to two files in that directory,
stamped on the lease clock (:func:`celery_leader.clock.now`, one clock for
every process of the host): ``runs.jsonl``, one line per leader task run, and
``terms.jsonl``, one line per ``leader_elected`` / ``leader_released`` signal.
The demo reads the handover from them: from the old leader's release to the
new leader's first leader task.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from celery import Celery

from celery_leader import LeaderElection, clock, leader_only
from celery_leader.signals import leader_elected, leader_released

DEMO_DIR = Path(
    os.environ.get("CELERY_LEADER_DEMO_DIR") or Path(tempfile.gettempdir()) / "celery-leader-demo"
)
RUNS_FILE = DEMO_DIR / "runs.jsonl"
TERMS_FILE = DEMO_DIR / "terms.jsonl"

app = Celery("demo")
_broker = os.environ.get("CELERY_LEADER_DEMO_BROKER") or "filesystem://"
FILESYSTEM_BROKER = _broker.startswith("filesystem")
app.conf.broker_url = _broker
if FILESYSTEM_BROKER:
    for folder in ("queue", "processed", "control"):
        (DEMO_DIR / folder).mkdir(parents=True, exist_ok=True)
    app.conf.broker_transport_options = {
        "data_folder_in": str(DEMO_DIR / "queue"),
        "data_folder_out": str(DEMO_DIR / "queue"),
        "processed_folder": str(DEMO_DIR / "processed"),
        "control_folder": str(DEMO_DIR / "control"),
        "store_processed": False,
        # kombu polls once a second by default; 50 ms keeps a handover well under a second.
        "polling_interval": 0.05,
    }
app.conf.leader_backend_url = os.environ.get("CELERY_LEADER_DEMO_STORE") or (
    f"sqlite:///{DEMO_DIR}/leader.db"
)
app.conf.leader_lease_ttl = float(os.environ.get("CELERY_LEADER_DEMO_TTL", "3"))
app.conf.beat_scheduler = "celery_leader.beat:LeaderScheduler"
# A new leader's first task may wait for the next tick: a short interval keeps that wait
# from hiding the handover itself.
app.conf.beat_schedule = {
    "tick": {
        "task": "celery_leader.demo.app.tick",
        "schedule": float(os.environ.get("CELERY_LEADER_DEMO_TICK", "0.2")),
    }
}
app.conf.worker_prefetch_multiplier = 1
app.conf.worker_hijack_root_logger = False
app.steps["worker"].add(LeaderElection)


def _append(path: Path, row: dict[str, Any]) -> None:
    """Append *row* as one JSON line, in one write to a file opened for appending.

    Several workers append to the same file: one short appending write each
    keeps their lines whole and apart.
    """
    with path.open("a") as rows:
        rows.write(json.dumps(row) + "\n")


@leader_only
@app.task(bind=True)  # type: ignore[untyped-decorator]
def tick(self: Any) -> None:
    """The leader's periodic work: record which worker ran it, under which token."""
    _append(
        RUNS_FILE,
        {"worker": self.request.hostname, "token": self.request.leader_token, "at": clock.now()},
    )


def _on_elected(sender: str, token: int, **_: Any) -> None:
    """Record the start of a term."""
    _append(TERMS_FILE, {"event": "elected", "worker": sender, "token": token, "at": clock.now()})


def _on_released(sender: str, token: int, **_: Any) -> None:
    """Record a term given up (step-down, shutdown), the handover's starting point.

    The worker sends the signal as it stops leading and releases the lease in
    the store as soon as no leader task of the term runs: in this demo (a
    task of microseconds) within milliseconds of the signal.
    """
    _append(TERMS_FILE, {"event": "released", "worker": sender, "token": token, "at": clock.now()})


# Connected by call, not as decorators: Signal.connect is untyped, a decorator would erase types.
leader_elected.connect(_on_elected)
leader_released.connect(_on_released)
