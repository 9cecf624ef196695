"""``python -m celery_leader.simulation``: see :mod:`celery_leader.simulation.cli`."""

from __future__ import annotations

import sys

from celery_leader.simulation.cli import main

if __name__ == "__main__":
    sys.exit(main())
