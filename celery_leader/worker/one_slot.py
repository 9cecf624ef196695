"""Said once at start: an overlap policy does nothing on a worker that runs one task at a time.

The gate judges a message's overlap key (:mod:`celery_leader.worker.overlap`)
when Celery hands the message to the pool, not when it arrives: that is
where Celery asks ``Request.revoked()``. On a worker whose pool runs one task
at a time, that moment comes only after the run in progress has ended:

* prefork ``-c 1``: the message waits in the parent for the pool's only
  process (Celery's pool semaphore), or, with ``worker_prefetch_multiplier
  = 1``, is not even delivered, since a leader task is ``acks_late`` and the
  run holds the one prefetch slot until it ends;
* threads ``-c 1`` (and gevent, eventlet ``-c 1``): the same prefetch slot;
* solo: the run blocks the consumer's loop itself.

So ``overlap="skip"`` skips nothing there and ``"buffer_one"`` keeps every
further message, not one: each runs after the other, one at a time (with a
larger prefetch, one that reaches the gate in the instant the run settles
may still be skipped). A task with either policy on such a worker gets one
warning line at start, naming the policy and the remedy: two or more pool
slots (``-c 2``). On any worker, a message that waits for a free pool slot
(every slot busy with other tasks) is judged when it gets one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from celery_leader.tasks.overlap import Overlap

logger = logging.getLogger(__name__)

W_ONE_SLOT = (
    "celery-leader: %s has overlap=%r, but this worker runs one task at a time (%s): "
    "a message sent while a run goes on reaches the gate only once that run has ended, "
    "so %s. %s"
)
#: What the policy does on such a worker, per policy.
_WHAT_HAPPENS = {
    Overlap.SKIP: "it runs after the run instead of being skipped",
    Overlap.BUFFER_ONE: "every such message runs after it, one at a time, none skipped",
}


def pool_slots(pool: str, concurrency: int, max_concurrency: int = 0) -> int:
    """How many tasks the worker's pool runs at once: 1 for solo, else its largest size."""
    if pool == "solo":
        return 1
    return max(concurrency, max_concurrency)


def remedy(pool: str) -> str:
    """What to change so that the pool takes a second message while one runs."""
    if pool == "solo":
        return "Use a pool that runs two tasks at once, e.g. -P prefork -c 2"
    return "Start the worker with -c 2 or more (--concurrency)"


def one_slot_tasks(tasks: Iterable[Any]) -> list[tuple[Any, Overlap]]:
    """The tasks whose overlap policy needs a second pool slot (skip, buffer_one), by name."""
    found: list[tuple[Any, Overlap]] = []
    for task in sorted(tasks, key=lambda t: str(t.name)):
        policy = Overlap.parse(getattr(task, "leader_overlap", Overlap.ALLOW))
        if policy is not Overlap.ALLOW:
            found.append((task, policy))
    return found


def warn_about_one_slot(
    tasks: Iterable[Any], pool: str, concurrency: int, max_concurrency: int = 0
) -> None:
    """Log one warning per overlap task when the pool runs one task at a time (worker start)."""
    if pool_slots(pool, concurrency, max_concurrency) > 1:
        return
    where = f"pool {pool}" if pool == "solo" else f"pool {pool}, concurrency 1"
    for task, policy in one_slot_tasks(tasks):
        logger.warning(
            W_ONE_SLOT, task.name, policy.value, where, _WHAT_HAPPENS[policy], remedy(pool)
        )
