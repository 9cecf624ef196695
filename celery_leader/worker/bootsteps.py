"""The bootsteps: ``LeaderElection`` (worker) and ``LeaderConsumer`` (consumer).

``app.steps["worker"].add(LeaderElection)`` is all a user writes: the worker
step adds the consumer step, registers the routing and the remote-control
commands, and owns the :class:`~celery_leader.worker.coordinator.Coordinator`.

Lifecycle:

* ``__init__`` (worker start): validate settings (a bad value stops the
  worker here with one clear line), add the consumer step, take the leader
  queue out of the queues the worker consumes. Nothing heavy.
* ``create`` (after the pool object exists, before it forks): open the store,
  build the coordinator and its shared lease memory, turn on metrics.
* The consumer step's ``start`` (after every broker (re)connect): start the
  lease manager the first time, then consume the leader queue only if leading.
* ``stop`` (warm shutdown, before the pool drains): stop taking leader work,
  stop runs per ``on_loss``, release once they stopped.
* After the pool drained (the worker blueprint's ``on_stopped``): stop leading
  and release the lease at the latest.
* ``terminate`` (cold shutdown): the same, releasing at once.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlsplit

from celery import bootsteps

from celery_leader.elections.balancer import Balancer
from celery_leader.elections.run_table import RUN_SLOTS
from celery_leader.elections.shared_lease import MAX_ELECTIONS
from celery_leader.exceptions import ConfigurationError
from celery_leader.observe.extra import check_metrics_extra
from celery_leader.observe.wiring import observe
from celery_leader.settings import LeaderSettings, app_settings, spelled_in
from celery_leader.startup_error import StartupConfigurationError
from celery_leader.stores import open_store
from celery_leader.stores.base import Presence
from celery_leader.stores.batch import CallBatch
from celery_leader.stores.registry import TEST_ONLY_SCHEMES, shared_store_urls, store_class
from celery_leader.stores.server_limits import check_server_limits
from celery_leader.tasks import ensure_router, resolve_leader_tasks
from celery_leader.term_end import KILLABLE_POOLS
from celery_leader.worker import control as _control  # noqa: F401 - registers the commands
from celery_leader.worker import missing_step as _missing_step  # noqa: F401 - connects the warning
from celery_leader.worker.coordinator import Coordinator, current_coordinator
from celery_leader.worker.one_slot import warn_about_one_slot
from celery_leader.worker.pool_flush import keep_accepted_jobs
from celery_leader.worker.redelivery import warn_about_visibility
from celery_leader.worker.unkillable_runs import warn_about_unkillable_runs

logger = logging.getLogger(__name__)


#: The worker's name for the start-up error (``celery beat`` raises the same class).
WorkerConfigurationError = StartupConfigurationError


ERR_MEMORY_STORE = (
    "celery-leader: leader_backend_url='memory://' is not allowed in a celery worker process: "
    "it is a store for tests in one process (celery.contrib.testing.worker.start_worker); "
    "workers need a shared store: {urls}"
)


def _is_test_only(url: str) -> bool:
    return urlsplit(url).scheme.lower() in TEST_ONLY_SCHEMES


def _in_process(worker: Any) -> bool:
    """True for a worker that runs inside a test process (Celery's ``start_worker``)."""
    from celery.contrib.testing.worker import TestWorkController  # noqa: PLC0415 - tests only

    return isinstance(worker, TestWorkController)


def pool_kind(worker: Any) -> str:
    """``"prefork"``, ``"threads"``, ``"solo"``, ... for the worker's pool class."""
    pool_cls = worker.pool_cls
    module = pool_cls if isinstance(pool_cls, str) else getattr(pool_cls, "__module__", "")
    return str(module).split(":")[0].rsplit(".", 1)[-1]


def _pool_sizes(worker: Any) -> tuple[int, int]:
    """The worker's ``--concurrency`` and its ``--autoscale`` maximum (0: none, or not known)."""

    def size(value: Any) -> int:
        return value if isinstance(value, int) else 0  # "auto" is resolved before create()

    return size(worker.concurrency), size(getattr(worker, "max_concurrency", 0))


def _prefetch(worker: Any) -> int:
    """The worker's prefetch multiplier: 1 where it fetches only for a free pool slot.

    That is ``worker_disable_prefetch``, which Celery applies on a Redis broker only.
    """
    multiplier = getattr(worker, "prefetch_multiplier", None)
    if multiplier is None:
        multiplier = worker.app.conf.worker_prefetch_multiplier
    if worker.app.conf.get("worker_disable_prefetch"):
        try:
            with worker.app.connection_for_read() as connection:  # not connected: no I/O
                if connection.transport.driver_type == "redis":
                    return 1
        except Exception:  # only the wording of a warning depends on it
            logger.debug("celery-leader: could not tell the broker's transport", exc_info=True)
    return int(multiplier)


def _check_pool_size(worker: Any, kind: str) -> None:
    """Refuse a prefork pool larger than the run table the watchdog reads."""
    if kind not in KILLABLE_POOLS:
        return
    size = max(_pool_sizes(worker))
    if size > RUN_SLOTS:
        raise WorkerConfigurationError(
            f"celery-leader: a prefork pool of {size} processes is more than the {RUN_SLOTS} "
            f"celery-leader can watch; use --concurrency (or --autoscale max) of at most "
            f"{RUN_SLOTS}"
        )


def _check_elections(elections: tuple[str | None, ...], leader_name: str) -> None:
    """Refuse what one worker cannot take part in: too many elections, or a clash of names."""
    if len(elections) > MAX_ELECTIONS:
        raise WorkerConfigurationError(
            f"celery-leader: this worker would take part in {len(elections)} elections; one "
            f"worker takes part in at most {MAX_ELECTIONS}: leave some out with "
            "leader_elections_exclude"
        )
    if leader_name in elections:
        raise WorkerConfigurationError(
            f"celery-leader: election {leader_name!r} has the name of leader_name, which names "
            "the default election: give the election another name"
        )


def _keep_unknown_leader_messages(consumer: Any) -> None:
    """A leader-queue message of a task this worker does not know goes back, never dropped.

    Celery rejects a message of an unregistered task for good (and records
    it as failed). From a leader queue that would drop leader work because
    one worker lacks a module; the coordinator requeues it and steps down
    from that election instead (see :meth:`Coordinator.unknown_leader_task`).
    """
    celerys = consumer.on_unknown_task

    def on_unknown_task(body: Any, message: Any, exc: Any) -> Any:
        coordinator = current_coordinator()
        queue = (getattr(message, "delivery_info", None) or {}).get("routing_key")
        if (
            coordinator is not None
            and queue
            and coordinator.unknown_leader_task(consumer.app, message, queue)
        ):
            return None
        return celerys(body, message, exc)

    consumer.on_unknown_task = on_unknown_task


class LeaderConsumer(bootsteps.StartStopStep):  # type: ignore[misc]
    """Consumer step: couples leader-queue consumption and liveness to the consumer."""

    label = "LeaderConsumer"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        self._ticker: Any = None
        _keep_unknown_leader_messages(c)
        super().__init__(c, **kwargs)

    def start(self, c: Any) -> None:
        """After (re)connecting: keep the liveness tick going and sync the leader queue."""
        coordinator = current_coordinator()
        if coordinator is None:
            return
        interval = max(0.05, coordinator.settings.timing.renew_interval / 3)
        if getattr(c, "hub", None) is None:
            # Celery's blocking loop (gevent, eventlet, or a transport without
            # asynchronous I/O): its timer runs apart from the loop (a greenlet
            # or a thread), so the tick is handed to the loop, which runs it
            # between two drain_events calls: a stuck loop then stops ticking.
            def tick_through_the_loop() -> None:
                c.call_soon(coordinator.loop.tick)

            self._ticker = c.timer.call_repeatedly(interval, tick_through_the_loop)
        else:
            self._ticker = c.timer.call_repeatedly(interval, coordinator.loop.tick)
        # Before any reconnect flushes it: the runs going on stay known (worker.pool_flush).
        keep_accepted_jobs(getattr(c, "pool", None))
        coordinator.attach(c)

    def stop(self, c: Any) -> None:
        """Before a reconnect or shutdown: the loop will not tick until started again."""
        coordinator = current_coordinator()
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        if coordinator is not None:
            coordinator.detach()

    shutdown = stop


class LeaderElection(bootsteps.StartStopStep):  # type: ignore[misc]
    """Worker step: leader election for this worker. See the module docstring."""

    label = "LeaderElection"
    requires = ("celery.worker.components:Pool",)

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        app = worker.app
        try:
            # Celery hands every worker step the worker's options, ours among them
            # (--leader-metrics-port, added by celery_leader.install).
            self.app_settings = app_settings(app, fresh=True, worker_options=kwargs)
            self.settings: LeaderSettings = self.app_settings.worker
        except ConfigurationError as exc:
            raise WorkerConfigurationError(f"celery-leader: {exc}") from None
        if _is_test_only(self.settings.backend_url) and not _in_process(worker):
            # The list is read from every store class: only on this error path.
            raise WorkerConfigurationError(ERR_MEMORY_STORE.format(urls=shared_store_urls()))
        app.steps["consumer"].add(LeaderConsumer)
        ensure_router(app)
        # Workers consume every queue in task_queues by default: followers
        # must not eat leader messages, so the queue is only added on election.
        app.amqp.queues.deselect(self.settings.queue)
        self.coordinator: Coordinator | None = None
        self._finished = False
        self._batch_store: Any = None
        super().__init__(worker, **kwargs)

    def create(self, worker: Any) -> LeaderElection:
        """Open the store and build the coordinator, before the pool forks."""
        settings = self.settings
        resolve_leader_tasks(worker.app)
        leader_tasks = [t for t in worker.app.tasks.values() if getattr(t, "leader_only", False)]
        elections = self.app_settings.choice.elections(
            getattr(t, "leader_election", None) for t in leader_tasks
        )
        _check_elections(elections, self.app_settings.names.leader)
        try:
            check_metrics_extra(settings.metrics)
            # One store client per election: each lease manager renews on its own thread.
            stores = {election: self._open_store() for election in elections}
            # Every election has the default one's ttl: one look at the server's limits.
            check_server_limits(stores[None], settings.timing.ttl)
            batch = self._call_batch(len(elections))
        except ConfigurationError as exc:
            message = spelled_in(worker.app.conf, str(exc))
            raise WorkerConfigurationError(f"celery-leader: {message}") from None
        warn_about_visibility(worker.app, leader_tasks)
        kind = pool_kind(worker)
        warn_about_unkillable_runs(worker.app, leader_tasks, kind)
        warn_about_one_slot(
            leader_tasks, kind, *_pool_sizes(worker), prefetch_multiplier=_prefetch(worker)
        )
        _check_pool_size(worker, kind)
        names = self.app_settings.names
        if batch is not None:
            # Renewals and followers' attempts of every election go out together: one store
            # call per grid point of the renew interval.
            stores = {election: batch.view(store) for election, store in stores.items()}
        coordinator = Coordinator(
            settings,
            stores[None],
            nodename=worker.hostname,
            pool_kind=kind,
            lease_of=names.lease_of,
            renew_grid=settings.timing.renew_interval if batch is not None else None,
        )
        for election in elections:
            if election is not None:
                worker.app.amqp.queues.deselect(names.queue_of(election))
                coordinator.add_election(
                    election, self.app_settings.for_named(election), stores[election]
                )
        for queue in coordinator.foreign_leader_queues(worker.app):
            worker.app.amqp.queues.deselect(queue)  # another election's: never consumed here
        if self.app_settings.choice.balance and len(coordinator.elections) > 1:
            coordinator.balancer = self._balancer(coordinator)
        coordinator.install()  # forks the watchdog: before any thread of ours starts
        # Every election's metrics (each leader-only task's skips from 0, under the election
        # it runs under here), then /metrics and /healthz on leader_metrics_port.
        observe(settings.metrics, coordinator, leader_tasks=leader_tasks)
        self.coordinator = coordinator
        self._chain_on_stopped(worker)
        logger.info(
            "celery-leader: election %r on %s, leader queue %r, ttl %g s",
            settings.name,
            settings.masked_backend_url,
            settings.queue,
            settings.timing.ttl,
        )
        named = [e for e in coordinator.elections.values() if e.short_name is not None]
        if named:
            logger.info(
                "celery-leader: also in elections %s",
                ", ".join(f"{e.short_name!r} (queue {e.queue!r})" for e in named),
            )
        return self

    def _call_batch(self, elections: int) -> CallBatch | None:
        """One client renewing (and trying) every lease of this worker at once, where it can."""
        if elections <= 1 or not hasattr(store_class(self.settings.backend_url), "call_many"):
            return None
        self._batch_store = self._open_store()
        return CallBatch(self._batch_store)

    def _balancer(self, coordinator: Coordinator) -> Balancer | None:
        """A balancer on a store client of its own, where the store keeps members (Presence)."""
        store = self._open_store()
        if not isinstance(store, Presence):
            store.close()
            logger.info(
                "celery-leader: the %s store cannot list workers: elections are not balanced",
                self.settings.masked_backend_url.split(":", 1)[0],
            )
            return None
        timing = self.settings.timing
        return Balancer(
            coordinator,
            store,
            self.app_settings.names.members,
            interval=timing.renew_interval,
            ttl=timing.ttl,
        )

    def _open_store(self) -> Any:
        settings = self.settings
        return open_store(
            settings.backend_url,
            timeout=settings.timing.op_timeout,
            options=settings.store_options,
        )

    def _chain_on_stopped(self, worker: Any) -> None:
        """Release at the latest once the pool drained (the blueprint's ``on_stopped``)."""
        blueprint = worker.blueprint
        original_on_stopped = blueprint.on_stopped

        def on_stopped() -> None:
            self._finish()
            if original_on_stopped is not None:
                original_on_stopped()

        blueprint.on_stopped = on_stopped

    def start(self, worker: Any) -> None:
        """Nothing to start here: the consumer step starts competing once connected."""

    def stop(self, worker: Any) -> None:
        """Warm shutdown: stop leader work; the release follows once it stopped."""
        if self.coordinator is None:
            return
        try:
            self.coordinator.begin_shutdown()
        except Exception:
            logger.exception("celery-leader: error while stopping leader work")

    def terminate(self, worker: Any) -> None:
        """Cold shutdown: stop leader work and release now."""
        self.stop(worker)
        self._finish()

    def _finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        try:
            if self.coordinator is not None:
                self.coordinator.finish_shutdown()
        except Exception:
            logger.exception("celery-leader: error while releasing the lease")
        finally:
            if self._batch_store is not None:
                self._batch_store.close()
