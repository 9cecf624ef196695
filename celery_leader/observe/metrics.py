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
``celery_leader_slow_renewals_total``               counter    renewals that took more than a
                                                               quarter of the store timeout
``celery_leader_term_started_timestamp_seconds``    gauge      on the leader: when its term began
``celery_leader_leader_seen_timestamp_seconds``     gauge      when this process last saw a holder
``celery_leader_lease_ttl_seconds``                 gauge      the election's lease ttl setting
``celery_leader_renew_interval_seconds``            gauge      the election's renew interval
``celery_leader_store_timeout_seconds``             gauge      the bound on one store call: a
                                                               renewal never takes longer
``celery_leader_tasks_skipped_total``               counter    messages acknowledged without
                                                               running, by ``task`` and ``reason``
                                                               (``overlap``, ``occurrence``)
``celery_leader_beat_sends_total``                  counter    beat: entries sent, by ``entry``
``celery_leader_beat_late_sends_total``             counter    beat: sends more than 1 s after
                                                               their slot, by ``entry``
``celery_leader_beat_slots_skipped_total``          counter    beat: skips, by ``entry`` and
                                                               ``reason``: ``paused`` (one a
                                                               paused slot), ``window`` (one a
                                                               takeover that skipped the
                                                               entry's missed slots, however
                                                               many)
``celery_leader_watchdog_up``                       gauge      prefork worker: 1 while its run
                                                               watchdog lives, 0 while it is dead
``celery_leader_watchdog_replacements_total``       counter    prefork worker: watchdogs replaced
                                                               because the one before died
==================================================  =========  =====================================

Guarantees: every series exists from the moment the election is attached,
on followers too (``is_leader`` 0, counters 0, ``leader_seen`` 0 until a
holder was seen), so "absent" means "not running", never "follower". All
carry the label ``election``. A labelled counter exists at 0 for every
label value the process knows when it attaches, so that ``increase()`` and
``rate()`` see its first event:

* ``tasks_skipped_total``: for each leader-only task of the election that
  the worker has registered, times each reason
  (:data:`~celery_leader.skip_reasons.TASK_SKIP_REASONS`). A task the
  worker does not know is counted from its first skip.
* the beat families: for each entry of beat's schedule, times each reason
  (:data:`~celery_leader.skip_reasons.SLOT_SKIP_REASONS`) for the slots
  skipped. Beat looks at its entry names at each tick (no store or
  database call: the entries the scheduler holds in memory, see
  :meth:`celery_leader.beat.state.ScheduleState.entry_names`), so an entry
  that appears later (django-celery-beat reloads its table) has its series
  from the next tick, before it is due in all but the rarest case: one
  loaded in the very tick that sends it.
* ``watchdog_up`` and ``watchdog_replacements_total``: only on a worker
  whose pool runs a watchdog (prefork); solo, threads and gevent workers and
  beat export neither. Both are read from the watchdog when scraped; a dead
  watchdog is replaced before the next renewal (then ``up`` is 1 again and
  the counter one more), so ``up`` is 0 only briefly, unless no new one can
  be started (``/healthz`` then fails too). A worker shutting down ends its
  watchdog on purpose: from then on neither series is reported.

A task or entry that goes away keeps its series (at its last value) until
the process ends: a series is never removed under a running query. The
ttl, renew interval and store timeout gauges let alert rules scale with
the configured timing. ``leader_seen`` is taken from what the store shows:
a follower looks about once per ttl (sooner after a release), the leader
at every renewal; so its age at each scrape (``timestamp(x) - x``), the
youngest over an election's processes, above 2 ttl means no holder: the
shipped ``CeleryNoLeader`` rule (docs/prometheus/celery-leader-rules.yml,
with the other alerts and their unit tests). Metrics are
updated from lease events on the lease thread; nothing is added to the
per-task path.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Iterable, Iterator
from collections.abc import Set as AbstractSet
from typing import Any, NamedTuple, Protocol

from celery_leader.exceptions import STORE_ERROR_KINDS, ConfigurationError
from celery_leader.lease import EventKind, LeaseEvent, LossReason, Observation, ObservationKind
from celery_leader.observe.extra import ERR_NO_PROMETHEUS
from celery_leader.settings import MetricsSettings
from celery_leader.signals import leader_task_skipped
from celery_leader.skip_reasons import SLOT_SKIP_REASONS, TASK_SKIP_REASONS

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - the extra is not installed
    # Worker and beat check first (celery_leader.observe.extra), naming the setting.
    raise ConfigurationError(ERR_NO_PROMETHEUS.format(asked_by="leader_metrics")) from exc

#: A beat send later than this after its slot counts as late, seconds.
LATE_AFTER = 1.0
_RENEW_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_by_registry: dict[int, LeaderMetrics] = {}
_lock = threading.Lock()


class WatchedWatchdog(Protocol):
    """What the metrics read of a worker's run watchdog (``term_end.watchdog.Watchdog``)."""

    @property
    def replacements(self) -> int:
        """Watchdogs started because the one before died."""

    @property
    def stopped(self) -> bool:
        """True when the worker ended its watchdog on purpose (it shuts down)."""

    def alive(self) -> bool:
        """True while the watchdog runs and passes."""


class ScrapedFamily(NamedTuple):
    """A family whose samples are read when scraped, described for the metrics reference."""

    name: str
    type: str
    labels: tuple[str, ...]
    documentation: str


class WatchdogCollector(Collector):
    """The watchdog's two families, read from the watchdog when scraped.

    One series per election of a worker whose pool runs a watchdog; the
    same watchdog guards every election of the worker. Reading it is a
    ``waitid`` (without reaping) and a read of shared memory: no thread is
    added and nothing waits.
    """

    UP = ScrapedFamily(
        "celery_leader_watchdog_up",
        "gauge",
        ("election",),
        "1 while this prefork worker's run watchdog lives, 0 while it is dead (until replaced)",
    )
    REPLACEMENTS = ScrapedFamily(
        "celery_leader_watchdog_replacements",
        "counter",
        ("election",),
        "Run watchdogs of this worker replaced because the one before died",
    )
    #: The families, in the order they are exposed.
    FAMILIES = (UP, REPLACEMENTS)

    def __init__(self, registry: CollectorRegistry) -> None:
        self._watched: dict[str, WatchedWatchdog] = {}
        registry.register(self)

    def watch(self, election: str, watchdog: WatchedWatchdog) -> None:
        """Report *watchdog* under *election* from now on."""
        self._watched[election] = watchdog

    def clear(self) -> None:
        """Report no watchdog (a forked process: its parent's watchdog is not its own)."""
        self._watched.clear()

    def describe(self) -> list[Metric]:
        """The families without samples (what the registry checks names against)."""
        return list(self._families({}))

    def collect(self) -> Iterator[Metric]:
        """The families with one sample per election watched."""
        return self._families(dict(self._watched))

    def _families(self, watched: dict[str, WatchedWatchdog]) -> Iterator[Metric]:
        up = GaugeMetricFamily(self.UP.name, self.UP.documentation, labels=self.UP.labels)
        replaced = CounterMetricFamily(
            self.REPLACEMENTS.name,
            self.REPLACEMENTS.documentation,
            labels=self.REPLACEMENTS.labels,
        )
        alive: dict[int, bool] = {}  # one look per watchdog, however many elections it guards
        for election, watchdog in sorted(watched.items()):
            if watchdog.stopped:
                # Ended on purpose at shutdown: its series go, rather than read "dead" to
                # the scrapes between the watchdog's end and the process's.
                continue
            if id(watchdog) not in alive:
                alive[id(watchdog)] = watchdog.alive()
            up.add_metric([election], 1.0 if alive[id(watchdog)] else 0.0)
            replaced.add_metric([election], float(watchdog.replacements))
        yield up
        yield replaced


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
        # Counted here, not read from the histogram: its buckets are fixed (1 ms to 5 s),
        # while the bound is anything from milliseconds to minutes, so a quantile
        # interpolated inside a bucket says little about "past a part of the bound". A
        # quarter: a store may bound each read by half the store timeout (Redis gives
        # connect and read half each), so a renewal past a quarter is half way to failing.
        self.slow_renewals = Counter(
            "celery_leader_slow_renewals",
            "Renewals that took more than a quarter of the store timeout (leader_store_timeout)",
            labels,
            registry=registry,
        )
        #: Election -> the renewal time past which a renewal counts as slow, seconds.
        self._slow_after: dict[str, float] = {}
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
        self.lease_ttl = Gauge(
            "celery_leader_lease_ttl_seconds",
            "The election's lease ttl (leader_lease_ttl), seconds",
            labels,
            registry=registry,
        )
        self.renew_interval = Gauge(
            "celery_leader_renew_interval_seconds",
            "The election's renew interval (leader_renew_interval, or its default), seconds",
            labels,
            registry=registry,
        )
        self.store_timeout = Gauge(
            "celery_leader_store_timeout_seconds",
            "The bound on one store call (leader_store_timeout, or its default), seconds: "
            "a renewal that would take longer fails",
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
            "Beat skips, by entry and reason: paused (one per paused slot), window (one per "
            "takeover that skipped the entry's missed slots, however many)",
            (*entry_labels, "reason"),
            registry=registry,
        )
        #: Per beat election: the entry names seen at the last look (see beat_entries).
        self._beat_entries: dict[str, frozenset[str]] = {}
        self.watchdogs = WatchdogCollector(registry)

    def beat_entries(self, election: str, names: AbstractSet[str]) -> None:
        """Beat's schedule holds the entries *names*: each one's series exist, at 0 if new.

        Beat's loop, at each tick. Cheap when nothing changed (one set
        comparison); an entry that left keeps its series.
        """
        if self._beat_entries.get(election) == names:
            return
        for entry in names:
            self.beat_sends.labels(election, entry)
            self.beat_late_sends.labels(election, entry)
            for reason in SLOT_SKIP_REASONS:
                self.beat_slots_skipped.labels(election, entry, reason)
        self._beat_entries[election] = frozenset(names)

    def beat_sent(self, election: str, entry: str, late_by: float) -> None:
        """Beat sent *entry* *late_by* seconds after its slot (beat's loop)."""
        self.beat_sends.labels(election, entry).inc()
        late = self.beat_late_sends.labels(election, entry)  # made at 0 if beat_entries missed it
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
            self.slow_renewals,
            self.term_started,
            self.leader_seen,
            self.lease_ttl,
            self.renew_interval,
            self.store_timeout,
            self.skipped,
            self.beat_sends,
            self.beat_late_sends,
            self.beat_slots_skipped,
            self.watchdogs,
        )

    def forget_inherited(self) -> None:
        """Drop every series: this process was forked from the one that made them."""
        for family in self._families():
            family.clear()
        self._beat_entries.clear()
        self.pid = os.getpid()

    def attach(
        self,
        manager: Any,
        *,
        tasks: Iterable[str] = (),
        watchdog: WatchedWatchdog | None = None,
    ) -> None:
        """Export *manager*'s election from now on: every series at its start value.

        *tasks* are the election's leader-only tasks (their skip counters
        start at 0 for every reason); *watchdog* is the worker's run
        watchdog, when its pool runs one.
        """
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
        self.slow_renewals.labels(election)
        self._slow_after[election] = manager.timing.op_timeout / 4
        self.leader_seen.labels(election).set(0)
        self.lease_ttl.labels(election).set(manager.timing.ttl)
        self.renew_interval.labels(election).set(manager.timing.renew_interval)
        self.store_timeout.labels(election).set(manager.timing.op_timeout)
        for task in tasks:
            for why in TASK_SKIP_REASONS:
                self.skipped.labels(election, task, why)
        if watchdog is not None:
            self.watchdogs.watch(election, watchdog)
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
                if event.latency > self._slow_after.get(election, math.inf):
                    self.slow_renewals.labels(election).inc()
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


def enable_worker_metrics(
    settings: MetricsSettings, coordinator: Any, leader_tasks: Iterable[Any]
) -> LeaderMetrics | None:
    """Export every election of a worker when *settings* turn metrics on.

    *coordinator* is the worker's
    :class:`~celery_leader.worker.coordinator.Coordinator`; read of it:
    ``elections`` (each with its ``manager``), ``election_for(task)`` (the
    election a task runs under here, None when the worker takes no part in
    it) and ``watchdog`` (None when the pool runs none). *leader_tasks* are
    the worker's registered leader-only tasks: each one's skips are counted
    from 0, under the election it runs under here.
    """
    if not settings.enabled:
        return None
    metrics = metrics_for()
    tasks = list(leader_tasks)
    for election in coordinator.elections.values():
        names = sorted({task.name for task in tasks if coordinator.election_for(task) is election})
        metrics.attach(election.manager, tasks=names, watchdog=coordinator.watchdog)
    return metrics
