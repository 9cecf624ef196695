"""The partition matrix: ``python -m tests.partition [--store S,..] [--broker B,..]
[--fault F,..] [--repeat N] [--markdown] [-v]`` (needs root).

Runs every fault of tests/partition/scenarios.py that applies to a store
on a fresh bed, for every store and broker kind (all by default), prints
one table row per run (store, broker, fault, terms, stale starts, stale
writes accepted and refused, lost, duplicated, the times to a new leader
and back to work after the heal; then runs in flight at a term change, the
longest gap in the runs during the fault and the verdict), with
``--markdown`` the Markdown table of docs/verification.md too, then the reasons of each failed run.
Exits 1 when a run failed. Where a store cannot keep guarantee 1 (Sentinel
without min-replicas-to-write, its primary cut off with the leader) the
verdict is "split shown, fence held" when the split showed and the fence
refused every stale write.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from tests.partition.scenarios import (
    BROKERS,
    FAULTS,
    STORES,
    Outcome,
    applies,
    markdown,
    partition_bed,
    run_scenario,
    table,
)


def _choice(value: str, known: dict[str, object], what: str) -> list[str]:
    names = list(known) if value == "all" else [v for v in value.split(",") if v]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise SystemExit(f"--{what} {value!r}: expected 'all' or some of {', '.join(known)}")
    return names


def _run(store: str, broker: str, fault: str, *, fast_failover: bool = False) -> Outcome:
    with (
        tempfile.TemporaryDirectory(prefix="celery-leader-partition-") as tmp,
        partition_bed(Path(tmp), store, broker, fast_failover=fast_failover) as bed,
    ):
        return run_scenario(bed, FAULTS[fault])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--store", default="all", help=f"of {', '.join(STORES)}")
    parser.add_argument("--broker", default="all", help=f"of {', '.join(BROKERS)}")
    parser.add_argument("--fault", default="all", help=f"of {', '.join(FAULTS)}")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each combination")
    parser.add_argument(
        "--markdown", action="store_true", help="the Markdown table (docs/verification.md) too"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="each run's report")
    parser.add_argument(
        "--fast-failover", action="store_true", help="the workers with leader_fast_failover"
    )
    args = parser.parse_args()
    stores = _choice(args.store, dict(STORES), "store")
    brokers = _choice(args.broker, dict(BROKERS), "broker")
    faults = _choice(args.fault, dict(FAULTS), "fault")
    outcomes: list[Outcome] = []
    for store in stores:
        for broker in brokers:
            for fault in faults:
                if not applies(FAULTS[fault], store):
                    continue
                for _ in range(max(args.repeat, 1)):
                    outcome = _run(store, broker, fault, fast_failover=args.fast_failover)
                    outcomes.append(outcome)
                    print(f"{store}/{broker} {fault}: {outcome.verdict()}", flush=True)
                    if args.markdown:  # as it comes: a long run cut short keeps its rows
                        print(markdown([outcome]).splitlines()[-1], flush=True)
                    if args.verbose:
                        print(outcome.report(), flush=True)
    print(table(outcomes))
    if args.markdown:
        print(f"\n{markdown(outcomes)}")
    failed = [o for o in outcomes if o.failures()]
    for outcome in failed:
        print(f"\n{outcome.report()}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
