"""The task side: leader-only tasks, their routing, and what a run asks of its term.

* :mod:`~celery_leader.tasks.base`: ``LeaderTask`` and the mixin every
  leader-only task gets (a run under its election's term);
* :mod:`~celery_leader.tasks.decorator`: ``@leader_only``;
* :mod:`~celery_leader.tasks.registry`: which tasks are leader-only;
* :mod:`~celery_leader.tasks.routing`: task -> leader queue;
* :mod:`~celery_leader.tasks.runtime`: ``lease_lost()``,
  ``check_leadership()`` and the current token, inside a run.

What a leader-only task is and does:

``@leader_only`` is the outermost decorator, over ``@app.task`` or
``@shared_task`` (bare or with options). It never evaluates a lazy task
proxy itself (that would finalize the app at import time): it records the
task and turns it into a leader-only task when Celery creates it, or when
the worker starts, or when a message is routed, whichever comes first.

A leader-only task:

* is routed to the leader queue (``.delay``, ``.apply_async``, signatures,
  and ``app.send_task(name)`` through a router installed on the app);
* is ``acks_late`` unless said otherwise (``@leader_only(acks_late=False)``,
  or ``acks_late=False`` in ``@app.task``), so a message handed back by the
  gate or by revocation goes back to the broker;
* runs only on the worker holding the lease: the worker's gate checks the
  lease before the pool and puts the fencing token into
  ``self.request.leader_token``; the pool child checks again right before
  running, since a job can wait in the pool's buffer after the gate.
"""

from celery_leader.tasks.base import REQUEST_CLASS, LeaderTask, LeaderTaskMixin
from celery_leader.tasks.decorator import leader_only, resolve_leader_tasks
from celery_leader.tasks.registry import leader_task_names
from celery_leader.tasks.routing import LeaderRouter, ensure_router, leader_queue_for

__all__ = [
    "REQUEST_CLASS",
    "LeaderRouter",
    "LeaderTask",
    "LeaderTaskMixin",
    "ensure_router",
    "leader_only",
    "leader_queue_for",
    "leader_task_names",
    "resolve_leader_tasks",
]
