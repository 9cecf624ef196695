"""Deterministic simulation at length: many seeds, the correct store and the broken ones.

Run from the repository root:  .venv/bin/python -m benchmarks.simulation [--seeds 100000]

CI runs 10,000 seeds (``./run.sh simulate``); this runs ten times as many
against the model of the Redis store, and a share of that against each
deliberately broken store, to show how often the checker catches what it
breaks. Prints a table: model, seeds, violations (seeds with one), seconds
and seeds per second (all cores), with the failing seeds of the correct model
listed below it for replay with ``./run.sh simulate --seed S``.
"""

from __future__ import annotations

import argparse
import os
from collections import Counter

from celery_leader.simulation import Broken, run_seeds
from celery_leader.simulation.model_store import LIFELINE_BREAKS, ModelStore

#: Failing seeds listed by number (replay each with ./run.sh simulate --seed S).
SHOWN = 20
#: Violations by what the checker says first (its messages name nodes and numbers after).
KINDS = (
    "two leaders at once",
    "work of one term overlaps another term",
    "with its validity over",
    "after a term with token",
    "granted to",
    "stuck",
    "the run raised",
)


def kind(violation: str) -> str:
    return next((known for known in KINDS if known in violation), violation)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=100_000)
    parser.add_argument("--broken-seeds", type=int, default=2_000)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument(
        "--election-seeds", type=int, default=10_000, help="seeds with 3 balanced elections"
    )
    parser.add_argument(
        "--lifeline-seeds", type=int, default=10_000, help="seeds with lifelines (--lifelines)"
    )
    args = parser.parse_args()
    # (title, broken variant, seeds, elections per node, lifelines)
    runs = [("Redis model", None, args.seeds, 1, False)]
    runs += [("Redis model, 3 elections balanced", None, args.election_seeds, 3, False)]
    runs += [("Redis model, lifelines", None, args.lifeline_seeds, 1, True)]
    runs += [
        (f"broken: {mode.value}", mode, args.broken_seeds, 1, mode in LIFELINE_BREAKS)
        for mode in Broken
        # The other stores' variants need their models (./run.sh simulate --store S).
        if mode in ModelStore.breaks and mode is not Broken.BALANCER_TAKES_EARLY
    ]
    runs += [
        (
            "broken: balancer-takes-early (3 el.)",
            Broken.BALANCER_TAKES_EARLY,
            args.broken_seeds,
            3,
            False,
        )
    ]
    print(f"\ndeterministic simulation, {args.jobs or os.cpu_count()} processes\n")
    header = ("store", "seeds", "violations", "seconds", "seeds/s")
    print(f"| {header[0]:<36} | " + " | ".join(f"{h:>7}" for h in header[1:]) + " |")
    print(f"|{'-' * 38}|{'-' * 9}|{'-' * 12}|{'-' * 9}|{'-' * 9}|")
    failing: list[int] = []
    kinds: Counter[str] = Counter()
    for title, broken, count, elections, lifelines in runs:
        seeds = range(args.first, args.first + count)
        summary = run_seeds(
            seeds, broken=broken, jobs=args.jobs, elections=elections, lifelines=lifelines
        )
        rate = summary.seeds / summary.seconds
        print(
            f"| {title:<36} | {summary.seeds:>7} | {summary.violations:>10} | "
            f"{summary.seconds:>7.1f} | {rate:>7.0f} |"
        )
        if broken is None:
            failing += [result.seed for result in summary.failures]
            kinds.update(kind(result.violation or "") for result in summary.failures)
    if failing:
        listed = " ".join(map(str, failing[:SHOWN])) + (" ..." if len(failing) > SHOWN else "")
        print(f"\nfailing seeds of the Redis model ({len(failing)}): {listed}")
        for what, count in kinds.most_common():
            print(f"- {count} x {what}")


if __name__ == "__main__":
    main()
