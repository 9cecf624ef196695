"""The Celery app benchmarks/beat.py runs RedBeat and single-beat with (not celery-leader).

celery-leader's row runs tests/integration/leaderapp.py; this app is its peer
for schedulers that know nothing of celery-leader. Configured from the
environment: BENCH_BROKER, BENCH_HISTORY (a Redis URL where runs are
recorded), BENCH_NAME (prefixes the queue and RedBeat's keys) and
BENCH_SCHEDULER (``persistent``, celery's own, or ``redbeat``) with, for
RedBeat, BENCH_REDBEAT_REDIS and optionally BENCH_REDBEAT_LOCK_TIMEOUT and
BENCH_MAX_INTERVAL (beat_max_loop_interval; left unset: RedBeat's and celery's defaults).

Every beat process gets BENCH_BEAT_ID; each message it sends carries that id
and the send time in its headers, and ``beat_tick`` records both, so the
benchmark knows which instance sent each tick.
"""

from __future__ import annotations

import json
import os
import time

import redis
from celery import Celery
from celery.signals import before_task_publish

NAME = os.environ.get("BENCH_NAME", "beatapps")
app = Celery("beatapps", broker=os.environ.get("BENCH_BROKER", "redis://127.0.0.1:6379/0"))
app.conf.task_default_queue = f"{NAME}.default"
app.conf.broker_connection_retry_on_startup = True
app.conf.worker_hijack_root_logger = False
app.conf.beat_schedule = {
    "tick": {"task": "benchmarks.beatapps.beat_tick", "schedule": 1.0, "args": ("tick",)},
}
if os.environ.get("BENCH_MAX_INTERVAL"):
    app.conf.beat_max_loop_interval = float(os.environ["BENCH_MAX_INTERVAL"])
if os.environ.get("BENCH_SCHEDULER") == "redbeat":
    app.conf.beat_scheduler = "redbeat.RedBeatScheduler"
    app.conf.redbeat_redis_url = os.environ["BENCH_REDBEAT_REDIS"]
    app.conf.redbeat_key_prefix = f"redbeat-{NAME}"
    if os.environ.get("BENCH_REDBEAT_LOCK_TIMEOUT"):
        app.conf.redbeat_lock_timeout = int(os.environ["BENCH_REDBEAT_LOCK_TIMEOUT"])

_history: redis.Redis | None = None


def history() -> redis.Redis:
    global _history  # noqa: PLW0603 - one client per process
    if _history is None:
        _history = redis.Redis.from_url(os.environ["BENCH_HISTORY"], decode_responses=True)
    return _history


@before_task_publish.connect
def _stamp_sender(headers=None, **kwargs) -> None:  # type: ignore[no-untyped-def]
    """In a beat process: name the sending instance in the message's headers."""
    beat = os.environ.get("BENCH_BEAT_ID")
    if beat and headers is not None:
        headers["bench_beat"] = beat
        headers["bench_sent"] = time.monotonic()


@app.task(bind=True)
def beat_tick(self, entry="tick"):  # type: ignore[no-untyped-def]
    """Sent by beat: records which beat instance sent it, as leaderapp's beat_tick does."""
    row = {
        "kind": "beat",
        "entry": entry,
        "beat": self.request.get("bench_beat"),
        "sent": self.request.get("bench_sent"),
        "at": time.monotonic(),
        "wall": time.time(),
        "worker": self.request.hostname,
    }
    history().rpush("history", json.dumps(row))
