"""The overlap policy at the gate: one run per key at a time, on the leader, with no lock.

For a task with ``@leader_only(overlap="skip")`` or ``"buffer_one"`` the
gate asks :meth:`Overlaps.admit` before it hands a message to the pool. The
record is the leader's own list of the runs it handed to its pool, per key
(:mod:`celery_leader.tasks.overlap`); a run leaves it when it settles
(returned, failed, killed, handed back). So the record can never outlive
what it describes: a crash or a SIGKILL takes it with the process, and the
next leader starts with none. That a run of the old term has ended by then
is the term-end guarantee (:mod:`celery_leader.term_end`), not a store's:
kept for every run by ``on_loss="terminate"`` in a prefork pool, and under
``"cancel"`` only by runs that poll :func:`celery_leader.lease_lost`. A run
that goes on after its term (``"finish"``; ``"cancel"`` without polling,
which is every pool but prefork's only policy) runs beside the next
leader's run of its key; the worker warns at start for each such task
(:mod:`celery_leader.worker.unkillable_runs`).

What the gate does with a message whose key has a run in progress:

* ``skip``: acknowledges it without running; with a result backend its
  state is ``SKIPPED`` and its result ``{"reason": "overlap", "key": ...}``;
* ``buffer_one``: keeps it unacknowledged (not counted against the prefetch
  limit, as a parked copy of :mod:`celery_leader.worker.redelivery`) and
  sends it to the gate again when the run settles; at most one waits per
  key, a further one is skipped. One that waits when the term ends goes
  back to the broker from the gate (the run it waited for ends first).

Threads: admission runs on the consumer's loop thread; settlement may be
reported from a pool's thread, so the record sits under a lock.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

from celery_leader.skip_reasons import TASK_OVERLAP
from celery_leader.tasks.overlap import Overlap, OverlapKeyError, overlap_key

logger = logging.getLogger(__name__)

#: What the gate does: run it now, keep it waiting for the run of its key, or skip it.
RUN, WAIT, SKIP = "run", "wait", "skip"
#: The result state of a message acknowledged without running.
SKIPPED = "SKIPPED"


class Overlaps:
    """The runs of this worker by overlap key, with the messages that wait for each.

    *on_skip* is told of each message skipped, with its key (for the
    ``leader_task_skipped`` signal and the metric). The ``SKIPPED`` result is
    written where Celery writes a revoked message's: on the consumer's loop.
    """

    def __init__(self, on_skip: Callable[[Any, str], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._running: dict[str, weakref.ref[Any]] = {}
        #: Per key, in arrival order: what runs when the key's run settles.
        self._waiting: dict[str, list[Any]] = {}
        #: Per key, the one message ``buffer_one`` keeps (the others that wait are the run's own).
        self._buffered: dict[str, Any] = {}
        self._on_skip = on_skip

    def admit_request(self, request: Any) -> str:
        """The gate's verdict for *request*: :data:`RUN`, :data:`WAIT` or :data:`SKIP`.

        A skipped message is acknowledged here, its result stored as
        ``SKIPPED``; one whose key cannot be formed is acknowledged as
        failed, with the error saying which argument. Loop thread.
        """
        task = request.task
        policy = Overlap.parse(getattr(task, "leader_overlap", Overlap.ALLOW))
        if policy is Overlap.ALLOW:
            return RUN
        try:
            key = overlap_key(
                task, getattr(task, "leader_overlap_key", None), request.args, request.kwargs
            )
        except OverlapKeyError as exc:
            logger.error("celery-leader: %s not run: %s", request.humaninfo(), exc)  # noqa: TRY400
            error = exc
            store_result(task, lambda backend: backend.mark_as_failure(request.id, error))
            request.acknowledge()
            return SKIP
        if key is None:
            return RUN  # its arguments do not fit the task: the run fails by itself
        request.leader_overlap_key = key
        verdict = self.admit(request, key, policy)
        if verdict == WAIT:
            logger.info(
                "celery-leader: %s waits for the run of %s in progress (overlap=%s)",
                request.humaninfo(),
                key,
                policy.value,
            )
        elif verdict == SKIP:
            logger.info(
                "celery-leader: %s skipped: a run of %s is in progress (overlap=%s)",
                request.humaninfo(),
                key,
                policy.value,
            )
            info = {"reason": TASK_OVERLAP, "key": key}
            store_result(task, lambda store: store.store_result(request.id, info, SKIPPED))
            request.acknowledge()
            if self._on_skip is not None:
                self._on_skip(request, key)
        return verdict

    def admit(self, request: Any, key: str, policy: Overlap) -> str:
        """:data:`RUN` (now recorded as the key's run), :data:`WAIT` or :data:`SKIP`.

        A message the run itself caused always waits, whatever the policy: a
        retry or a redelivery (the run's task id), or a message the run sent
        (a chain's next step, a callback, a task sending itself again: the run's
        id as its parent). Skipping one would lose it, not avoid an overlap.
        """
        with self._lock:
            ref = self._running.get(key)
            running = ref() if ref is not None else None
            if running is None or running is request:
                self._running[key] = weakref.ref(request)
                self._unwait(key, request)
                return RUN
            if _follows(request, running):
                self._wait(key, request)
                return WAIT
            if policy is Overlap.BUFFER_ONE and key not in self._buffered:
                self._buffered[key] = request
                self._wait(key, request)
                return WAIT
            return SKIP

    def _wait(self, key: str, request: Any) -> None:
        waiting = self._waiting.setdefault(key, [])
        if not any(other is request for other in waiting):
            waiting.append(request)

    def _unwait(self, key: str, request: Any) -> None:
        waiting = self._waiting.get(key, [])
        self._waiting[key] = [other for other in waiting if other is not request]
        if not self._waiting[key]:
            del self._waiting[key]
        if self._buffered.get(key) is request:
            del self._buffered[key]

    def settle(self, request: Any) -> list[Any]:
        """The run of *request* ended: the messages that waited for it, in order (idempotent)."""
        key = getattr(request, "leader_overlap_key", None)
        if key is None:
            return []
        with self._lock:
            ref = self._running.get(key)
            if ref is None or ref() is not request:
                return []
            del self._running[key]
            self._buffered.pop(key, None)
            return self._waiting.pop(key, [])

    def forget_waiting(self) -> list[Any]:
        """The broker connection is gone: the messages that waited come back from the broker.

        (Celery drops a consumer's unstarted requests on a reconnect; their
        acknowledgements could not reach the broker anyway.) The runs stay
        recorded: they go on in the pool. Returns the requests forgotten.
        """
        with self._lock:
            forgotten = [request for waiting in self._waiting.values() for request in waiting]
            self._waiting.clear()
            self._buffered.clear()
        return forgotten

    def running(self) -> int:
        """How many keys have a run in progress."""
        with self._lock:
            return sum(1 for ref in self._running.values() if ref() is not None)


def store_result(task: Any, write: Callable[[Any], Any]) -> None:
    """Write a skipped message's result with *write*, unless *task* ignores results.

    Called where Celery writes a revoked message's result: on the consumer's loop.
    An error is logged, never raised.
    """
    if getattr(task, "ignore_result", False):
        return
    try:
        write(task.backend)
    except Exception:
        logger.exception("celery-leader: could not store the result of a skipped message")


def _follows(request: Any, running: Any) -> bool:
    """True when *request* is the running run's own message again, or one the run sent."""
    run_id = getattr(running, "id", None)
    return run_id is not None and run_id in (
        getattr(request, "id", None),
        getattr(request, "parent_id", None),
    )
