"""Per-call cost of sending a task: plain, leader-only, celery-once, celery-singleton.

Run from the repository root:  .venv/bin/python -m benchmarks.gate [--calls 2000]

All four send to the same Redis broker from one client process; nothing
consumes. A leader-only task adds routing only (its gate runs in the worker,
with no store round trip); celery-once and celery-singleton take a Redis lock
on every call, which is the price of their per-call de-duplication (a
different job: they do not elect anyone). Each call has unique arguments, so
no call is refused as a duplicate.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from celery import Celery

from celery_leader import leader_only
from harness.servers import RedisServer


def make_app(url: str) -> tuple[Celery, dict[str, object]]:
    from celery_once import QueueOnce
    from celery_singleton import Singleton

    app = Celery("gatebench", broker=url)
    app.conf.update(
        task_default_queue="gatebench.default",
        ONCE={
            "backend": "celery_once.backends.Redis",
            "settings": {"url": url, "default_timeout": 3600},
        },
        singleton_backend_url=url,
    )

    @app.task(name="gatebench.plain")
    def plain(i):
        return i

    @leader_only
    @app.task(name="gatebench.leader_only")
    def leader(i):
        return i

    @app.task(base=QueueOnce, name="gatebench.once")
    def once(i):
        return i

    @app.task(base=Singleton, name="gatebench.singleton")
    def singleton(i):
        return i

    return app, {
        "plain": plain,
        "leader-only (celery-leader)": leader,
        "celery-once (QueueOnce)": once,
        "celery-singleton (Singleton)": singleton,
    }


def per_call(task, calls: int, offset: int) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    for i in range(calls):
        task.delay(offset + i)
    return (time.perf_counter() - started) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp)).start()
        try:
            _app, tasks = make_app(server.url)
            for task in tasks.values():
                task.delay(-1)  # warm up connections and scripts
            costs: dict[str, list[float]] = {name: [] for name in tasks}
            for round_ in range(args.rounds):
                for name, task in tasks.items():
                    costs[name].append(per_call(task, args.calls, (round_ + 1) * 10**6))
        finally:
            server.stop()
    base = statistics.median(costs["plain"])
    print(
        f"\nper-call cost of .delay() to a Redis broker, {args.calls} calls, "
        f"median of {args.rounds} rounds\n"
    )
    print(f"| {'task kind':<32} | {'µs per call':>11} | {'vs plain':>8} |")
    print(f"|{'-' * 34}|{'-' * 13}|{'-' * 10}|")
    for name, values in costs.items():
        cost = statistics.median(values)
        print(f"| {name:<32} | {cost * 1e6:11.0f} | {cost / base:8.2f} |")


if __name__ == "__main__":
    main()
