"""What an idle worker costs: CPU of its whole process group, with and without celery-leader.

Each row starts one ``celery worker`` (Redis broker, the lease store on the
same Redis), waits until it is ready (and, with the plugin, leads), then
reads the CPU times (user + system) of every process in its process group
from ``/proc`` at the start and the end of a quiet window (20 s by
default), with nothing sent. The figure is that CPU time over the window's
wall time: a share of one core. Rows with and without the plugin alternate,
so a busy machine weighs on both.

Run from the repository root:  .venv/bin/python -m benchmarks.idle [--seconds 20] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.cpu import cpu_seconds
from harness.servers import RedisServer

ROOT = Path(__file__).resolve().parent.parent
#: The extra idle CPU the plugin may cost (share of one core), docs/verification.md, "Costs".
GOAL = 0.005


def group_cpu(pgid: int) -> float:
    """CPU seconds (user + system) of every live process in process group *pgid*."""
    return cpu_seconds(lambda _pid, _ppid, group: group == pgid)


def idle_share(broker: str, pool: str, leader: bool, seconds: float, logdir: Path) -> float:
    """The share of one core the worker's process group used while idle for *seconds*."""
    env = {
        **os.environ,
        "IDLE_BROKER": broker,
        "IDLE_LEADER": "1" if leader else "0",
        "PYTHONPATH": str(ROOT),
    }
    log = logdir / f"{pool}-{'leader' if leader else 'plain'}.log"
    args = [sys.executable, "-m", "celery", "-A", "benchmarks.idleapp", "worker", "-P", pool]
    args += ["-c", "2", "-l", "info", "--without-gossip", "--without-mingle"]
    args += ["--without-heartbeat", "-n", f"idle-{os.getpid()}@%h"]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            args, cwd=ROOT, env=env, stdout=out, stderr=out, start_new_session=True
        )
    try:
        ready = "leads election" if leader else "ready."
        deadline = time.monotonic() + 60
        while ready not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker not ready:\n{log.read_text()[-2000:]}")
            time.sleep(0.1)
        time.sleep(1.0)  # past the start-up work (imports, the first renewals)
        before, started = group_cpu(proc.pid), time.monotonic()
        time.sleep(seconds)
        after, ended = group_cpu(proc.pid), time.monotonic()
        return (after - before) / (ended - started)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pools", nargs="+", default=["prefork", "threads"])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    figures: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        redis = RedisServer(tmp).start()
        try:
            for pool in args.pools:
                found = figures.setdefault(pool, {"plain": [], "leader": []})
                for _ in range(args.rounds):
                    for leader in (False, True):
                        share = idle_share(redis.url, pool, leader, args.seconds, tmp)
                        found["leader" if leader else "plain"].append(share)
        finally:
            redis.stop()
    print(
        f"idle worker (-c 2, Redis broker and store), CPU of its process group over "
        f"{args.seconds:g} s after start, median of {args.rounds} rounds\n"
    )
    print("| pool | without celery-leader | with celery-leader | extra | goal | |")
    print("|---|---:|---:|---:|---|---|")
    for pool, found in figures.items():
        plain, leader = statistics.median(found["plain"]), statistics.median(found["leader"])
        extra = leader - plain
        print(
            f"| {pool} | {plain:.2%} of a core | {leader:.2%} of a core | {extra:+.2%} | "
            f"extra <= {GOAL:.1%} | {'met' if extra <= GOAL else 'MISSED'} |"
        )
    if args.json:
        args.json.write_text(json.dumps(figures))


if __name__ == "__main__":
    main()
