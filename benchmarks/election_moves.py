"""Balanced elections moving: a step-down of one election, and the death of a worker leading two.

Three workers, six elections, ttl 4 s, Redis broker and store
(:mod:`harness.election_moves`, which the integration test
``tests/integration/test_election_moves.py`` runs too). Per round, on a
fresh cluster each:

* **step-down**: ``celery leader step-down --election billing``; seconds
  billing was led by nobody (store sampled every 20 ms), and how many other
  elections changed holder in the 12 s after billing's next term began;
* **SIGKILL**: a worker leading two elections is killed; for each, seconds
  from the kill, and from the moment its lease ran out, to its first task
  on another worker.

Run: ``python -m benchmarks.election_moves [--rounds N]``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from harness.cluster import Cluster
from harness.election_moves import SIX, TTL, kill_one_with_two, start_six, step_down_one


def step_down_round(tmp: Path) -> tuple[float, int]:
    """(seconds billing was led by nobody, other elections that changed holder after)."""
    tmp.mkdir()
    cluster = Cluster(tmp, "redis")
    try:
        start_six(cluster)
        time.sleep(2 * TTL)  # steady: the start's hand-overs are done
        seen = step_down_one(cluster)
        moved = sum(1 for e in SIX if e != "billing" and seen.seen_after[e] != {seen.before[e]})
        return seen.gap, moved
    finally:
        cluster.close()


def kill_round(tmp: Path) -> list[tuple[float, float]]:
    """Per election of the killed worker: (seconds after the kill, after its lease ended)."""
    tmp.mkdir()
    cluster = Cluster(tmp, "redis")
    try:
        workers = start_six(cluster)
        time.sleep(2)
        _, takeovers = kill_one_with_two(cluster, workers)
        return [(t.after_kill, t.after_lease_end) for t in takeovers]
    finally:
        cluster.close()


def spread(values: list[float]) -> str:
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each (default 5)")
    args = parser.parse_args()
    gaps: list[float] = []
    moved: list[int] = []
    after_kill: list[float] = []
    after_end: list[float] = []
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.rounds):
            gap, others = step_down_round(Path(scratch) / f"s{round_}")
            gaps.append(gap)
            moved.append(others)
            print(
                f"step-down {round_ + 1}: billing led by nobody {gap:.2f} s, {others} "
                "other election(s) moved",
                flush=True,
            )
        for round_ in range(args.rounds):
            found = kill_round(Path(scratch) / f"k{round_}")
            for kill, end in found:
                after_kill.append(kill)
                after_end.append(end)
            print(
                "SIGKILL "
                + str(round_ + 1)
                + ": first tasks "
                + ", ".join(
                    f"{k:.2f} s after the kill ({e:+.2f} s after its lease ended)" for k, e in found
                ),
                flush=True,
            )
    print()
    print(f"| ttl {TTL:g} s, 3 workers, 6 elections, {args.rounds} rounds | min / median / max |")
    print("|---|---|")
    print(f"| step-down: billing led by nobody, s | {spread(gaps)} |")
    print(
        f"| step-down: other elections moved | {min(moved)} / {statistics.median(moved):g} "
        f"/ {max(moved)} |"
    )
    print(f"| SIGKILL: first task after the kill, s (each of 2 elections) | {spread(after_kill)} |")
    print(f"| SIGKILL: first task after its lease ended, s | {spread(after_end)} |")


if __name__ == "__main__":
    main()
