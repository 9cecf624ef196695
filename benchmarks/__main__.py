"""Run every benchmark: ``python -m benchmarks`` (lease core, then workers end to end)."""

from __future__ import annotations

import sys

from benchmarks import lease, workers

if __name__ == "__main__":
    argv = sys.argv
    sys.argv = [argv[0]]
    lease.main()
    workers.main()
