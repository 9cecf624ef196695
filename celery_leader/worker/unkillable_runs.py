"""Said once at start: where a run that outlives its term weakens "one run per key".

The overlap policy (:mod:`celery_leader.worker.overlap`) and the occurrence
dedupe (:mod:`celery_leader.worker.occurrences`) are answered from the
leader's own record of the runs it handed to its pool. The next leader
starts with an empty record, so both assume that a term's runs have ended
before the next term's begin. That holds where a run can be killed at the
end of its term: ``on_loss="terminate"`` in a prefork pool. Under
``cancel`` (the only policy in the threads, solo, gevent and eventlet
pools) a run that never polls :func:`celery_leader.lease_lost` goes on
after its term, beside the next leader's run of its key or occurrence;
under ``finish`` every run does.

:func:`warn_about_unkillable_runs` logs one warning per leader task for
which that is so: a task with ``overlap`` other than ``"allow"``, or one
named by an entry of ``beat_schedule`` (each of its beat sends carries an
occurrence), whose ``on_loss`` in this worker's pool is not
``terminate``. Schedules kept elsewhere (a database scheduler) are not
known at start and are not looked at.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, NamedTuple

from celery_leader.tasks.overlap import Overlap
from celery_leader.term_end import KILLABLE_POOLS, OnLoss, effective_policy

logger = logging.getLogger(__name__)

W_UNKILLABLE = (
    "celery-leader: %s has %s, but its runs cannot be stopped at the end of a term here "
    "(pool %s, on_loss %r): %s goes on after its term, beside the next "
    "leader's run of the same %s. Use %s, or poll "
    "celery_leader.lease_lost() in the task and return when it is true"
)


def scheduled_task_names(app: Any) -> set[str]:
    """The task names of the entries of *app*'s ``beat_schedule`` (its occurrences' tasks)."""
    names = set()
    for entry in (app.conf.beat_schedule or {}).values():
        task = entry.get("task") if isinstance(entry, dict) else getattr(entry, "task", None)
        if isinstance(task, str):
            names.add(task)
    return names


class Unkillable(NamedTuple):
    """A leader task whose runs may outlive their term, and what of it assumes they do not."""

    task: Any
    #: "overlap" and/or "occurrence".
    guards: tuple[str, ...]
    #: Its ``on_loss`` in this worker's pool.
    policy: OnLoss


def guarded_by_key(task: Any, scheduled: set[str]) -> tuple[str, ...]:
    """What in *task* assumes its runs end with their term: its overlap policy, its occurrences."""
    found = []
    if Overlap.parse(getattr(task, "leader_overlap", Overlap.ALLOW)) is not Overlap.ALLOW:
        found.append("overlap")
    if task.name in scheduled:
        found.append("occurrence")
    return tuple(found)


def unkillable_runs(tasks: Iterable[Any], app: Any, pool: str) -> list[Unkillable]:
    """The leader tasks whose key guarantees a run that outlives its term would break here.

    A task is listed when something in it assumes its runs end with their
    term (:func:`guarded_by_key`) and its ``on_loss`` in *pool* is not
    ``terminate``. In name order.
    """
    scheduled = scheduled_task_names(app)
    found = []
    for task in sorted(tasks, key=lambda t: str(t.name)):
        guards = guarded_by_key(task, scheduled)
        policy = effective_policy(getattr(task, "leader_on_loss", None), pool)
        if guards and policy is not OnLoss.TERMINATE:
            found.append(Unkillable(task, guards, policy))
    return found


def warn_about_unkillable_runs(app: Any, tasks: Iterable[Any], pool: str) -> None:
    """Log one warning per leader task of :func:`unkillable_runs` (at worker start)."""
    for found in unkillable_runs(tasks, app, pool):
        task = found.task
        has = {
            "overlap": f"overlap={Overlap.parse(task.leader_overlap).value!r}",
            "occurrence": "beat_schedule entries (each occurrence runs once)",
        }
        same = {"overlap": "overlap key", "occurrence": "occurrence"}
        logger.warning(
            W_UNKILLABLE,
            task.name,
            " and ".join(has[guard] for guard in found.guards),
            pool,
            found.policy.value,
            "a run that never polls lease_lost()" if found.policy is OnLoss.CANCEL else "every run",
            " or ".join(same[guard] for guard in found.guards),
            "on_loss='terminate'"
            if pool in KILLABLE_POOLS
            else "the prefork pool with on_loss='terminate'",
        )
