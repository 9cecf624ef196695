"""``LeaderTask``: a run under its election's term, in every pool."""

from __future__ import annotations

import functools
import logging
from typing import Any

from celery import Task
from celery.app.task import Context

from celery_leader.exceptions import LeaseLost
from celery_leader.settings import check_election_name, names_for_app
from celery_leader.tasks.routing import leader_queue_for, route_leader_task
from celery_leader.tasks.runtime import eager_token, enter_run, exit_run, leader_run, shared_lease
from celery_leader.term_end import OnLoss
from celery_leader.term_end.in_run import (
    TermOverError,
    UnwatchableRunError,
    stop_run_in_task,
    unwatch_run,
    watch_run,
)

logger = logging.getLogger(__name__)

#: The request class of every leader-only task: the worker's gate.
REQUEST_CLASS = "celery_leader.worker.request:LeaderRequest"

# ``self.request.leader_occurrence`` exists on every run of every task: the header
# LeaderScheduler puts on what it sends (celery_leader.beat.occurrence), None otherwise.
Context.leader_occurrence = None


class LeaderTaskMixin:
    """What makes a task leader-only; mixed in front of the task's own class."""

    #: Set to True on every leader-only task class.
    leader_only = True
    #: ``"terminate"``, ``"cancel"``, ``"finish"``, or None for the pool's default.
    leader_on_loss: str | None = None
    #: The task's election (``@leader_only(election=...)``); None: the default election.
    leader_election: str | None = None
    #: ``@leader_only(overlap=...)``: ``"allow"``, ``"skip"`` or ``"buffer_one"``.
    leader_overlap: str = "allow"
    #: ``@leader_only(overlap_key=...)``: argument names; None keys runs by the task's name.
    leader_overlap_key: tuple[str, ...] | None = None
    Request = REQUEST_CLASS

    def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        """Send to the leader queue unless a queue or routing was given explicitly."""
        if not any(options.get(key) for key in ("queue", "exchange", "routing_key")):
            options["queue"] = leader_queue_for(self.app, self.leader_election)  # type: ignore[attr-defined]
        return super().apply_async(args, kwargs, **options)  # type: ignore[misc]

    def signature_from_request(self, request: Any = None, *args: Any, **kwargs: Any) -> Any:
        """The retry's signature, carrying the run's occurrence header on.

        Celery (5.3 and later) keeps out of a retry's headers every name the
        ``Context`` class defines, and ``leader_occurrence`` is one (so that
        ``self.request.leader_occurrence`` exists on every run): without
        this a retry would lose its occurrence, and its run would not count
        for it.
        """
        signature = super().signature_from_request(request, *args, **kwargs)  # type: ignore[misc]
        current = self.request if request is None else request  # type: ignore[attr-defined]
        occurrence = getattr(current, "leader_occurrence", None)
        if isinstance(occurrence, str):
            options = signature.options
            options["headers"] = {**(options.get("headers") or {}), "leader_occurrence": occurrence}
        return signature

    def push_request(self, *args: Any, **kwargs: Any) -> None:
        """Push a request that keeps the current one's fields (id, leader_token, ...).

        ``Task.__call__`` pushes a request for the body. Celery 5.5 and later
        merge the current request into it; earlier releases push a fresh one,
        and the body would see ``self.request.id`` None and no leader token.
        Merging here gives every supported release 5.5's behaviour.
        """
        current = self.request  # type: ignore[attr-defined]
        merged = {**vars(current), **kwargs} if current is not None else kwargs
        super().push_request(*args, **merged)  # type: ignore[misc]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run under the lease: a last check in the pool child, then the task body."""
        # The request the tracer pushed (Task.request without its property call:
        # this runs for every leader run); Task.request's default when none was.
        top = self.request_stack.top  # type: ignore[attr-defined]
        request = top if top is not None else self.request  # type: ignore[attr-defined]
        # The election the gate admitted the run under; the task's for eager runs.
        name = getattr(request, "leader_election", None) or (
            names_for_app(self.app).lease_of(self.leader_election)  # type: ignore[attr-defined]
        )
        if request.is_eager or request.called_directly:
            # Eager runs hold no lease, unless a test forced one (celery_leader.testing):
            # then they see its token, and LeaseLost reaches the caller as it is.
            forced = eager_token()
            if not request.called_directly:
                request.leader_token = forced
            with leader_run(name, forced):
                return super().__call__(*args, **kwargs)  # type: ignore[misc]
        token = getattr(request, "leader_token", None)
        shared = shared_lease(name)
        if token is None or shared is None:
            stop_run_in_task(self, "the lease ended before the run started")
        assert shared is not None
        assert token is not None
        # Recorded for the release guard; under terminate the watchdog also
        # ends the run at its term's deadline. The term is checked once the
        # run is recorded.
        terminate = getattr(request, "leader_on_loss", None) == _TERMINATE
        try:
            watched = watch_run(shared, token, terminate=terminate)
        except UnwatchableRunError as refused:
            logger.error("celery-leader: %s", refused)  # noqa: TRY400 - no traceback: one line says it
            stop_run_in_task(self, str(refused))
        except TermOverError as over:
            stop_run_in_task(self, str(over))
        # Not a context manager: this wraps every leader run, and the pair is cheaper.
        mark = enter_run(name, token, shared)
        try:
            cls: type = type(self)
            if top is not None and _next_call_is_celerys(cls):
                # Celery's tracer pushed this task and its request (a pushed one is
                # not eager, checked above) and no other class wraps the body: what
                # the tracer does for a task with no __call__ of its own.
                # Task.__call__ would push a second copy of the request.
                return self.run(*args, **kwargs)  # type: ignore[attr-defined]
            return super().__call__(*args, **kwargs)  # type: ignore[misc]
        except LeaseLost:
            stop_run_in_task(self, "check_leadership() saw the lease lost")
        finally:
            exit_run(mark)
            unwatch_run(shared, watched)


#: The policy's value as the gate writes it into the request (an enum's ``.value`` is
#: a descriptor call: this runs for every leader run).
_TERMINATE = OnLoss.TERMINATE.value


@functools.cache
def _next_call_is_celerys(cls: type) -> bool:
    """True when the ``__call__`` after :class:`LeaderTaskMixin` in *cls*'s MRO is Celery's.

    A base class with a ``__call__`` of its own (a transaction wrapper, say)
    keeps being called.
    """
    mro = cls.__mro__
    for klass in mro[mro.index(LeaderTaskMixin) + 1 :]:
        if "__call__" in vars(klass):
            return klass is Task
    return False


class LeaderTask(LeaderTaskMixin, Task):  # type: ignore[misc]
    """Base class for leader-only tasks: ``@app.task(base=LeaderTask)``."""

    acks_late = True

    @classmethod
    def on_bound(cls, app: Any) -> None:
        """Register the task's name (and election) for routing when Celery binds it to *app*."""
        if cls.leader_election is not None:
            check_election_name(cls.leader_election, f"{cls.name}.leader_election")
        route_leader_task(app, cls.name, cls.leader_election)
