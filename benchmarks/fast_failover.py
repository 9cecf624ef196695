"""Crash failover with ``leader_fast_failover`` on real workers (and beats), per store and ttl.

Run from the repository root:
    .venv/bin/python -m benchmarks.fast_failover [--stores redis sentinel postgres sqlite]
        [--ttl 3 10 30] [--rounds 20] [--what workers beat] [--json FILE]

Per store and ttl: three prefork workers (Redis broker), a lease store of
that kind started for the run, ``leader_fast_failover = True``. Each round
waits for the leader, strikes at a random point of its renew cycle, SIGKILLs
the leader (the whole process group in even rounds, the main process alone
in odd ones, as an OOM kill does), sends a leader-only task every 10 ms, and
measures the seconds from the kill to the first run of one on another
worker. A new worker replaces the dead one before the next round.

Prints one table: median, p90, p99 and worst per store and ttl. With 20
rounds the nearest-rank p99 is the worst round; read it as such.

``--what beat`` (or ``--what workers beat``) measures ``celery beat`` too:
two beats, the sending one SIGKILLed, the seconds to the standby's takeover
and to its first send (:mod:`benchmarks.beat_fast_failover`), in a table of
its own. ``--json`` then writes the beat's figures under ``"beat"``, beside
the workers' stores.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import signal
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.beat_fast_failover import EVERY, BeatFigures, beat_failover_rounds, fast_cluster
from benchmarks.workers import runs

#: The stores whose servers can see a process die (a lifeline).
LIFELINE_STORES = ("redis", "sentinel", "postgres", "sqlite")


def _rank(values: list[float], fraction: float) -> float:
    """The nearest-rank percentile of *values*."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def failover_rounds(kind: str, ttl: float, rounds: int, tmp: Path) -> list[float]:
    """Seconds from each SIGKILL of the leader to the first leader task on another worker."""
    found: list[float] = []
    rng = random.Random(1)
    with fast_cluster(kind, ttl, tmp) as cluster:
        cluster.prime_store()
        cluster.start(3)
        for index in range(rounds):
            leader = cluster.leader_worker(timeout=ttl * 3 + 20)
            cluster.history_client.delete("history")
            time.sleep(0.5 + rng.uniform(0, ttl / 3))
            killed_at = time.monotonic()
            if index % 2 == 0:
                leader.signal(signal.SIGKILL)
            else:
                leader.proc.send_signal(signal.SIGKILL)
            first = None
            i = 0
            while first is None and time.monotonic() < killed_at + ttl * 3 + 10:
                cluster.send("leader_record", i)
                i += 1
                new = [x for x in runs(cluster.history()) if x["worker"] != leader.nodename]
                if new:
                    first = min(x["at"] for x in new)
                time.sleep(0.01)
            if first is None:
                raise RuntimeError(f"{kind}, ttl {ttl:g}: no failover in round {index}")
            found.append(first - killed_at)
            leader.proc.wait(10)
            cluster.start(1)
    return found


def _cells(values: list[float]) -> str:
    """Median, p90, p99 and worst of *values* as table cells."""
    return (
        f"{statistics.median(values):.3f} | {_rank(values, 0.9):.3f} "
        f"| {_rank(values, 0.99):.3f} | {max(values):.3f}"
    )


def _print_workers(figures: dict[str, dict[str, list[float]]], rounds: int) -> None:
    print()
    print(f"crash failover with leader_fast_failover, {rounds} rounds each (seconds)")
    print()
    print("| store | ttl | median | p90 | p99 | worst | goal p99 <= 0.5 |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for kind, by_ttl in figures.items():
        for ttl_text, values in by_ttl.items():
            p99 = _rank(values, 0.99)
            print(
                f"| {kind} | {ttl_text} s | {statistics.median(values):.3f} "
                f"| {_rank(values, 0.9):.3f} | {p99:.3f} | {max(values):.3f} "
                f"| {'met' if p99 <= 0.5 else 'MISSED'} |"
            )


def _print_beat(figures: dict[str, dict[str, BeatFigures]], rounds: int) -> None:
    print()
    print(
        f"beat crash failover with leader_fast_failover, an entry every {EVERY:g} s, "
        f"{rounds} rounds each (seconds from the SIGKILL)"
    )
    print()
    print(
        "| store | ttl | takeover median | takeover p99 | first send median | p90 | p99 "
        "| worst | by expiry | slots sent twice | goal p99 <= 0.5 |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for kind, by_ttl in figures.items():
        for ttl_text, found in by_ttl.items():
            p99 = _rank(found.first_send, 0.99)
            print(
                f"| {kind} | {ttl_text} s | {statistics.median(found.takeover):.3f} "
                f"| {_rank(found.takeover, 0.99):.3f} | {_cells(found.first_send)} "
                f"| {found.expired} | {found.twice} | {'met' if p99 <= 0.5 else 'MISSED'} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stores", nargs="+", default=list(LIFELINE_STORES))
    parser.add_argument("--ttl", nargs="+", type=float, default=[3.0, 10.0, 30.0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument(
        "--what", nargs="+", choices=("workers", "beat"), default=["workers"], help="what to kill"
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    figures: dict[str, dict[str, list[float]]] = {}
    beat: dict[str, dict[str, BeatFigures]] = {}
    with tempfile.TemporaryDirectory(prefix="fast-failover-") as tmp:
        for kind in args.stores:
            for ttl in args.ttl:
                for what in args.what:
                    where = Path(tmp) / f"{what}-{kind}-{ttl:g}"
                    (where / "store").mkdir(parents=True)
                    (where / "cluster").mkdir()
                    if what == "workers":
                        found = failover_rounds(kind, ttl, args.rounds, where)
                        figures.setdefault(kind, {})[f"{ttl:g}"] = found
                    else:
                        beat_found = beat_failover_rounds(kind, ttl, args.rounds, where)
                        beat.setdefault(kind, {})[f"{ttl:g}"] = beat_found
                        found = beat_found.first_send
                    label = (
                        f"{kind} ttl {ttl:g}" if what == "workers" else f"beat, {kind} ttl {ttl:g}"
                    )
                    print(f"{label}: {', '.join(f'{x:.3f}' for x in found)}", flush=True)
    if figures:
        _print_workers(figures, args.rounds)
    if beat:
        _print_beat(beat, args.rounds)
    if args.json is not None:
        data: dict[str, object] = dict(figures)
        if beat:
            data["beat"] = {
                kind: {ttl: found.as_json() for ttl, found in by_ttl.items()}
                for kind, by_ttl in beat.items()
            }
        args.json.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
