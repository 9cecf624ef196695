"""What the parts of the led scheduler share: its election, its settings, its schedule's state.

The class that runs a wrapped scheduler under beat's lease
(:func:`celery_leader.beat.scheduler.leader_scheduler_class`) is
``LeaderSchedulerMixin`` in front of the wrapped class. The mixin is
assembled from parts, one module per job, each a subclass of
:class:`LeaderSchedulerBase`:

* :mod:`~celery_leader.beat.leading`: taking a term over (the last sends,
  the missed policy);
* :mod:`~celery_leader.beat.steered`: pauses, run-now requests and the
  published view;
* :mod:`~celery_leader.beat.step_down`: step-down requests;
* :mod:`~celery_leader.beat.scheduler`: the mixin itself (ticking, the
  guarded send, start and close).

No part defines ``__init__``: ``LeaderSchedulerMixin.__init__`` sets the
attributes below before the wrapped scheduler's own ``__init__`` runs
(which may already set the schedule up and tick).
"""

from __future__ import annotations

import logging
from typing import Any

from celery_leader.beat.election import BeatElection
from celery_leader.beat.state import ScheduleState
from celery_leader.settings import BeatSettings, LeaderSettings

#: The logger beat's lines have always had (logging configurations name it).
logger = logging.getLogger("celery_leader.beat.scheduler")


class LeaderSchedulerBase:
    """What every part of the led scheduler reads; see the module docstring."""

    _leader_election: BeatElection | None = None
    #: ``"reserve"`` or ``"idle"``: how this beat stands by (``leader_beat_standby``, resolved).
    _leader_mode = "reserve"
    #: Beat's election's settings (its lease name, its own metrics port).
    _leader_settings: LeaderSettings
    #: ``leader_beat_*``: the wrapped scheduler, the standby mode, the missed policy.
    _leader_beat: BeatSettings
    #: Where the wrapped scheduler keeps its entries' last runs.
    _leader_state: ScheduleState

    @classmethod
    def _leader_wrapped(cls) -> type:
        """The scheduler class this one wraps: the first in the MRO that is no part of ours."""
        return next(c for c in cls.__mro__ if not issubclass(c, LeaderSchedulerBase))

    def _election(self) -> BeatElection:
        """Beat's election, built on first use (beat may build its scheduler lazily, unused)."""
        if self._leader_election is None:
            self._leader_election = BeatElection(self._leader_settings)
        return self._leader_election

    def _leader_entries(self) -> dict[str, Any] | None:
        """Every entry of the schedule by name; None when they could not be read."""
        try:
            return self._leader_state.entries(self)
        except Exception:
            logger.exception("celery-leader beat: could not read the schedule's entries")
            return None

    def _leader_count_skip(self, entry_name: str, reason: str) -> None:
        """Count a slot of *entry_name* not sent, for *reason* (``paused``, ``window``)."""
        metrics = self._election().metrics
        if metrics is not None:
            metrics.beat_skipped(self._leader_settings.name, entry_name, reason)
