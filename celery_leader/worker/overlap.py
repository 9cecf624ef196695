"""The overlap policy at the gate: one run per key at a time, on the leader, with no lock.

For a task with ``@leader_only(overlap="skip")`` or ``"buffer_one"`` the
gate asks :meth:`Overlaps.admit` before it hands a message to the pool. The
record is the leader's own list of the runs it handed to its pool, per key
(:mod:`celery_leader.tasks.overlap`); a run leaves it when it settles
(returned, failed, killed, handed back). So the record can never outlive
what it describes: a crash or a SIGKILL takes it with the process, and the
next leader starts with none. That a run of the old term has ended by then
is the term-end guarantee (:mod:`celery_leader.term_end`), not a store's.

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

from celery_leader.tasks.overlap import Overlap, OverlapKeyError, overlap_key

logger = logging.getLogger(__name__)

#: What the gate does: run it now, keep it waiting for the run of its key, or skip it.
RUN, WAIT, SKIP = "run", "wait", "skip"
#: The result state of a message acknowledged without running.
SKIPPED = "SKIPPED"


class Overlaps:
    """The runs of this worker by overlap key, with the one message each may have waiting.

    *on_skip* is told of each message skipped, with its key (for the
    ``leader_task_skipped`` signal and the metric).
    """

    def __init__(self, on_skip: Callable[[Any, str], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._running: dict[str, weakref.ref[Any]] = {}
        self._waiting: dict[str, Any] = {}
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
            _store(task, request.id, lambda backend: backend.mark_as_failure(request.id, error))
            request.acknowledge()
            return SKIP
        if key is None:
            return RUN  # its arguments do not fit the task: the run fails by itself
        request.leader_overlap_key = key
        verdict = self.admit(request, key, policy)
        if verdict == WAIT:
            logger.info(
                "celery-leader: %s waits for the run of %s in progress (overlap=buffer_one)",
                request.humaninfo(),
                key,
            )
        elif verdict == SKIP:
            logger.info(
                "celery-leader: %s skipped: a run of %s is in progress (overlap=%s)",
                request.humaninfo(),
                key,
                policy.value,
            )
            info = {"reason": "overlap", "key": key}
            _store(task, request.id, lambda store: store.store_result(request.id, info, SKIPPED))
            request.acknowledge()
            if self._on_skip is not None:
                self._on_skip(request, key)
        return verdict

    def admit(self, request: Any, key: str, policy: Overlap) -> str:
        """:data:`RUN` (now recorded as the key's run), :data:`WAIT` or :data:`SKIP`."""
        with self._lock:
            ref = self._running.get(key)
            running = ref() if ref is not None else None
            if running is None or running is request or _settled(running):
                self._running[key] = weakref.ref(request)
                if self._waiting.get(key) is request:
                    del self._waiting[key]
                return RUN
            if policy is Overlap.BUFFER_ONE and key not in self._waiting:
                self._waiting[key] = request
                return WAIT
            return SKIP

    def settle(self, request: Any) -> Any | None:
        """The run of *request* ended: the message that waited for it, if any (idempotent)."""
        key = getattr(request, "leader_overlap_key", None)
        if key is None:
            return None
        with self._lock:
            ref = self._running.get(key)
            if ref is None or ref() is not request:
                return None
            del self._running[key]
            return self._waiting.pop(key, None)

    def running(self) -> int:
        """How many keys have a run in progress."""
        with self._lock:
            return sum(1 for ref in self._running.values() if ref() is not None)


def _settled(request: Any) -> bool:
    """True once *request*'s message was acknowledged or rejected (its run is over)."""
    return bool(getattr(request, "acknowledged", False))


def _store(task: Any, task_id: str, write: Callable[[Any], Any]) -> None:
    """Write a result for *task_id* with *write*, unless the task ignores results."""
    if getattr(task, "ignore_result", False):
        return
    try:
        write(task.backend)
    except Exception:
        logger.exception("celery-leader: could not store the result of %s", task_id)
