"""A broker reconnect never makes the prefork pool forget the runs it is running.

At a reconnect Celery flushes its prefork pool (``AsynPool.flush``): it
drops the jobs no pool child took yet, whose messages the broker delivers
again. Celery before 5.6 also dropped every job a child was running, when no
write to a child was in progress at that instant (it cleared the pool's job
cache). Their results then never reach the main process, so their runs never
settle here: the redelivery record (:mod:`celery_leader.worker.redelivery`)
loses sight of a run that goes on, and the copy of its message that the
broker delivers on the new connection runs as well, after it in the same
child or beside it in another. Celery 5.6 keeps the jobs a child accepted.

:func:`keep_accepted_jobs` makes every Celery release behave as 5.6 does:
it wraps one pool object's ``flush`` so that a job a child accepted before
the flush is in the pool's job cache after it. On Celery 5.6 and later the
wrapper finds nothing to put back.

Assumptions: the pool keeps its jobs in ``_cache`` (a dict by job id) and
marks a job a child took with ``_accepted``, as billiard's and Celery's
prefork pools have since Celery 4. A pool without them (threads, solo,
gevent, eventlet) is left as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: Set on a flush this module wrapped, so that a consumer restarted again wraps it once.
_WRAPPED = "_celery_leader_keeps_accepted"


def keep_accepted_jobs(task_pool: Any) -> bool:
    """Make *task_pool*'s flush keep the jobs its children accepted; True when wrapped (or was).

    *task_pool* is the worker's pool (``worker.pool``, Celery's prefork
    ``TaskPool``): the consumer calls its ``flush``, which Celery binds to the
    inner pool's at start, so that is the one wrapped; the jobs are the inner
    pool's (``task_pool._pool._cache``).
    """
    flush: Callable[[], Any] | None = getattr(task_pool, "flush", None)
    inner: Any = getattr(task_pool, "_pool", None)
    if flush is None or not isinstance(getattr(inner, "_cache", None), dict):
        return False
    if getattr(flush, _WRAPPED, False):
        return True

    def flush_keeping_accepted() -> Any:
        cache: dict[Any, Any] = inner._cache
        accepted = {key: job for key, job in list(cache.items()) if _accepted(job)}
        try:
            return flush()
        finally:
            for key, job in accepted.items():
                cache.setdefault(key, job)

    setattr(flush_keeping_accepted, _WRAPPED, True)
    task_pool.flush = flush_keeping_accepted
    return True


def _accepted(job: Any) -> bool:
    """True once a pool child took *job* (it runs, or ran, there)."""
    return bool(getattr(job, "_accepted", False))
