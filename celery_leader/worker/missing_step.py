"""One warning when a worker has leader-only tasks but no ``LeaderElection`` step.

Without the step, nothing in the worker consumes the leader queue and the
gate refuses every leader-only run: the messages wait in the leader queue
for a worker that has the step, and this worker says nothing about it.
This module makes it say so once, when the worker is ready, naming the line
to add. It is connected when :mod:`celery_leader.worker.bootsteps` is
imported, which ``import celery_leader`` (and so ``@leader_only``) does.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.signals import worker_ready

from celery_leader.settings import names_for_app
from celery_leader.tasks.registry import leader_task_names
from celery_leader.worker.coordinator import current_coordinator

logger = logging.getLogger(__name__)

#: Leader-only task names listed in the warning before it says "and N more".
SHOWN = 3

WARNING = (
    "celery-leader: this worker imports leader-only tasks ({tasks}) but has no LeaderElection "
    "step, so it never runs them: their messages wait in queue {queue!r} for a worker that has "
    'the step. Add `app.steps["worker"].add(LeaderElection)` (or `celery_leader.install(app)`) '
    "where the app is made"
)


def leader_tasks_of(app: Any) -> list[str]:
    """The leader-only tasks *app* has registered, by name, sorted."""
    found = set(leader_task_names(app)) & set(app.tasks.keys())
    found |= {name for name, task in app.tasks.items() if getattr(task, "leader_only", False)}
    return sorted(found)


def warn_without_step(sender: Any = None, **_: Any) -> None:
    """``worker_ready`` handler: warn when leader-only tasks meet a worker without the step."""
    app = getattr(sender, "app", None)
    if app is None or current_coordinator() is not None:
        return
    names = leader_tasks_of(app)
    if not names:
        return
    more = len(names) - SHOWN
    shown = ", ".join(names[:SHOWN]) + (f" and {more} more" if more > 0 else "")
    try:
        queue = names_for_app(app).queue
    except Exception:  # noqa: BLE001 - a bad leader_name must not hide this warning
        queue = "<leader_name>.leader"
    logger.warning(WARNING.format(tasks=shown, queue=queue))


worker_ready.connect(warn_without_step, weak=False, dispatch_uid="celery_leader.missing_step")
