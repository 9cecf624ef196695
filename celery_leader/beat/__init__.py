"""Beat, led by an election of its own: ``celery_leader.beat:LeaderScheduler``.

* :mod:`~celery_leader.beat.scheduler`: ``LeaderScheduler`` (any scheduler,
  led): ticking and the guarded send; every name of beat's parts below
  that it held before they were split out still imports from it;
* :mod:`~celery_leader.beat.election`: beat's election: its lease, its
  loop's liveness, the send marks and the publish guard;
* :mod:`~celery_leader.beat.leading`: taking a term over (the last sends,
  the missed policy; :mod:`~celery_leader.beat.catch_up` judges a window);
* :mod:`~celery_leader.beat.steered`: pauses and run-now requests on beat's
  loop (:mod:`~celery_leader.beat.controls`: how they are stored;
  :mod:`~celery_leader.beat.steering`: the leader's reads and its view);
* :mod:`~celery_leader.beat.step_down`: ``celery leader step-down --beat``;
* :mod:`~celery_leader.beat.startup`: the checks that stop beat at start;
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

#: This package's modules: imported as modules, never looked up in the scheduler's names.
_SUBMODULES = frozenset(
    {
        "base",
        "catch_up",
        "controls",
        "election",
        "leading",
        "occurrence",
        "schedule_file",
        "schedule_text",
        "scheduler",
        "startup",
        "state",
        "steered",
        "steering",
        "step_down",
        "unled",
    }
)


def __getattr__(name: str) -> Any:
    """Every name of :mod:`celery_leader.beat.scheduler`, as when beat was one module."""
    if name.startswith("__") or name in _SUBMODULES:
        raise AttributeError(f"module 'celery_leader.beat' has no attribute {name!r}")
    scheduler = import_module("celery_leader.beat.scheduler")  # loaded on first use
    try:
        return getattr(scheduler, name)
    except AttributeError:
        raise AttributeError(f"module 'celery_leader.beat' has no attribute {name!r}") from None
