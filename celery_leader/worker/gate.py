"""The gate's verdicts on a leader message, and what settles when its run ends.

A leader message that passed the lease check (``LeaderRequest.revoked``)
is asked, in this order, on the consumer's loop thread:

1. :meth:`Gate.admit_delivery`: is it a copy of a message that runs or
   completed here (:mod:`celery_leader.worker.redelivery`)? Parked, or
   acknowledged without running when its own completed run is proven.
2. :meth:`Gate.admit_occurrence`: does its occurrence run or has it
   completed (:mod:`celery_leader.worker.occurrences`)? Skipped.
3. :meth:`Gate.admit_overlap`: does a run of its overlap key go on
   (:mod:`celery_leader.worker.overlap`)? It waits or is skipped.

When a run ends (any thread), :meth:`Gate.run_settled` releases what waited
for it: copies of its message, the message waiting for its overlap key, its
occurrence's record. A broker reconnect (:meth:`Gate.connection_gone`)
forgets what waited: the broker delivers it again.

What waits is *parked*: kept unacknowledged without holding a prefetch slot
(as Celery does for ETA messages), and handed to the worker again through
the gate when released. The gate asks its host (the worker's
:class:`~celery_leader.worker.coordinator.Coordinator`) for the consumer,
the loop and the elections only, through :class:`GateHost`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from celery.worker.state import task_ready, task_reserved

from celery_leader.signals import leader_task_skipped
from celery_leader.skip_reasons import TASK_OCCURRENCE, TASK_OVERLAP
from celery_leader.worker.occurrences import REDELIVERED, RUNNING, occurrence_of, result_ready
from celery_leader.worker.overlap import RUN as OVERLAP_RUN
from celery_leader.worker.overlap import SKIPPED, WAIT, Overlaps, store_result
from celery_leader.worker.redelivery import (
    DROP,
    FAILED,
    PARK,
    RUN,
    Redeliveries,
    describe_parking,
    release_copies,
)

if TYPE_CHECKING:
    from celery_leader.worker.worker_election import WorkerElection

logger = logging.getLogger(__name__)


class GateHost(Protocol):
    """What the gate needs of the worker it runs in."""

    #: The consumer (None while Celery reconnects to the broker or shuts down).
    consumer: Any

    def election_for(self, task: Any) -> WorkerElection | None:
        """The election *task* runs under here."""

    def post(self, fn: Callable[[], None]) -> None:
        """Run *fn* on the consumer's loop thread."""

    def send_signal(self, signal_: Any, election: str, **kwargs: Any) -> None:
        """Send one of celery_leader's signals for *election*."""

    def lease_of(self, election: str | None) -> str:
        """The lease name of *election* (None: the default one)."""


class Gate:
    """The worker's record of leader runs and what waits for them; one per worker process."""

    def __init__(self, host: GateHost) -> None:
        self._host = host
        #: Leader runs by task id, and their messages delivered again meanwhile.
        self.redeliveries = Redeliveries()
        #: Leader runs by overlap key, and the message each may have waiting.
        self.overlaps = Overlaps(on_skip=self._skipped)

    def connection_gone(self) -> None:
        """The consumer stopped (a reconnect, or shutdown): forget what waited at the gate.

        The messages that waited for an overlap key never ran and come back
        from the broker: the redelivery record forgets them as failed runs
        (not acknowledged), so that what the broker delivers again of them,
        under their task id, is not held behind a run that will never end.
        The copies that waited for a run come back too: forgotten here, their
        new deliveries go through the gate.
        """
        for request in self.overlaps.forget_waiting():
            if getattr(request, "leader_recorded", False):
                self.redeliveries.settle(request, FAILED)
        for copy in self.redeliveries.forget_parked():
            self._unpark(copy)

    def admit_delivery(self, request: Any) -> bool:
        """True to run *request* now; False when it is a copy of a run's message (kept or dropped).

        Loop thread, at the gate. See :mod:`celery_leader.worker.redelivery`.
        """
        verdict = self.redeliveries.admit(request)
        if verdict == RUN:
            return True
        task_ready(request)  # not reserved any more: the hand-back at a term's end skips it
        if verdict == DROP:
            logger.info(
                "celery-leader: %s was delivered again after its run completed here; "
                "acknowledged without running",
                request.humaninfo(),
            )
            request.acknowledge()
            return False
        (logger.warning if verdict == PARK else logger.info)(describe_parking(request, verdict))
        self._park(request)
        return False

    def admit_occurrence(self, request: Any) -> bool:
        """True to go on with *request*; False when its occurrence runs or completed (skipped).

        Loop thread, at the gate, after :meth:`admit_delivery` and before
        :meth:`admit_overlap` (a copy of a running occurrence is skipped for
        its occurrence, not its overlap key). A skipped message is
        acknowledged, its result ``SKIPPED`` with ``{"reason": "occurrence",
        "occurrence": ...}``. The completing run's own message delivered
        again (its task id), and any message whose result is ready in the
        backend already, is acknowledged without running and without
        touching its result (a ``SKIPPED`` over a ``SUCCESS`` would leave
        ``result.get()`` waiting), neither signalled nor counted: as a copy
        the redelivery record drops. See :mod:`celery_leader.worker.occurrences`.
        """
        occurrence = occurrence_of(request)
        election = self._host.election_for(request.task)
        if occurrence is None or election is None:
            return True
        why = election.occurrences.verdict(request, occurrence)
        if why is None:
            return True
        if why == REDELIVERED or result_ready(request.task, request.id):
            logger.info(
                "celery-leader: %s was delivered again after its run of occurrence %s "
                "completed; acknowledged without running, its result kept",
                request.humaninfo(),
                occurrence,
            )
            task_ready(request)  # not reserved any more: the hand-back at a term's end skips it
            request.acknowledge()
            return False
        logger.info(
            "celery-leader: %s skipped: occurrence %s %s",
            request.humaninfo(),
            occurrence,
            "is running here" if why == RUNNING else "completed already",
        )
        info = {"reason": TASK_OCCURRENCE, "occurrence": occurrence}
        store_result(request.task, lambda backend: backend.store_result(request.id, info, SKIPPED))
        request.acknowledge()
        task_ready(request)  # not reserved any more: the hand-back at a term's end skips it
        self._skipped(request, None, reason=TASK_OCCURRENCE, occurrence=occurrence)
        return False

    def claim_occurrence(self, request: Any) -> None:
        """*request* goes to the pool: it is its occurrence's run from now on. Loop thread."""
        occurrence = occurrence_of(request)
        election = self._host.election_for(request.task)
        if occurrence is not None and election is not None:
            election.occurrences.claim(request, occurrence)

    def admit_overlap(self, request: Any) -> bool:
        """True to run *request* now; False when it waits for, or was skipped by, a run of its key.

        Loop thread, at the gate, after :meth:`admit_delivery`. See
        :mod:`celery_leader.worker.overlap`.
        """
        verdict = self.overlaps.admit_request(request)
        if verdict == OVERLAP_RUN:
            return True
        task_ready(request)  # not reserved any more: the hand-back at a term's end skips it
        if verdict == WAIT:
            self._park(request)
        return False

    def _park(self, request: Any) -> None:
        """Keep *request* aside, unacknowledged, without holding a prefetch slot."""
        qos = getattr(self._host.consumer, "qos", None)
        if qos is not None and qos.increment_eventually():
            # The slot goes back to this same consumer's count (a reconnect makes a new one).
            request.leader_parked_qos = qos

    def _skipped(
        self, request: Any, key: str | None, reason: str = TASK_OVERLAP, **extra: Any
    ) -> None:
        election = request.leader_election or self._host.lease_of(None)
        self._host.send_signal(
            leader_task_skipped,
            election,
            token=request.leader_token,
            task=request.task.name,
            task_id=request.id,
            reason=reason,
            key=key,
            **extra,
        )

    def run_settled(self, request: Any, outcome: str) -> None:
        """The run of *request* ended (any thread): settle what waited for it.

        The copies of its message delivered again meanwhile, and the message
        that waited for its overlap key (it goes to the gate again); a run
        that completed joins its election's record of completed occurrences.
        """
        # Each guard skips what the run never joined (the common run joins neither).
        if request.leader_occurrence_key is not None:
            election = self._host.election_for(request.task)
            grown = election.occurrences.settle(request, outcome) if election is not None else None
            if election is not None and grown is not None:
                election.occurrence_sync.completed(grown)
        copies = self.redeliveries.settle(request, outcome)
        if copies:
            self._host.post(
                lambda: release_copies(
                    copies, outcome, run=request, redispatch=self._redispatch, unpark=self._unpark
                )
            )
        waiting = self.overlaps.settle(request) if request.leader_overlap_key is not None else []
        if waiting:

            def release() -> None:
                for message in waiting:
                    self._unpark(message)
                    self._redispatch(message)

            self._host.post(release)

    @staticmethod
    def _unpark(request: Any) -> None:
        qos = getattr(request, "leader_parked_qos", None)
        if qos is not None:
            request.leader_parked_qos = None
            qos.decrement_eventually()

    def _redispatch(self, request: Any) -> None:
        """Hand a copy that waited to the worker again: through the gate, as on receipt."""
        consumer = self._host.consumer
        if consumer is None:
            return  # reconnecting: the broker delivers the unacknowledged message again
        task_reserved(request)
        consumer.on_task_request(request)
