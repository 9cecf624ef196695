"""Prometheus metrics of an election (the ``prometheus`` extra).

Turn them on with ``leader_metrics = True`` (metrics join the default
``prometheus_client`` registry, for an exporter you already run) or
``leader_metrics_port = 9808`` (the worker also serves them, and its health
probe, on that port: see :mod:`celery_leader.observe.endpoint`; give each worker on a
host its own port). Beat's election reports the same metrics under its own
``election`` label, served on ``leader_beat_metrics_port``.

==================================================  =========  =====================================
metric                                              type       meaning
==================================================  =========  =====================================
``celery_leader_is_leader``                         gauge      1 while this process leads, else 0
``celery_leader_token``                             gauge      token of the current or last term
``celery_leader_elections_total``                   counter    terms this process began
``celery_leader_losses_total``                      counter    terms lost, by ``reason``
``celery_leader_releases_total``                    counter    terms given up (shutdown, step-down)
``celery_leader_store_errors_total``                counter    failed store calls, by ``kind``
``celery_leader_renew_seconds``                     histogram  time one renewal took
``celery_leader_term_started_timestamp_seconds``    gauge      on the leader: when its term began
``celery_leader_leader_seen_timestamp_seconds``     gauge      when this process last saw a holder
``celery_leader_tasks_skipped_total``               counter    messages acknowledged without
                                                               running, by ``task`` and ``reason``
``celery_leader_beat_sends_total``                  counter    beat: entries sent, by ``entry``
``celery_leader_beat_late_sends_total``             counter    beat: sends more than 1 s after
                                                               their slot, by ``entry``
``celery_leader_beat_slots_skipped_total``          counter    beat: slots not sent, by ``entry``
                                                               and ``reason`` (``paused``,
                                                               ``window``)
==================================================  =========  =====================================

Guarantees: every series exists from the moment the election is attached,
on followers too (``is_leader`` 0, counters 0, ``leader_seen`` 0 until a
holder was seen), so "absent" means "not running", never "follower". All
carry the label ``election``. ``leader_seen`` is taken from what the store
shows: a follower looks about once per ttl (sooner after a release), the
leader at every renewal; so ``time() - max by (election)
(celery_leader_leader_seen_timestamp_seconds) > N`` (N a few ttls) is the
"no leader for N seconds" alert. Metrics are updated from lease events on
the lease thread; nothing is added to the per-task path.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Any

from celery_leader.exceptions import STORE_ERROR_KINDS, ConfigurationError
from celery_leader.lease import EventKind, LeaseEvent, LossReason, Observation, ObservationKind
from celery_leader.observe.extra import ERR_NO_PROMETHEUS
from celery_leader.settings import MetricsSettings
from celery_leader.signals import leader_task_skipped

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
except ImportError as exc:  # pragma: no cover - the extra is not installed
    # Worker and beat check first (celery_leader.observe.extra), naming the setting.
    raise ConfigurationError(ERR_NO_PROMETHEUS.format(asked_by="leader_metrics")) from exc

#: A beat send later than this after its slot counts as late, seconds.
LATE_AFTER = 1.0
_RENEW_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_by_registry: dict[int, LeaderMetrics] = {}
_lock = threading.Lock()


class LeaderMetrics:
    """The metric families, registered once per registry; a listener and observer per election."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.pid = os.getpid()
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
        self.store_errors = Counter(
            "celery_leader_store_errors",
            "Failed lease store calls, by kind",
            (*labels, "kind"),
            registry=registry,
        )
        self.renew_seconds = Histogram(
            "celery_leader_renew_seconds",
            "Time one renewal took",
            labels,
            buckets=_RENEW_BUCKETS,
            registry=registry,
        )
        self.term_started = Gauge(
            "celery_leader_term_started_timestamp_seconds",
            "Unix time this process's current term began (only while it leads)",
            labels,
            registry=registry,
        )
        self.leader_seen = Gauge(
            "celery_leader_leader_seen_timestamp_seconds",
            "Unix time this process last saw a holder of the lease in the store (0: never)",
            labels,
            registry=registry,
        )

        self.skipped = Counter(
            "celery_leader_tasks_skipped",
            "Leader messages acknowledged without running, by task and reason",
            (*labels, "task", "reason"),
            registry=registry,
        )
        leader_task_skipped.connect(self._on_skipped, weak=False)
        entry_labels = (*labels, "entry")
        self.beat_sends = Counter(
            "celery_leader_beat_sends",
            "Entries the beat leader sent (run-now sends not counted), by entry",
            entry_labels,
            registry=registry,
        )
        self.beat_late_sends = Counter(
            "celery_leader_beat_late_sends",
            f"Entries sent more than {LATE_AFTER:g} s after their slot, by entry",
            entry_labels,
            registry=registry,
        )
        self.beat_slots_skipped = Counter(
            "celery_leader_beat_slots_skipped",
            "Slots the beat leader did not send, by entry and reason (paused, window)",
            (*entry_labels, "reason"),
            registry=registry,
        )

    def beat_sent(self, election: str, entry: str, late_by: float) -> None:
        """Beat sent *entry* *late_by* seconds after its slot (beat's loop)."""
        self.beat_sends.labels(election, entry).inc()
        late = self.beat_late_sends.labels(election, entry)  # the series exists from the first send
        if late_by > LATE_AFTER:
            late.inc()

    def beat_skipped(self, election: str, entry: str, reason: str) -> None:
        """Beat consumed a slot of *entry* without sending it, for *reason*."""
        self.beat_slots_skipped.labels(election, entry, reason).inc()

    def _on_skipped(self, sender: Any = None, **fields: Any) -> None:
        """A ``leader_task_skipped`` signal (the worker's signal thread)."""
        self.skipped.labels(fields["name"], fields["task"], fields["reason"]).inc()

    def _families(self) -> tuple[Any, ...]:
        return (
            self.is_leader,
            self.token,
            self.elections,
            self.losses,
            self.releases,
            self.store_errors,
            self.renew_seconds,
            self.term_started,
            self.leader_seen,
            self.skipped,
            self.beat_sends,
            self.beat_late_sends,
            self.beat_slots_skipped,
        )

    def forget_inherited(self) -> None:
        """Drop every series: this process was forked from the one that made them."""
        for family in self._families():
            family.clear()
        self.pid = os.getpid()

    def attach(self, manager: Any) -> None:
        """Export *manager*'s election from now on: every series at its start value."""
        election = manager.name
        self.is_leader.labels(election).set(0)
        self.token.labels(election).set(0)
        self.elections.labels(election)
        self.releases.labels(election)
        for reason in LossReason:
            self.losses.labels(election, reason.value)
        for kind in STORE_ERROR_KINDS:
            self.store_errors.labels(election, kind)
        self.renew_seconds.labels(election)
        self.leader_seen.labels(election).set(0)
        manager.add_listener(self.listener)
        manager.add_observer(self.observer)

    def listener(self, event: LeaseEvent) -> None:
        """Update the metrics from one lease event."""
        election = event.name
        if event.kind is EventKind.ELECTED:
            self.elections.labels(election).inc()
            self.is_leader.labels(election).set(1)
            self.token.labels(election).set(event.term.token)
            self.term_started.labels(election).set(time.time())
        elif event.kind is EventKind.RENEWED:
            if event.latency is not None:
                self.renew_seconds.labels(election).observe(event.latency)
        elif event.kind is EventKind.LOST:
            reason = event.reason.value if event.reason else "unknown"
            self.losses.labels(election, reason).inc()
            self._not_leading(election)
        elif event.kind is EventKind.RELEASED:
            self.releases.labels(election).inc()
            self._not_leading(election)

    def observer(self, observation: Observation) -> None:
        """Update the metrics from what the store showed."""
        election = observation.name
        if observation.kind is ObservationKind.HOLDER_SEEN:
            self.leader_seen.labels(election).set(time.time())
        elif observation.kind is ObservationKind.STORE_ERROR:
            self.store_errors.labels(election, observation.error_kind or "error").inc()

    def _not_leading(self, election: str) -> None:
        self.is_leader.labels(election).set(0)
        # No series when no term began here (a term given up during its hold-off).
        with contextlib.suppress(KeyError):
            self.term_started.remove(election)


def metrics_for(registry: CollectorRegistry | None = None) -> LeaderMetrics:
    """The :class:`LeaderMetrics` of *registry* (the default one if None), made once.

    In a forked process (an embedded beat is forked from its worker) the
    series inherited from the parent are dropped first: their values froze
    at the fork and would report the parent's elections wrongly.
    """
    registry = registry or REGISTRY
    with _lock:
        metrics = _by_registry.get(id(registry))
        if metrics is None:
            metrics = _by_registry[id(registry)] = LeaderMetrics(registry)
        elif metrics.pid != os.getpid():
            metrics.forget_inherited()
        return metrics


def enable_metrics(settings: MetricsSettings, manager: Any) -> LeaderMetrics | None:
    """Export *manager*'s election in the default registry when *settings* turn metrics on.

    Serving them (and the health probe) over HTTP is
    :func:`celery_leader.observe.endpoint.serve`'s job.
    """
    if not settings.enabled:
        return None
    metrics = metrics_for()
    metrics.attach(manager)
    return metrics
