"""The app ``benchmarks.elections`` starts: leaderapp plus one waiting task per named election.

``BENCH_ELECTIONS`` (comma-separated) names the elections; each gets a task
``bench.wait.<election>`` that waits ``BENCH_WAIT`` seconds (coordination
work mostly waits on I/O) and counts itself in the history Redis. The
default election's task is ``bench.wait.default``.
"""

from __future__ import annotations

import os
import time

from celery_leader import leader_only
from tests.integration.leaderapp import app, history

WAIT = float(os.environ.get("BENCH_WAIT", "0.02"))
ELECTIONS = [e for e in os.environ.get("BENCH_ELECTIONS", "").split(",") if e]


def _waiter(election: str | None) -> object:
    label = election or "default"

    def wait() -> None:
        time.sleep(WAIT)
        now = time.monotonic()
        pipe = history().pipeline(transaction=False)
        pipe.incr("bench-done").setnx("bench-first", now).set("bench-last", now)
        pipe.execute()

    wait.__name__ = f"wait_{label}"
    return leader_only(election=election)(app.task(name=f"bench.wait.{label}")(wait))


TASKS = {election: _waiter(election) for election in [None, *ELECTIONS]}
app.conf.leader_elections = ELECTIONS
