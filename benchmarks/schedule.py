"""Schedule controls: how soon ``schedule pause`` stops an entry, and ``schedule run`` sends it.

Run from the repository root:
    .venv/bin/python -m benchmarks.schedule [--rounds 10] [--every 0.2] [--json FILE]

One real ``celery worker`` (which runs and records each send) and two real
``celery beat`` processes of tests/integration/leaderapp.py wrapping
PersistentScheduler, an entry every ``--every`` seconds, Redis as broker and
lease store. Each round:

* **pause to last send**: ``celery leader schedule pause tick`` is started;
  the figure is the last scheduled send's time after that start (0 when the
  last send came before it). The command itself returns once the beat leader
  shows the pause; its wall time is in the table too.
* **run to send**: ``celery leader schedule run tick`` (while paused) is
  started; the figure is the time from that start to the manual send as the
  worker recorded it.
* then ``resume``, and a pause before the next round.

Both figures include the command's own start (importing Celery and the
app), shown on its own as ``celery leader --help``'s wall time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.stats import spread
from harness.cluster import Cluster


def _sends(cluster: Cluster, since: float) -> list[dict]:
    return [s for s in cluster.beat_sends() if s["at"] > since]


def _wait_leading(cluster: Cluster, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not any(beat.sends_now() for beat in cluster.beats):
        if time.monotonic() > deadline:
            raise SystemExit("no beat took the lead")
        time.sleep(0.2)
    while not _sends(cluster, 0):
        if time.monotonic() > deadline:
            raise SystemExit("the worker recorded no send")
        time.sleep(0.2)


def _timed(cluster: Cluster, *args: str) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    started = time.monotonic()
    proc = cluster.celery(*args)
    return started, time.monotonic() - started, proc


def _wait_view(cluster: Cluster, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while cluster.celery("leader", "schedule", "list").returncode != 0:
        if time.monotonic() > deadline:
            raise SystemExit("no schedule view published")
        time.sleep(0.3)


def measure(rounds: int, every: float) -> dict[str, list[float]]:
    """Seconds per round: pause to last send, pause's wall time, run to send, CLI start."""
    figures: dict[str, list[float]] = {"pause": [], "pause_cmd": [], "run": [], "cli": []}
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Cluster(Path(tmp), "redis")
        try:
            cluster.env["LEADER_BEAT_EVERY"] = str(every)
            cluster.start(1)
            for _ in range(2):
                cluster.start_beat()
            _wait_leading(cluster)
            _wait_view(cluster)
            for _ in range(rounds):
                _, took, _ = _timed(cluster, "leader", "--help")
                figures["cli"].append(took)
                time.sleep(1.0)
                started, took, proc = _timed(cluster, "leader", "schedule", "pause", "tick")
                if proc.returncode != 0:
                    raise SystemExit(f"pause failed: {proc.stdout}{proc.stderr}")
                figures["pause_cmd"].append(took)
                time.sleep(1.5 + every)
                scheduled = [
                    s for s in cluster.beat_sends() if "@manual:" not in (s["occurrence"] or "")
                ]
                last = max(s["at"] for s in scheduled)
                figures["pause"].append(max(0.0, last - started))
                started, _, proc = _timed(cluster, "leader", "schedule", "run", "tick")
                if proc.returncode != 0:
                    raise SystemExit(f"run failed: {proc.stdout}{proc.stderr}")
                deadline = time.monotonic() + 10
                manual: list[dict] = []
                while not manual and time.monotonic() < deadline:
                    manual = [
                        s for s in _sends(cluster, started) if "@manual:" in (s["occurrence"] or "")
                    ]
                    time.sleep(0.02)
                if not manual:
                    raise SystemExit("run-now: no send recorded")
                figures["run"].append(manual[0]["at"] - started)
                proc = cluster.celery("leader", "schedule", "resume", "tick")
                if proc.returncode != 0:
                    raise SystemExit(f"resume failed: {proc.stdout}{proc.stderr}")
        finally:
            cluster.close()
    return figures


def table(figures: dict[str, list[float]], rounds: int, every: float) -> str:
    rows = [
        ("pause: command start to the last scheduled send", figures["pause"]),
        ("pause: the command's wall time (returns once confirmed)", figures["pause_cmd"]),
        ("run: command start to the send (recorded by the worker)", figures["run"]),
        ("for scale: `celery leader --help` wall time (Python and Celery start)", figures["cli"]),
    ]
    lines = [
        f"schedule controls: 2 beats (PersistentScheduler), an entry every {every:g} s, "
        f"{rounds} rounds",
        "",
        "| measure | median | p90 | worst |",
        "|---|---|---|---|",
    ]
    for label, values in rows:
        median, p90, worst = spread(values)
        lines.append(f"| {label} | {median:.2f} s | {p90:.2f} s | {worst:.2f} s |")
    lines.append("")
    lines.append(
        "Both command figures include the command's own start (last row). Pause: the beat "
        "leader reads the control every 0.5 s on a helper thread; a send already due in that "
        f"gap still goes out. Mean of run-now: {statistics.mean(figures['run']):.2f} s."
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--every", type=float, default=0.2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    figures = measure(args.rounds, args.every)
    print(table(figures, args.rounds, args.every))
    if args.json is not None:
        args.json.write_text(json.dumps(figures))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
