"""Beat, led by an election of its own: ``celery_leader.beat:LeaderScheduler``.

* :mod:`~celery_leader.beat.scheduler`: ``LeaderScheduler`` (any scheduler,
  led), beat's election and the guarded send;
* :mod:`~celery_leader.beat.state`: where each scheduler family keeps its
  entries' last runs, read and re-anchored at a takeover;
* :mod:`~celery_leader.beat.schedule_file`: one beat per local schedule
  file (a lock beside it);
* :mod:`~celery_leader.beat.unled`: a beat with leader settings under
  another scheduler is refused at start (``leader_beat_unled`` allows it).

The scheduler's names are loaded on first use, so ``import celery_leader``
does not load Celery's beat.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from celery_leader.beat.scheduler import (
        TOKEN_HEADER,
        BeatElection,
        LeaderScheduler,
        LeaderSchedulerMixin,
    )

__all__ = ["TOKEN_HEADER", "BeatElection", "LeaderScheduler", "LeaderSchedulerMixin"]


def __getattr__(name: str) -> Any:
    """Every name of :mod:`celery_leader.beat.scheduler`, as when beat was one module."""
    if name.startswith("__") or name in ("scheduler", "schedule_file", "state", "unled"):
        raise AttributeError(f"module 'celery_leader.beat' has no attribute {name!r}")
    scheduler = import_module("celery_leader.beat.scheduler")  # loaded on first use
    try:
        return getattr(scheduler, name)
    except AttributeError:
        raise AttributeError(f"module 'celery_leader.beat' has no attribute {name!r}") from None
