"""Helpers for testing code that uses celery-leader.

Two ways to run leader-only tasks in your tests:

* **Eagerly** (``task.apply()`` or ``task_always_eager``): wrap the test in
  :func:`leadership`. Inside, runs see ``self.request.leader_token`` set to
  the token you chose, and :func:`celery_leader.lease_lost` /
  :func:`celery_leader.check_leadership` answer as under a real lease, until
  you call :meth:`Leadership.lose`::

      from celery_leader.testing import leadership

      def test_aggregate():
          with leadership(token=7) as lead:
              assert aggregate.apply(args=("2026-11-22",)).get() == ...
              lead.lose()
              with pytest.raises(LeaseLost):
                  long_job.apply().get(propagate=True)

* **On a real worker in your test process**, with the in-memory lease store:
  ``app.conf.leader_backend_url = "memory://"`` and Celery's own
  ``celery.contrib.testing.worker.start_worker(app)``; the worker becomes
  leader at once (the in-memory store never holds off) and runs leader-only
  tasks as in production. :func:`reset_memory_stores` forgets all leases.

Limits: :func:`leadership` changes process-wide state, so it is not safe
with tests running in parallel threads of one process; the in-memory store
is shared by one process only, never between processes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from celery_leader import clock
from celery_leader.elections.shared_lease import SharedLease
from celery_leader.stores.memory import reset_memory_stores
from celery_leader.tasks import runtime

__all__ = ["Leadership", "leadership", "reset_memory_stores"]

#: How long a forced lease lasts unless lost: far longer than any test.
FOREVER = 10.0 * 365 * 24 * 3600


@dataclass
class Leadership:
    """The forced lease of a :func:`leadership` block."""

    token: int
    shared: SharedLease

    def lose(self) -> None:
        """End the lease: running and later runs see ``lease_lost()`` true."""
        self.shared.revoke()

    def regain(self, token: int | None = None) -> None:
        """Hold the lease again, with a new token (one more than before by default)."""
        self.token = self.token + 1 if token is None else token
        runtime.set_eager_token(self.token)
        self.shared.publish(self.token, clock.now() + FOREVER)


@contextmanager
def leadership(token: int = 1) -> Iterator[Leadership]:
    """Run eager leader-only tasks as the holder of a lease with *token*."""
    if token <= 0:
        raise ValueError("fencing tokens are positive")
    shared = SharedLease()
    shared.publish(token, clock.now() + FOREVER)
    previous_shared = runtime.shared_lease()
    previous_token = runtime.eager_token()
    runtime.install_shared_lease(shared)
    runtime.set_eager_token(token)
    try:
        yield Leadership(token, shared)
    finally:
        runtime.install_shared_lease(previous_shared)
        runtime.set_eager_token(previous_token)
