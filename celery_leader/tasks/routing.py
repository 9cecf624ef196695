"""Routing: leader-only tasks go to their election's leader queue."""

from __future__ import annotations

import fnmatch
from typing import Any

from celery_leader.settings import leader_task_routes, names_for_app
from celery_leader.tasks.registry import _lock, leader_task_elections, note_leader_task

#: What :meth:`LeaderRouter.election_of` returns for a task that is not leader-only.
NOT_LEADER = "<not a leader-only task>"


def leader_queue_for(app: Any, election: str | None = None) -> str:
    """The leader queue of *election* in *app* (None: the default election's).

    The default one is ``leader_queue``, else ``"<leader_name>.leader"``; a
    named one is ``"<leader_name>.<election>.leader"``.
    """
    return names_for_app(app).queue_of(election)


def route_leader_task(app: Any, name: str | None, election: str | None = None) -> None:
    """Record *name* as leader-only in *app* (of *election*) and make sure *app* routes it."""
    note_leader_task(app, name, election)
    if name:
        ensure_router(app)


class LeaderRouter:
    """A task router that sends leader-only tasks to the leader queue.

    Knows a name when its task was created in this process, when a
    ``@leader_only`` proxy can be created for it, or when it matches a
    pattern in ``app.conf.leader_tasks`` (for processes that send by name
    without importing the task modules).
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    def __call__(
        self, name: str, args: Any, kwargs: Any, options: Any, task: Any = None, **kw: Any
    ) -> dict[str, str] | None:
        """Route *name* to its election's leader queue when it is a leader-only task."""
        election = self.election_of(name)
        if election == NOT_LEADER:
            return None
        return {"queue": leader_queue_for(self.app, election)}

    def election_of(self, name: str) -> str | None:
        """The election of leader-only task *name* (None: the default), or :data:`NOT_LEADER`."""
        known = leader_task_elections(self.app)
        if name in known:
            return known[name]
        for pattern, election in leader_task_routes(self.app.conf):
            if fnmatch.fnmatchcase(name, pattern):
                return election
        return NOT_LEADER


def ensure_router(app: Any) -> None:
    """Put a :class:`LeaderRouter` first in *app*'s routes (once)."""
    with _lock:
        if getattr(app, "_celery_leader_router", None) is not None:
            return
        router = LeaderRouter(app)
        app._celery_leader_router = router
    if app.configured:
        _add_router(app, router)
    else:
        app.on_after_configure.connect(lambda sender, **_: _add_router(sender, router), weak=False)


def _add_router(app: Any, router: LeaderRouter) -> None:
    routes = app.conf.task_routes
    if routes is None:
        existing: list[Any] = []
    elif isinstance(routes, (list, tuple)):
        existing = list(routes)
    else:
        existing = [routes]
    if router not in existing:
        app.conf.task_routes = [router, *existing]
    amqp = app.amqp
    table = amqp._rtable  # Celery's prepared routes, if already built (a list or a tuple)
    if table is not None and router not in table:
        routes = [router, *table]
        amqp._rtable = routes
        built = amqp.__dict__.get("router")  # Celery's Router keeps its own reference
        if built is not None:
            built.routes = routes
