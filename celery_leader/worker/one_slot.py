"""Said once at start: an overlap policy sees little on a worker that runs one task at a time.

The gate judges a message's overlap key (:mod:`celery_leader.worker.overlap`)
when Celery hands the message to the pool, never before it was delivered.
On a worker whose pool runs one task at a time, most messages sent while a
run goes on get there only after it ended, and then run:

* a leader task is ``acks_late``, so the run holds one of the worker's
  ``-c`` x ``worker_prefetch_multiplier`` prefetch slots until it ends. With
  ``-c 1`` and a multiplier of 1 (or ``worker_disable_prefetch``) no
  message is delivered during the run; with a multiplier m, m - 1 are (and
  reach the gate while the run is still recorded: in prefork they wait for
  the pool's only process and are handed to it as the run ends, before it
  settles);
* solo: the run blocks the consumer's loop, which looks at nothing else.

So ``overlap="skip"`` skips none, or only m - 1, of the messages sent during
a run, and ``"buffer_one"`` runs the others one after the other instead of
skipping them. A task with either policy on such a worker gets one warning
line at start, naming the policy and the remedy: two or more pool slots
(``-c 2``). A prefetch without limit (multiplier 0) delivers every message
during the run: no warning then, except on solo. On any worker, a message
that waits for a free pool slot (every slot busy with other tasks) is
judged when it gets one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from celery_leader.tasks.overlap import Overlap

logger = logging.getLogger(__name__)

W_ONE_SLOT = (
    "celery-leader: %s has overlap=%r, but this worker runs one task at a time (%s): %s, "
    "instead of being skipped. %s"
)


def pool_slots(pool: str, concurrency: int, max_concurrency: int = 0) -> int:
    """How many tasks the worker's pool runs at once: 1 for solo, else its largest size."""
    if pool == "solo":
        return 1
    return max(concurrency, max_concurrency)


def what_happens(pool: str, prefetch_multiplier: int) -> str | None:
    """What becomes of messages sent during a run on one slot; None when the gate sees them."""
    if pool == "solo":
        return (
            "the run blocks the worker's loop, so a message sent while it goes on is looked "
            "at only once it ended, and runs then"
        )
    if prefetch_multiplier == 1:
        return (
            "the run holds the only prefetch slot (a leader task is acks_late), so a message "
            "sent while it goes on is delivered only once it ended, and runs then"
        )
    if prefetch_multiplier > 1:
        return (
            f"the run holds one of the {prefetch_multiplier} prefetch slots (a leader task is "
            f"acks_late), so of the messages sent while it goes on only "
            f"{prefetch_multiplier - 1} reach the gate in time; the others are delivered once "
            "it ended, and run then"
        )
    return None  # no prefetch limit: every message is delivered during the run


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
    tasks: Iterable[Any],
    pool: str,
    concurrency: int,
    max_concurrency: int = 0,
    *,
    prefetch_multiplier: int = 1,
) -> None:
    """Log one warning per overlap task when the pool runs one task at a time (worker start).

    *prefetch_multiplier*: the worker's (1 with ``worker_disable_prefetch``).
    """
    if pool_slots(pool, concurrency, max_concurrency) > 1:
        return
    happens = what_happens(pool, prefetch_multiplier)
    if happens is None:
        return
    where = f"pool {pool}" if pool == "solo" else f"pool {pool}, concurrency 1"
    for task, policy in one_slot_tasks(tasks):
        logger.warning(W_ONE_SLOT, task.name, policy.value, where, happens, remedy(pool))
