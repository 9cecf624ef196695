"""Prometheus metrics of an election (the ``prometheus`` extra).

Turn them on with ``leader_metrics = True`` (metrics join the default
``prometheus_client`` registry, for an exporter you already run) or
``leader_metrics_port = 9808`` (the worker also serves them on that port;
give each worker on a host its own port). Beat's election reports the same
metrics under its own ``election`` label.

=====================================  ==========  ==========================================
metric                                 type        meaning
=====================================  ==========  ==========================================
``celery_leader_is_leader``            gauge       1 while this process leads the election
``celery_leader_token``                gauge       fencing token of the current or last term
``celery_leader_elections_total``      counter     terms this process began
``celery_leader_losses_total``         counter     terms lost, by ``reason``
``celery_leader_releases_total``       counter     terms given up (shutdown, step-down)
``celery_leader_renew_seconds``        histogram   time one renewal took
=====================================  ==========  ==========================================

All carry the label ``election``. Metrics are updated from lease events in
the worker's main process; nothing is added to the per-task path.
"""

from __future__ import annotations

import threading
from typing import Any

from celery_leader.exceptions import ConfigurationError
from celery_leader.lease import EventKind, LeaseEvent
from celery_leader.settings import MetricsSettings

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
    from prometheus_client import start_http_server as _start_http_server
except ImportError as exc:  # pragma: no cover - the extra is not installed
    raise ConfigurationError(
        "leader_metrics needs prometheus_client: pip install 'celery-leader[prometheus]'"
    ) from exc

_RENEW_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_by_registry: dict[int, LeaderMetrics] = {}
_lock = threading.Lock()


class LeaderMetrics:
    """The metric families, registered once per registry; a lease listener per election."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ("election",)
        self.is_leader = Gauge(
            "celery_leader_is_leader", "1 while this process leads", labels, registry=registry
        )
        self.token = Gauge(
            "celery_leader_token",
            "Fencing token of the current or last term",
            labels,
            registry=registry,
        )
        self.elections = Counter(
            "celery_leader_elections", "Terms this process began", labels, registry=registry
        )
        self.losses = Counter(
            "celery_leader_losses",
            "Terms lost, by reason",
            (*labels, "reason"),
            registry=registry,
        )
        self.releases = Counter(
            "celery_leader_releases", "Terms given up", labels, registry=registry
        )
        self.renew_seconds = Histogram(
            "celery_leader_renew_seconds",
            "Time one renewal took",
            labels,
            buckets=_RENEW_BUCKETS,
            registry=registry,
        )

    def listener(self, event: LeaseEvent) -> None:
        """Update the metrics from one lease event."""
        election = event.name
        if event.kind is EventKind.ELECTED:
            self.elections.labels(election).inc()
            self.is_leader.labels(election).set(1)
            self.token.labels(election).set(event.term.token)
        elif event.kind is EventKind.RENEWED:
            if event.latency is not None:
                self.renew_seconds.labels(election).observe(event.latency)
        elif event.kind is EventKind.LOST:
            reason = event.reason.value if event.reason else "unknown"
            self.losses.labels(election, reason).inc()
            self.is_leader.labels(election).set(0)
        elif event.kind is EventKind.RELEASED:
            self.releases.labels(election).inc()
            self.is_leader.labels(election).set(0)


def metrics_for(registry: CollectorRegistry | None = None) -> LeaderMetrics:
    """The :class:`LeaderMetrics` of *registry* (the default one if None), made once."""
    registry = registry or REGISTRY
    with _lock:
        if id(registry) not in _by_registry:
            _by_registry[id(registry)] = LeaderMetrics(registry)
        return _by_registry[id(registry)]


_served: set[tuple[str, int]] = set()


def enable_metrics(settings: MetricsSettings, manager: Any) -> LeaderMetrics | None:
    """Attach metrics to *manager* when *settings* turn them on; serve them on its port."""
    if not settings.enabled:
        return None
    metrics = metrics_for()
    manager.add_listener(metrics.listener)
    if settings.port is not None:
        with _lock:
            if (settings.address, settings.port) not in _served:
                _start_http_server(settings.port, addr=settings.address)
                _served.add((settings.address, settings.port))
    return metrics
