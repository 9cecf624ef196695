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

    @leader_only(overlap="skip", overlap_key=["i"])
    @app.task(name="gatebench.overlap_skip")
    def skip(i):
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
        'leader-only, overlap="skip"': skip,
        "celery-once (QueueOnce)": once,
        "celery-singleton (Singleton)": singleton,
    }


def per_call(task, calls: int, offset: int) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    for i in range(calls):
        task.delay(offset + i)
    return (time.perf_counter() - started) / calls


class _Request:
    """What the leader's gate reads of a message (for the decision's own cost)."""

    def __init__(self, task: object, i: int) -> None:
        self.task, self.id, self.parent_id = task, f"id-{i}", None
        self.args, self.kwargs = (i,), {}
        self.acknowledged = False
        self.leader_overlap_key: str | None = None

    def humaninfo(self) -> str:
        return self.id


def gate_decision(task: object, calls: int) -> float:
    """Seconds per message of the leader's overlap decision: key, record, settle."""
    from celery_leader.worker.overlap import Overlaps

    record = Overlaps()
    requests = [_Request(task, i) for i in range(calls)]
    started = time.perf_counter()
    for request in requests:
        record.admit_request(request)
        record.settle(request)
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
    # The overlap policy costs nothing at the sender (routing as any leader-only task);
    # at the leader it adds one decision per message, in the main process.
    decisions = {
        name: statistics.median(gate_decision(tasks[name], args.calls) for _ in range(args.rounds))
        for name in ("leader-only (celery-leader)", 'leader-only, overlap="skip"')
    }
    print(f"\nthe leader's overlap decision per message (key, record, settle), {args.calls}\n")
    print(f"| {'task kind':<32} | {'µs per message':>14} |")
    print(f"|{'-' * 34}|{'-' * 16}|")
    for name, cost in decisions.items():
        print(f"| {name:<32} | {cost * 1e6:14.1f} |")
    print(GATE_NOTE)


#: Printed under the tables, so that docs/benchmarks.md keeps it.
GATE_NOTE = """
One client process sends to a Redis broker on loopback; on a shared machine
the sender-side figures move by about 10 % from run to run (plain and
leader-only run the same code but for routing). `overlap="skip"` (here keyed
by an argument, `overlap_key=["i"]`) sends exactly as a leader-only task
does: its cost is at the leader, one decision per message in the worker's
main process (second table: binding the arguments to the signature and their
JSON form, the record of the key's run and its settlement), a few
microseconds against the milliseconds of a send. celery-once and
celery-singleton pay a Redis lock round trip on every call instead, at the
sender."""


if __name__ == "__main__":
    main()
