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

* **On a real worker in your test process**: :func:`start_leader_worker`
  wraps Celery's ``celery.contrib.testing.worker.start_worker``, runs the
  election on a fresh in-memory lease store and returns once the worker
  leads; leader-only tasks sent with ``.delay()`` run on it as in
  production::

      from celery_leader.testing import start_leader_worker

      def test_settle_on_a_worker():
          with start_leader_worker(app):
              assert settle.delay("2026-11-22").get(timeout=10)["token"] > 0

  The app needs a broker and a result backend the test process reaches
  (``memory://`` and ``cache+memory://`` in tests). Celery's
  ``start_worker`` with ``app.conf.leader_backend_url = "memory://"`` works
  too; :func:`reset_memory_stores` forgets all leases.

Limits: :func:`leadership` and :func:`start_leader_worker` change
process-wide state, so they are not safe with tests running in parallel
threads of one process; the in-memory store is shared by one process only,
never between processes.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from celery_leader import clock
from celery_leader.elections.shared_lease import SharedLease
from celery_leader.settings.store import BACKEND_URL
from celery_leader.stores.memory import reset_memory_stores
from celery_leader.tasks import runtime

__all__ = ["Leadership", "leadership", "reset_memory_stores", "start_leader_worker"]

logger = logging.getLogger(__name__)

#: How long a forced lease lasts unless lost: far longer than any test.
FOREVER = 10.0 * 365 * 24 * 3600

#: How long :func:`start_leader_worker` waits for its worker to lead, in seconds.
LEAD_TIMEOUT = 10.0

#: How often a test worker polls kombu's in-memory broker, in seconds (kombu's default is 1 s,
#: which every task sent to the worker, and every wake-up of its loop, would wait for).
MEMORY_POLLING_INTERVAL = 0.01

#: How often a stopping test worker's loop is woken, in seconds.
WAKE_INTERVAL = 0.02

#: The longest a test worker's timer thread sleeps, in seconds (Celery's default is 1 s): the
#: worker's stop waits for that sleep to end, and the lease's liveness tick keeps the timer
#: sleeping for up to a third of the renew interval.
TIMER_PRECISION = 0.05


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


@contextmanager
def start_leader_worker(
    app: Any,
    *,
    pool: str = "solo",
    lead_timeout: float = LEAD_TIMEOUT,
    **worker_options: Any,
) -> Iterator[Any]:
    """Celery's ``start_worker`` for *app*, with leader election; yields the worker once it leads.

    On entry, guaranteed: *app* has the :class:`~celery_leader.LeaderElection`
    step (added if it lacks it); its election runs on an in-memory lease
    store (``memory://``) that no earlier lease is left in; the worker holds
    the lease and consumes the leader queue, so a leader-only task sent
    with ``.delay()`` runs on it at once. Raises :class:`RuntimeError` when
    the worker does not lead within *lead_timeout* seconds.

    On exit, whether the block raised or not: the worker stopped and its
    thread ended (its lease released), in well under a second on kombu's
    in-memory broker (on Redis, kombu closes the worker's connection only
    once its pending ``BRPOP`` returns: up to 1 s more); *app*'s settings and
    steps, and this process's coordinator, shared lease and in-memory
    stores, are as before.

    *worker_options* go to ``start_worker`` (``concurrency``,
    ``shutdown_timeout``, ``perform_ping_check``, ``timer_precision``, ...).
    Unless given: ``timer_precision`` is :data:`TIMER_PRECISION`, and
    Celery's ping check is off (leading, checked instead, shows the worker
    is up); ``perform_ping_check=True`` also registers its ``celery.ping``
    task. On kombu's in-memory broker the worker polls every
    :data:`MEMORY_POLLING_INTERVAL` seconds, unless the app's
    ``broker_transport_options`` set ``polling_interval``.
    """
    # Celery's test kit and the worker side: imported on use, not with the pytest plugin.
    from celery.contrib.testing.worker import start_worker  # noqa: PLC0415

    from celery_leader.worker.bootsteps import LeaderElection  # noqa: PLC0415
    from celery_leader.worker.coordinator import current_coordinator  # noqa: PLC0415

    options = {"perform_ping_check": False, "timer_precision": TIMER_PRECISION, **worker_options}
    if options["perform_ping_check"]:
        # A shared task: importing it registers celery.ping on every app.
        import celery.contrib.testing.tasks  # noqa: F401, PLC0415

    conf = app.conf
    added_step = LeaderElection not in app.steps["worker"]
    previous_url = BACKEND_URL.given(conf)
    previous_transport_options = conf.broker_transport_options
    previous_coordinator = current_coordinator()
    polls_faster = False
    waker: _LoopWaker | None = None
    try:
        if added_step:
            app.steps["worker"].add(LeaderElection)
        reset_memory_stores()
        conf.leader_backend_url = f"memory://{uuid.uuid4().hex}"
        transport_options = dict(previous_transport_options or {})
        if _on_memory_broker(app) and "polling_interval" not in transport_options:
            transport_options["polling_interval"] = MEMORY_POLLING_INTERVAL
            conf.broker_transport_options = transport_options
            polls_faster = True
        with start_worker(app, pool=pool, **options) as worker:
            try:
                _await_leading(current_coordinator(), lead_timeout)
                yield worker
            finally:
                # start_worker's exit sets Celery's stop flag, which the worker's loop reads
                # only between two waits for a message, each up to 2 s (and the loop waits
                # once more after reading it): messages end those waits at once.
                waker = _LoopWaker(app, worker.hostname)
    finally:
        if waker is not None:
            waker.stop()
        coordinator = current_coordinator()
        if coordinator is not None and coordinator is not previous_coordinator:
            coordinator.uninstall()
        conf.leader_backend_url = previous_url
        # The worker step read its settings (the memory:// store) onto the app: the next
        # start, and routing meanwhile, read the app's own again.
        for kept in ("_celery_leader_settings", "_celery_leader_names"):
            app.__dict__.pop(kept, None)
        if polls_faster:
            conf.broker_transport_options = previous_transport_options
        if added_step:
            app.steps["worker"].discard(LeaderElection)
        reset_memory_stores()


def _on_memory_broker(app: Any) -> bool:
    """True when *app*'s worker reads from kombu's in-memory transport (no connection made)."""
    with app.connection_for_read() as connection:
        return getattr(connection.transport, "driver_type", None) == "memory"


def _await_leading(coordinator: Any, timeout: float) -> None:
    """Return once *coordinator* leads and its consumer takes leader messages; else raise."""
    if coordinator is None:
        raise RuntimeError("the test worker runs no LeaderElection step")
    deadline = time.monotonic() + timeout
    while not (coordinator.manager.is_leader() and _consumes_leader_queue(coordinator)):
        if time.monotonic() >= deadline:
            raise RuntimeError(f"the test worker did not lead within {timeout:g} s")
        time.sleep(0.005)


def _consumes_leader_queue(coordinator: Any) -> bool:
    task_consumer = getattr(coordinator.consumer, "task_consumer", None)
    return task_consumer is not None and bool(
        task_consumer.consuming_from(coordinator.settings.queue)
    )


class _LoopWaker:
    """Sends the worker a control ``ping`` (answered by no one) every WAKE_INTERVAL, until stopped.

    A ping ends the wait of the worker's loop for a message: its blocking
    loop (kombu's in-memory transport has no event loop) checks Celery's
    stop flag after each wait.
    """

    def __init__(self, app: Any, nodename: str) -> None:
        self._app = app
        self._nodename = nodename
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="celery-leader-test-wake", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                self._app.control.broadcast("ping", destination=[self._nodename], reply=False)
            except Exception as exc:  # noqa: BLE001 - only speeds up the stop, which comes anyway
                logger.debug("celery-leader: could not wake the test worker: %r", exc)
            if self._stopped.wait(WAKE_INTERVAL):
                return

    def stop(self) -> None:
        """Stop sending; returns once no ping is in flight."""
        self._stopped.set()
        self._thread.join()
