"""What a leader run costs its pool child, warm and cold: leader-only no-ops against plain ones.

Run from the repository root:
    .venv/bin/python -m benchmarks.call_path [--runs 3000] [--rounds 5]

No broker and no worker: the benchmark's own process stands in for a
prefork pool child for warm runs, and a process it forks for cold ones. As
in a worker, the parent makes the shared lease slot (a valid term
published) and its run table before the fork, and the child has a pool
index, so each leader run records itself in its run-table slot, checks its
term and unrecords itself, as it does in a real pool child. Each run goes
through Celery's own tracer (``build_tracer``, as the pool calls it); the
plain task is ``acks_late`` like leader-only tasks, so the two differ only by
what celery-leader adds. The child times each run from the tracer's call to
its return.

Two conditions:

* **warm**: runs back to back; the code and data of the run stay in the
  CPU's caches.
* **cold**: one run per wake-up, the kinds alternating run by run. Between
  runs the child blocks on a pipe while the parent writes an 8 MiB buffer:
  more than a core's own caches, less than a shared L3 may hold. A stand-in
  for the work a worker's main process (and the rest of the machine) does
  between two dispatches, not a copy of it: the child finds its caches cold
  when the scheduler puts it on the core the parent wrote from, cooler than
  warm elsewhere.

Why: the throughput ratio of ``benchmarks.workers`` moves by several percent
with the machine's load; these figures need no worker, move less, and say
where a leader run's cost lies: in what its checks touch (the run-table
slot, the shared lease slot, the watchdog's wake-up time, the lease clock,
the code that reads them), which a pool child that slept since its last run
finds out of its caches.
"""

from __future__ import annotations

import argparse
import os
import statistics
import struct
import time
import uuid
from collections.abc import Callable
from typing import Any

from celery import Celery
from celery.app.trace import build_tracer, setup_worker_optimizations

from celery_leader import clock, leader_only
from celery_leader.elections.shared_lease import SharedLease
from celery_leader.tasks import runtime
from celery_leader.term_end.alarm import _WAKE_AT, Wakeup

KINDS = ("plain", "leader")
#: What the parent writes between two cold runs (bytes): more than a core's own caches.
EVICT_BYTES = 8 * 1024 * 1024
#: Warm runs of one kind timed together.
BLOCK = 500
_RESULT = struct.Struct("=d")


def make_tracers(election: str) -> dict[str, Callable[[], Any]]:
    """One no-op run of each kind through Celery's tracer, with the request the worker gives it."""
    app = Celery("callpath", set_as_current=False)
    app.conf.update(broker_url="memory://", result_backend="disabled://")

    @app.task(name="callpath.plain", bind=True, acks_late=True)
    def plain(self: Any) -> None:
        return None

    @leader_only
    @app.task(name="callpath.leader", bind=True)
    def leader(self: Any) -> None:
        return None

    # What a worker does before its pool forks (Celery's own __call__ protection among it).
    setup_worker_optimizations(app, "callpath")
    # The gate's fields, as the worker's main process writes them into a leader request.
    fields = {
        "plain": {},
        "leader": {"leader_token": 5, "leader_election": election, "leader_on_loss": "terminate"},
    }
    tracers = {}
    for kind, name in (("plain", "callpath.plain"), ("leader", "callpath.leader")):
        task = app.tasks[name]
        trace = build_tracer(task.name, task, eager=False, propagate=True, app=app)
        task_id = str(uuid.uuid4())
        request = {"id": task_id, **fields[kind]}

        def run(trace: Any = trace, task_id: str = task_id, request: Any = request) -> Any:
            traced = trace(task_id, (), {}, dict(request))
            if traced.info is not None:  # Celery's TraceInfo of a run that did not return
                raise RuntimeError(f"a no-op run did not succeed: {traced.info.state}")
            return traced

        tracers[kind] = run
    return tracers


def _as_pool_child() -> None:
    """Give this process a pool index, as billiard gives each prefork child."""
    from billiard.process import current_process

    current_process().index = 0


def warm(tracers: dict[str, Callable[[], Any]], runs: int) -> dict[str, float]:
    """Microseconds per run of each kind, runs back to back (median of per-block means).

    *runs* is a multiple of :data:`BLOCK`.
    """
    found: dict[str, list[float]] = {kind: [] for kind in KINDS}
    block = BLOCK
    for index in range(runs // block):
        for kind in KINDS if index % 2 == 0 else KINDS[::-1]:
            run = tracers[kind]
            started = time.perf_counter_ns()
            for _ in range(block):
                run()
            found[kind].append((time.perf_counter_ns() - started) / block / 1000)
    return {kind: statistics.median(values) for kind, values in found.items()}


def cold(tracers: dict[str, Callable[[], Any]], runs: int) -> dict[str, float]:
    """Microseconds per run of each kind, one run per wake-up (medians), in a forked child."""
    from_parent, to_child = os.pipe()
    from_child, to_parent = os.pipe()
    pid = os.fork()
    if pid == 0:  # the stand-in pool child
        code = 1
        try:
            os.close(to_child)
            os.close(from_child)
            for _ in range(2 * runs):
                kind = KINDS[os.read(from_parent, 1)[0]]
                started = time.perf_counter_ns()
                tracers[kind]()
                os.write(to_parent, _RESULT.pack((time.perf_counter_ns() - started) / 1000))
            code = 0
        finally:
            os._exit(code)
    os.close(from_parent)
    os.close(to_parent)
    buffer, source = bytearray(EVICT_BYTES), bytes(range(256)) * (EVICT_BYTES // 256)
    found: dict[str, list[float]] = {kind: [] for kind in KINDS}
    try:
        for index in range(2 * runs):
            buffer[:] = source  # every cache line of the buffer: this core's caches go cold
            kind = index % 2
            os.write(to_child, bytes([kind]))
            (took,) = _RESULT.unpack(os.read(from_child, _RESULT.size))
            found[KINDS[kind]].append(took)
    finally:
        os.close(to_child)
        os.close(from_child)
        _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError("the stand-in pool child failed")
    return {kind: statistics.median(values) for kind, values in found.items()}


def measure(runs: int, rounds: int) -> dict[str, dict[str, list[float]]]:
    """Per condition and kind: microseconds per run, one entry per round."""
    election = f"callpath-{uuid.uuid4().hex[:6]}"
    shared = SharedLease(election)
    shared.publish(5, clock.now() + 3600)
    shared._written = None  # read the shared memory, as a pool child does (not the writer's copy)
    shared.group.owner_pid = -1  # this process stands in for a pool child: its runs are recorded
    # A watchdog's alarm, asleep until its next look (well before the term's end), as a
    # pool child finds it: each terminate run reads when that is, and need not wake it.
    wakeup = shared.group.wakeup = Wakeup()
    _WAKE_AT.pack_into(wakeup._wake_at, 0, clock.now() + 1800)
    runtime.install_shared_lease(shared)
    _as_pool_child()
    tracers = make_tracers(election)
    for run in tracers.values():
        run()  # imports and first-run caches, in the parent before any fork
    found: dict[str, dict[str, list[float]]] = {
        condition: {kind: [] for kind in KINDS} for condition in ("warm", "cold")
    }
    # Slot 0's sequence number goes up by 4 per recorded run (its start and its end, each
    # written odd then even): every leader run here must pay what a pool child's pays.
    sequence = shared.group.runs._words
    try:
        for _ in range(rounds):
            for condition, measure_one in (("warm", warm), ("cold", cold)):
                before = sequence[0]
                for kind, cost in measure_one(tracers, runs).items():
                    found[condition][kind].append(cost)
                if sequence[0] - before != 4 * runs:
                    raise RuntimeError(f"{condition}: leader runs went unrecorded in the run table")
    finally:
        runtime.install_shared_lease(None)
    if shared.group.runs.busy():
        raise RuntimeError("a leader run stayed recorded in the run table after it ended")
    return found


def report(found: dict[str, dict[str, list[float]]], runs: int) -> None:
    """Print the table: medians over the rounds."""
    rounds = len(found["warm"]["plain"])
    print(
        f"\none no-op run through Celery's tracer in a stand-in pool child, microseconds "
        f"per run, median of {rounds} rounds of {runs} runs of each kind\n"
    )
    print("| condition | plain (acks_late) | leader-only | extra | extra, lowest..highest round |")
    print("|---|---|---|---|---|")
    for condition, kinds in found.items():
        plain = statistics.median(kinds["plain"])
        leader = statistics.median(kinds["leader"])
        # Paired by round: both kinds ran side by side, so a round's difference
        # is free of what moved the machine's speed between rounds.
        extras = [lead - base for lead, base in zip(kinds["leader"], kinds["plain"], strict=True)]
        print(
            f"| {condition} | {plain:.1f} | {leader:.1f} | {statistics.median(extras):+.1f} "
            f"| {min(extras):+.1f}..{max(extras):+.1f} |"
        )
    print(CALL_PATH_NOTE)


#: Printed under the table, so that docs/benchmarks.md keeps it.
CALL_PATH_NOTE = """
Warm, the checks of a leader-only run (record it in the run table, check its
term in shared memory and the watchdog's next look, mark it for
lease_lost(), unmark and unrecord it) cost its pool child a few
microseconds. Cold, the same checks cost many times as much: they reach
memory the child's caches lost while it waited. A pool child in a real
worker waits between runs too; timers put in one (docs/benchmarks.md, the
throughput section) measured 25 to 30 us per leader run there."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=3000, help="runs of each kind per round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.runs <= 0 or args.runs % BLOCK:
        parser.error(f"--runs: a positive multiple of {BLOCK}")
    report(measure(args.runs, args.rounds), args.runs)


if __name__ == "__main__":
    main()
