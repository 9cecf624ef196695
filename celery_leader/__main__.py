"""``python -m celery_leader``: the ``celery-leader`` console script (see ``cli/demo.py``)."""

from __future__ import annotations

from celery_leader.cli.demo import main

if __name__ == "__main__":
    main()
