"""Turn a process's observability on: metrics for each of its elections, then its endpoint.

The worker (:mod:`celery_leader.worker.bootsteps`) and beat
(:mod:`celery_leader.beat.election`) both call :func:`observe` once, at
start, after every election of the process exists and before any lease
thread starts, so every series exists from the first event on.

Guarantees: with metrics on, every election of the process is exported
(followers included); with a port, ``/metrics`` and ``/healthz`` are served
there, the endpoint last, since a probe may come at once and must find
every election's series. The health answer is
:func:`celery_leader.observe.health.verdict` of the same process, so a
worker and a beat answer with the same fields. A port that cannot be served
stops the process at start with one line
(:func:`~celery_leader.observe.endpoint.serve_at_start`).

The ``prometheus`` extra is imported only when metrics are on: a process
checks for it first (:mod:`celery_leader.observe.extra`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from celery_leader.observe.health import Observed, verdict
from celery_leader.settings import MetricsSettings

if TYPE_CHECKING:
    from celery_leader.observe.metrics import LeaderMetrics


def observe(
    metrics: MetricsSettings, process: Observed, leader_tasks: Iterable[Any] | None = None
) -> LeaderMetrics | None:
    """Export every election of *process* and serve its endpoint, as *metrics* say.

    A worker passes its registered *leader_tasks* (and is itself the
    :class:`~celery_leader.worker.coordinator.Coordinator`): their skip
    counters and its run watchdog's series start with its elections'.
    Returns the metric families (beat counts its sends on them), or None
    when metrics are off.
    """
    exported = None
    if metrics.enabled:
        from celery_leader.observe.metrics import (  # noqa: PLC0415 - optional extra
            enable_metrics,
            enable_worker_metrics,
        )

        if leader_tasks is not None:
            exported = enable_worker_metrics(metrics, process, leader_tasks)
        else:
            for manager in process.managers:
                exported = enable_metrics(metrics, manager)
    if metrics.port is not None:  # last: a probe may come at once
        from celery_leader.observe.endpoint import serve_at_start  # noqa: PLC0415 - only with a port

        serve_at_start(metrics, lambda: verdict(process, metrics.stuck_after))
    return exported
