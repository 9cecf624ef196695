"""``python -m celery_leader.simulation [--store X] [--seeds N] [--seed S]`` (``run.sh simulate``).

Runs the deterministic simulation of the lease protocol and ends with the
line ``N seeds, V violations``; the exit status is 0 only when V is 0. Each
failing seed prints its violation and the last events before it, and
replays exactly with ``--seed S`` (and the same ``--store``). ``--store``
picks the modelled store (see :mod:`.models`): ``redis`` (the default),
``sentinel``, ``postgres`` or ``etcd``. ``--lifelines`` gives every process
a lifeline and lets followers take over a holder whose lifeline ended (see
:mod:`.lifelines`; not with etcd). ``--failover [N]`` prints, instead, the
failover times after the leader's process is killed, with and without
lifelines, over N seeds (see :mod:`.failover`).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from celery_leader.simulation.failover import report
from celery_leader.simulation.model_store import Broken
from celery_leader.simulation.models import DEFAULT, STORES, check_broken
from celery_leader.simulation.runner import run_seeds
from celery_leader.simulation.world import SeedResult, quiet_loggers, simulate

#: Failing seeds printed in full; the rest are listed by number.
SHOWN = 5
#: Seeds ``--failover`` measures when it is given no number.
FAILOVER_SEEDS = 200


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m celery_leader.simulation",
        description="Deterministic simulation of the lease protocol (the real LeaseManager "
        "and the worker's end of a term against a model of a lease store, under faults).",
    )
    parser.add_argument(
        "--store",
        choices=list(STORES),
        default=DEFAULT,
        help=f"the store modelled, with the faults it can suffer (default {DEFAULT})",
    )
    parser.add_argument(
        "--with-gaps",
        action="store_true",
        help="also the faults the store covers only in part, in the forms it does not cover "
        "(etcd: a snapshot restored under the same cluster id that a worker cannot notice); "
        "violations are expected",
    )
    parser.add_argument("--seeds", type=int, default=10_000, help="seeds to run (default 10000)")
    parser.add_argument("--first", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument("--seed", type=int, help="run this one seed only (replay)")
    parser.add_argument("--jobs", type=int, help="processes (default: one per core)")
    parser.add_argument("--trace", type=int, default=30, help="trace lines per failing seed")
    parser.add_argument(
        "--full-trace", action="store_true", help="with --seed: print the whole trace"
    )
    parser.add_argument(
        "--every-event",
        action="store_true",
        help="judge after every event, not only after the events that run node code",
    )
    parser.add_argument(
        "--elections",
        type=int,
        default=1,
        help="elections per node, balanced over the nodes and judged one by one (default 1)",
    )
    parser.add_argument(
        "--lifelines",
        action="store_true",
        help="every process has a lifeline, and followers take over a holder whose lifeline "
        "ended; with faults that end lifelines (other runs of the same seeds)",
    )
    parser.add_argument(
        "--failover",
        type=int,
        nargs="?",
        const=FAILOVER_SEEDS,
        metavar="N",
        help="print the failover times after the leader's process is killed, without and "
        f"with lifelines, over N seeds (default {FAILOVER_SEEDS}), and nothing else",
    )
    # Not part of the contract: a store or kill layer that is wrong on purpose, to see the
    # checker fail.
    parser.add_argument("--broken", choices=[mode.value for mode in Broken], help=argparse.SUPPRESS)
    return parser


def _show(result: SeedResult, broken: Broken | None, args: argparse.Namespace) -> None:
    elections, store, gaps, lifelines = args.elections, args.store, args.with_gaps, args.lifelines
    extra = f" --store {store}" if store != DEFAULT else ""
    extra += " --with-gaps" if gaps else ""
    extra += " --lifelines" if lifelines else ""
    extra += f" --broken {broken.value}" if broken is not None else ""
    if elections > 1:
        extra += f" --elections {elections}"
    print(f"seed {result.seed}: VIOLATION: {result.violation}")
    print(f"  plan: {result.plan}")
    for line in result.trace:
        print(f"  {line}")
    print(f"  replay: ./run.sh simulate --seed {result.seed}{extra}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the simulation; return the exit status."""
    args = _parser().parse_args(argv)
    if args.elections < 1:
        print(f"--elections={args.elections} is not allowed: it must be 1 or more")
        return 2
    broken = Broken(args.broken) if args.broken else None
    try:
        check_broken(args.store, broken, lifelines=args.lifelines or args.failover is not None)
    except ValueError as exc:
        print(exc)
        return 2
    if args.failover is not None:
        print(report(range(args.first, args.first + args.failover), store=args.store))
        return 0
    if args.seed is not None:
        with quiet_loggers():
            result = simulate(
                args.seed,
                broken=broken,
                trace_limit=args.trace,
                every_event=args.every_event,
                full_trace=args.full_trace,
                elections=args.elections,
                store=args.store,
                gaps=args.with_gaps,
                lifelines=args.lifelines,
            )
        if result.violation is not None:
            _show(result, broken, args)
        else:
            print(f"seed {result.seed}: ok ({result.plan}; {result.terms} terms)")
            for line in result.trace:
                print(f"  {line}")
        print(f"1 seeds, {0 if result.violation is None else 1} violations")
        return 0 if result.violation is None else 1
    summary = run_seeds(
        range(args.first, args.first + args.seeds),
        broken=broken,
        jobs=args.jobs,
        trace_limit=args.trace,
        every_event=args.every_event,
        elections=args.elections,
        store=args.store,
        gaps=args.with_gaps,
        lifelines=args.lifelines,
    )
    for result in summary.failures[:SHOWN]:
        _show(result, broken, args)
    rest = summary.failures[SHOWN:]
    if rest:
        print(f"{len(rest)} more failing seeds: " + " ".join(str(r.seed) for r in rest))
    print(
        f"({summary.seconds:.1f} s, {summary.seeds / max(summary.seconds, 1e-9):.0f} seeds/s, "
        f"{summary.terms} terms, {summary.events} events)"
    )
    print(f"{summary.seeds} seeds, {summary.violations} violations")
    return 0 if summary.violations == 0 else 1
