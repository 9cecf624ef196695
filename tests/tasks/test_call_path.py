"""A traced leader run calls the body once, with the tracer's request, and keeps a base's __call__.

Runs go through Celery's own tracer (``build_tracer``), as in a pool child,
against a real shared lease slot.
"""

from __future__ import annotations

import uuid
from typing import ClassVar

from celery import Celery, Task
from celery.app.trace import build_tracer

from celery_leader import clock, leader_only
from celery_leader.elections.shared_lease import SharedLease
from celery_leader.tasks import runtime


class Wrapping(Task):  # type: ignore[misc]
    """A base class with a __call__ of its own, as transaction or tracing wrappers have."""

    wrapped: ClassVar[list[str]] = []

    def __call__(self, *args, **kwargs):
        type(self).wrapped.append(self.request.id)
        return super().__call__(*args, **kwargs)


def traced(task, request):
    tracer = build_tracer(task.name, task, eager=False, propagate=True, app=task.app)
    task_id = str(uuid.uuid4())
    info = tracer(task_id, (), {}, {"id": task_id, **request})
    return task_id, info


def test_a_traced_run_sees_the_tracers_request_and_a_base_call_still_runs():
    name = f"calls-{uuid.uuid4().hex[:6]}"
    app = Celery(name, set_as_current=False)
    app.conf.update(broker_url="memory://", result_backend="cache+memory://")
    seen = []

    @leader_only
    @app.task(bind=True)
    def plain(self):
        seen.append((self.request.id, self.request.leader_token, len(self.request_stack.stack)))

    @leader_only
    @app.task(bind=True, base=Wrapping)
    def wrapped(self):
        seen.append((self.request.id, self.request.leader_token, len(self.request_stack.stack)))

    shared = SharedLease(name)
    shared.publish(5, clock.now() + 60)
    runtime.install_shared_lease(shared)
    try:
        request = {"leader_token": 5, "leader_election": name}
        first, _ = traced(plain, request)
        second, _ = traced(wrapped, request)
    finally:
        runtime.install_shared_lease(None)
    # The plain one runs its body under the tracer's request, pushed once.
    assert seen[0] == (first, 5, 1)
    # The wrapped one went through its base's __call__ (which pushes a request of its own).
    assert Wrapping.wrapped == [second]
    assert seen[1][:2] == (second, 5)
