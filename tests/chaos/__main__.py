"""Long chaos mode: ``python -m tests.chaos --minutes 30 [--broker B] [--elections A,B]
[--store S]``.

``--seed N`` replays a run; ``--broker`` is redis or rabbitmq; ``--elections`` adds named
elections beside the default one; ``--store`` is redis (one server) or etcd (three members).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

from tests.chaos.run import ChaosConfig, run_chaos


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--broker", choices=["redis", "rabbitmq"], default="redis")
    parser.add_argument("--elections", default="", help="named elections, comma separated")
    parser.add_argument("--store", choices=["redis", "etcd"], default="redis")
    args = parser.parse_args()
    elections = tuple(filter(None, args.elections.split(",")))
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    with tempfile.TemporaryDirectory(prefix="celery-leader-chaos-") as tmp:
        summary = run_chaos(
            ChaosConfig(
                seconds=args.minutes * 60,
                seed=seed,
                broker=args.broker,
                elections=elections,
                store=args.store,
            ),
            Path(tmp),
        )
    print(f"seed {seed}")
    for violation in summary.violations():
        print(f"VIOLATION: {violation}")
    sys.exit(1 if summary.violations() else 0)


if __name__ == "__main__":
    main()
