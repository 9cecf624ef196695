"""``celery_leader.install(app)``: the call form of adding the worker step."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from celery_leader.settings import leader_task_routes
from celery_leader.tasks import ensure_router
from celery_leader.worker.bootsteps import LeaderElection
from celery_leader.worker.options import add_worker_options


def install(app: Any, *, tasks: Iterable[str] = ()) -> Any:
    """Turn leader election on for *app*'s workers and route leader-only tasks.

    Adds :class:`LeaderElection` to the worker steps, celery-leader's
    ``celery worker`` options (``--leader-metrics-port``) to the app's command
    line, and installs the router
    that sends leader-only tasks to the leader queue. *tasks* names (or
    glob patterns of) leader-only tasks for processes that send them with
    ``app.send_task(name)`` without importing their modules; they are added
    to the ``leader_tasks`` setting. Returns *app*.
    """
    app.steps["worker"].add(LeaderElection)
    add_worker_options(app)
    names = list(tasks)
    if names:
        routes = dict(leader_task_routes(app.conf))
        routes.update((name, None) for name in names if name not in routes)
        if any(routes.values()):  # kept as a mapping: patterns of named elections stay theirs
            app.conf.leader_tasks = {pattern: e or "" for pattern, e in routes.items()}
        else:
            app.conf.leader_tasks = list(routes)
    ensure_router(app)
    return app
