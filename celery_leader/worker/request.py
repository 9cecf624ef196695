"""The gate: a Request class that admits leader-only work only under a valid lease.

Celery calls ``Request.revoked()`` in the worker's main process right before
it hands a task to the pool (and regenerates ``execute_using_pool`` per task
type, so that is not the place to hook). Overriding ``revoked()`` lets the
gate run exactly there: when this worker holds no valid lease, the message
is rejected *with requeue* (it goes back to the broker, never dropped, never
run), and when it does, the term's fencing token goes into the request,
where the task reads it as ``self.request.leader_token``. The policy that
applies in this pool goes in too (``leader_on_loss``), so the child knows
whether to put the run under the watchdog.

What a stopped run's message becomes is decided in
:mod:`celery_leader.term_end`; this module only carries it out for requests.
"""

from __future__ import annotations

import functools
import logging
import sys
from types import FrameType
from typing import Any

from celery.worker.request import Request
from celery.worker.state import task_ready

from celery_leader.settings import names_for_app
from celery_leader.tasks import leader_queue_for
from celery_leader.tasks.runtime import shared_lease
from celery_leader.term_end.in_worker import ended_by_term, settle_stopped_run
from celery_leader.worker.coordinator import current_coordinator
from celery_leader.worker.occurrences import OCCURRENCE_HEADER
from celery_leader.worker.redelivery import COMPLETED, FAILED, SUPERSEDED

#: Message properties carried over when a message is re-routed.
_KEPT_PROPERTIES = ("correlation_id", "reply_to", "priority", "expiration")


def republish(app: Any, message: Any, queue_name: str) -> None:
    """Publish *message* unchanged (body, headers, properties) to the queue *queue_name*."""
    queue = app.amqp.queues[queue_name]
    properties = {k: message.properties[k] for k in _KEPT_PROPERTIES if message.properties.get(k)}
    with app.producer_or_acquire() as producer:
        producer.publish(
            message.body,
            exchange=queue.exchange,
            routing_key=queue.routing_key,
            declare=[queue],
            headers=message.headers,
            content_type=message.content_type,
            content_encoding=message.content_encoding,
            retry=True,
            **properties,
        )


logger = logging.getLogger(__name__)


def _called_from(frame: FrameType | None, function: str) -> bool:
    """True when *frame* (the caller's) runs a function named *function*.

    Why a name and not an override: Celery's ``create_request_cls`` builds a
    per-task subclass of this class whose ``execute_using_pool`` replaces
    ours without calling it, and calls :meth:`LeaderRequest.revoked` itself.
    The caller's name is what both versions share.
    """
    return frame is not None and frame.f_code.co_name == function


def _hands_on(exc: Any) -> bool:
    """True for the exceptions by which a task hands its message on instead of failing.

    A retry or a replacement has a message of its own, and an ignored message
    or one rejected without requeue is done with. A message rejected *with*
    requeue (a run stopped at its term's end) goes back to run again: it is
    not handed on.
    """
    from billiard.einfo import ExceptionWithTraceback  # noqa: PLC0415 - Celery's own
    from celery.exceptions import Ignore, Reject, Retry  # noqa: PLC0415

    if isinstance(exc, ExceptionWithTraceback):  # not getattr(exc, "exc"): Retry has one too
        exc = exc.exc
    if isinstance(exc, Reject):
        return not exc.requeue
    return isinstance(exc, (Retry, Ignore))


class LeaderRequest(Request):  # type: ignore[misc]
    """A task request that passes the leader gate before it reaches the pool."""

    def revoked(self) -> bool:  # noqa: PLR0911 - one verdict per reason, each said where it falls
        """Revoked by Celery, or not admitted by the gate (then handed back)."""
        if super().revoked():
            return True
        if self.acknowledged:
            return True  # already handed back by revocation on lease loss
        coordinator = current_coordinator()
        task = self.task
        profile = coordinator.gate_profile(task) if coordinator is not None else None
        election = profile.election if profile is not None else None
        routing_key = self.delivery_info.get("routing_key")
        if (
            election is not None
            and routing_key
            and routing_key != election.queue
            and self._from_leader_queue(routing_key)
        ):
            # Another election's leader holds this queue: never run it there.
            self.hand_back(f"it reached {routing_key!r}")
            return True
        token = election.admit() if election is not None else None
        if coordinator is None or profile is None or election is None or token is None:
            self.hand_back(
                election.refusal_reason()
                if election is not None
                else "this worker does not hold the lease"
            )
            if coordinator is not None:
                coordinator.on_gate_refused()
            return True
        request_dict = self._request_dict
        request_dict["leader_token"] = token
        request_dict["leader_election"] = election.name
        request_dict["leader_on_loss"] = (
            profile.on_loss
            if profile.on_loss is not None
            else coordinator.policy_for(task).value  # refused: ConfigurationError
        )
        if _called_from(sys._getframe(1), "execute_using_pool"):
            if task.acks_late:
                if not coordinator.gate.admit_delivery(self):
                    return True  # delivered again while its run goes on (see worker.redelivery)
                self.leader_recorded = True  # settle it, whether it runs, waits or is skipped
            # Occurrences and overlap keys are asked only of messages they apply to.
            occurrence = request_dict.get(OCCURRENCE_HEADER) is not None
            if occurrence and not coordinator.gate.admit_occurrence(self):
                return True  # its occurrence runs or completed: skipped (worker.occurrences)
            if profile.overlap and not coordinator.gate.admit_overlap(self):
                return True  # a run of its key goes on: it waits or is skipped (worker.overlap)
            if occurrence:
                coordinator.gate.claim_occurrence(self)
            # The pool gets it next: from now on it belongs to the pool and is
            # never handed back. (Celery also asks revoked() on receipt of a
            # message with an expiry; such a request may still wait for its
            # ETA, and stays one to hand back.)
            self.leader_dispatched = True
        return False

    def _from_leader_queue(self, queue: str) -> bool:
        """True when *queue* (not this task's own) is the leader queue of an election."""
        is_leader_queue, _ = names_for_app(self._app).election_of_queue(str(queue))
        return is_leader_queue

    def acknowledge(self) -> None:
        """Acknowledge the message; for a run, settle the copies that waited for it.

        Celery acknowledges an ``acks_late`` run when it returned, and also
        when it failed or timed out (``acks_on_failure_or_timeout``): only
        the first counts as completed. (Celery's per-task request class
        replaces ``on_success`` without calling it, so the failure paths are
        the ones marked.) A task without ``acks_late`` is acknowledged as
        its run starts: its run settles when it ends (:meth:`on_success`,
        :meth:`on_failure`).
        """
        # Settled first: a copy admitted in between must still find the run. Not when
        # Celery acknowledges a run it is terminating (revoke(terminate=True), see
        # _announce_revoked()): the process may go on (an ignored or handled signal); its
        # end settles it (on_failure).
        if not self.leader_terminating and (
            self.task.acks_late or not _called_from(sys._getframe(1), "on_accepted")
        ):
            self._run_settled(self.leader_outcome or COMPLETED)
        super().acknowledge()

    def _announce_revoked(self, reason: Any, terminated: Any, signum: Any, expired: Any) -> Any:
        """Celery's revocation notice; for a run it terminates, its acknowledgement settles nothing.

        Celery acknowledges from inside this call; with *terminated* set (a
        started run hit by ``revoke(terminate=True)``) the flag marks exactly
        that acknowledgement for :meth:`acknowledge`. Not set around
        ``terminate()`` as a whole: on eventlet, killing the greenlet reports
        the run's end (and acknowledges it) before this call.
        """
        self.leader_terminating = bool(terminated and self.time_start)
        try:
            return super()._announce_revoked(reason, terminated, signum, expired)
        finally:
            self.leader_terminating = False

    def on_success(self, failed__retval__runtime: Any, **kwargs: Any) -> Any:
        """A run ended (Celery's base class; the per-task class's is wrapped the same way)."""
        try:
            return super().on_success(failed__retval__runtime, **kwargs)
        finally:
            self._returned(failed__retval__runtime)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Wrap the ``on_success`` of Celery's per-task subclass (it does not call ours).

        That subclass acknowledges an ``acks_late`` run that returned, which
        settles it (:meth:`acknowledge`); a run acknowledged as it started
        is settled by the wrapper, once it returned.
        """
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("on_success")
        if own is None:
            return

        @functools.wraps(own)
        def on_success(self: LeaderRequest, failed__retval__runtime: Any, **options: Any) -> Any:
            try:
                return own(self, failed__retval__runtime, **options)
            finally:
                self._returned(failed__retval__runtime)

        cls.on_success = on_success  # type: ignore[method-assign]

    def _returned(self, failed__retval__runtime: Any) -> None:
        """After ``on_success``: a run acknowledged as it started completed, unless it failed."""
        failed = failed__retval__runtime[0] if failed__retval__runtime else True
        if not failed and not self.task.acks_late:
            self._run_settled(COMPLETED)

    def reject(self, requeue: bool = False) -> None:
        """Reject the message; for a run, settle the copies that waited for it.

        Requeued, the message must run again: the run counts as failed, so
        nothing drops the message when it comes back.
        """
        self._run_settled(FAILED if requeue else self.leader_outcome or FAILED)
        super().reject(requeue)

    def on_timeout(self, soft: bool, timeout: float) -> Any:
        """A hard time limit ends the run as a failure."""
        if not soft:
            self.leader_outcome = FAILED
        return super().on_timeout(soft, timeout)

    def _run_settled(self, outcome: str) -> None:
        coordinator = current_coordinator()
        if coordinator is not None and (self.leader_dispatched or self.leader_recorded):
            coordinator.gate.run_settled(self, outcome)

    def hand_back(self, why: str) -> None:
        """Return the message to the broker for the leader; forget it here.

        A message from the leader queue is rejected with requeue (it keeps its
        place). One that came by another queue is published to the leader
        queue first and only then acknowledged: requeueing it where it came
        from would let a follower receive it again and again. If publishing
        fails, it is requeued where it came from: never dropped.
        """
        coordinator = current_coordinator()
        election = coordinator.election_for(self.task) if coordinator is not None else None
        queue = (
            election.queue
            if election is not None
            else leader_queue_for(self._app, getattr(self.task, "leader_election", None))
        )
        if self.delivery_info.get("routing_key") == queue:
            logger.info("celery-leader: %s requeued: %s", self.humaninfo(), why)
            self.reject(requeue=True)
        else:
            try:
                republish(self._app, self._message, queue)
            except Exception:
                logger.exception("celery-leader: could not re-route %s; requeued", self.humaninfo())
                self.reject(requeue=True)
            else:
                logger.info("celery-leader: %s re-routed to %s: %s", self.humaninfo(), queue, why)
                self.acknowledge()
        task_ready(self)

    def on_failure(
        self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
    ) -> Any:
        """A run stopped because its term ended is handed back, not recorded as FAILURE."""
        exc = getattr(exc_info, "exception", None)
        # Retry, Ignore (also Task.replace) and Reject: the run handed its message
        # on; what follows has a message of its own. Anything else failed.
        self.leader_outcome = SUPERSEDED if _hands_on(exc) else FAILED
        try:
            if exc is None or not ended_by_term(self, exc, shared_lease(self.leader_election)):
                return super().on_failure(exc_info, send_failed_event, return_ok)
            task_ready(self)
            settle_stopped_run(self)
            return None
        finally:
            self._run_settled(self.leader_outcome)  # also when the message stays unacknowledged

    #: Set when the parent killed this run because its term ended.
    leader_killed = False
    #: Set while Celery announces this run terminated (revoke(terminate=True)).
    leader_terminating = False
    #: Set when the gate handed this request to the pool.
    leader_dispatched = False
    #: Set when the redelivery record took this request in (it must be settled).
    leader_recorded = False
    #: How its run settled, once it failed or handed its message on (None: it returned).
    leader_outcome: str | None = None
    #: Its overlap key, when its task has an overlap policy (see worker.overlap).
    leader_overlap_key: str | None = None
    #: (task name, occurrence) once it runs as its occurrence's run (see worker.occurrences).
    leader_occurrence_key: tuple[str, str] | None = None
    #: (task id, identity) once the redelivery record looked at it (see worker.redelivery).
    leader_message_key: tuple[str, Any] | None = None

    @property
    def leader_token(self) -> Any:
        """The fencing token the gate admitted this request under, if any."""
        return self._request_dict.get("leader_token")

    @property
    def leader_election(self) -> str | None:
        """The election whose term the gate admitted this request under, if any."""
        election = self._request_dict.get("leader_election")
        return election if isinstance(election, str) else None
