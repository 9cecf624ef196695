"""``celery_leader.install(app)``: the call form of adding the worker step."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from celery_leader.settings import leader_task_patterns
from celery_leader.tasks import ensure_router
from celery_leader.worker.bootsteps import LeaderElection


def install(app: Any, *, tasks: Iterable[str] = ()) -> Any:
    """Turn leader election on for *app*'s workers and route leader-only tasks.

    Adds :class:`LeaderElection` to the worker steps and installs the router
    that sends leader-only tasks to the leader queue. *tasks* names (or
    glob patterns of) leader-only tasks for processes that send them with
    ``app.send_task(name)`` without importing their modules; they are added
    to the ``leader_tasks`` setting. Returns *app*.
    """
    app.steps["worker"].add(LeaderElection)
    names = list(tasks)
    if names:
        existing = list(leader_task_patterns(app.conf))
        app.conf.leader_tasks = existing + [n for n in names if n not in existing]
    ensure_router(app)
    return app
