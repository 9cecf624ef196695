"""One process's settings: every ``leader_*`` setting read and checked once, at start.

The worker's bootstep, beat's scheduler and the CLI each build an
:class:`AppSettings` (through :func:`app_settings`) and hand it down; the
task side reads the same object for routing. Every problem is reported as
one :class:`~celery_leader.exceptions.ConfigurationError` line that names the
setting as the user wrote it, the value given and what is allowed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from celery_leader._masking import mask_url
from celery_leader.lease.timing import LeaseTiming
from celery_leader.settings.beat import BeatSettings, beat_settings, beat_unled
from celery_leader.settings.checks import warn_about_spelling
from celery_leader.settings.elections import ElectionChoice, election_choice, leader_task_routes
from celery_leader.settings.failover import fast_failover
from celery_leader.settings.metrics import BEAT_METRICS_PORT, MetricsSettings, metrics_settings
from celery_leader.settings.names import (
    BEAT_SUFFIX,
    ElectionNames,
    check_election_name,
    election_names,
)
from celery_leader.settings.spelling import spelled_as_given
from celery_leader.settings.store import default_backend_url, store_options
from celery_leader.settings.timing import lease_timing, stop_grace
from celery_leader.stores.registry import store_class


@dataclass(frozen=True)
class LeaderSettings:
    """Validated settings of one election."""

    backend_url: str
    name: str
    queue: str
    timing: LeaseTiming
    store_options: Mapping[str, Any]
    stop_grace: float
    """Seconds a step-down or warm shutdown gives leader runs to stop before prefork kills them."""
    metrics: MetricsSettings
    fast_failover: bool = False
    """``leader_fast_failover``: tie terms to a lifeline where the store has one."""

    @property
    def masked_backend_url(self) -> str:
        """The store URL with secrets masked, safe to print."""
        return mask_url(self.backend_url)


@dataclass(frozen=True)
class ElectionSettings:
    """One election of a process: its lease name, its leader queue, its lease timing."""

    name: str
    queue: str | None
    """The queue its leader consumes; None for beat's election, whose work is sending."""
    timing: LeaseTiming


@dataclass(frozen=True)
class AppSettings:
    """Every ``leader_*`` setting of one process, read and validated once at start.

    Values shared by every election (the store, metrics, grace) sit here
    once; what differs per election is an entry of :attr:`elections`, keyed
    by election name.
    """

    backend_url: str
    store_options: Mapping[str, Any]
    stop_grace: float
    metrics: MetricsSettings
    """The worker's metrics and health port (``leader_metrics_port``)."""
    beat_metrics: MetricsSettings
    """Beat's own port (``leader_beat_metrics_port``): it may share a host with a worker."""
    beat: BeatSettings
    names: ElectionNames
    elections: Mapping[str, ElectionSettings]
    beat_unled: bool = False
    """``leader_beat_unled``: a beat may run another scheduler, unled (see celery_leader.beat)."""
    choice: ElectionChoice = field(default_factory=ElectionChoice)
    """Which named elections a worker competes in (``leader_elections``, ...)."""
    task_routes: tuple[tuple[str, str | None], ...] = ()
    """``leader_tasks`` as (pattern, election) pairs."""
    fast_failover: bool = False
    """``leader_fast_failover`` (see :mod:`celery_leader.lease.lifeline`)."""

    @property
    def task_patterns(self) -> tuple[str, ...]:
        """``leader_tasks``: the patterns, whatever their election."""
        return tuple(pattern for pattern, _ in self.task_routes)

    @property
    def masked_backend_url(self) -> str:
        """The store URL with secrets masked, safe to print."""
        return mask_url(self.backend_url)

    def election(self, name: str) -> ElectionSettings:
        """The entry of election *name*; ``KeyError`` for an election this process does not run."""
        return self.elections[name]

    def for_election(self, name: str) -> LeaderSettings:
        """The settings one election's lease and its consumers read (:class:`LeaderSettings`)."""
        entry = self.election(name)
        return LeaderSettings(
            backend_url=self.backend_url,
            name=entry.name,
            queue=entry.queue or "",
            timing=entry.timing,
            store_options=self.store_options,
            stop_grace=self.stop_grace,
            metrics=self.beat_metrics if name == self.names.beat else self.metrics,
            fast_failover=self.fast_failover,
        )

    def for_named(self, election: str | None) -> LeaderSettings:
        """The settings of the workers' *election* (None: the default one).

        A named election has the default one's timing, its own lease name and
        its own leader queue (see :class:`ElectionNames`).
        """
        if election is None:
            return self.worker
        return replace(
            self.worker,
            name=self.names.lease_of(check_election_name(election, "election")),
            queue=self.names.queue_of(election),
        )

    @property
    def worker(self) -> LeaderSettings:
        """The workers' election."""
        return self.for_election(self.names.leader)

    @property
    def beat_election(self) -> LeaderSettings:
        """Beat's election, with beat's metrics port."""
        return self.for_election(self.names.beat)


@spelled_as_given
def load_app_settings(
    conf: Mapping[str, Any],
    main: str | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    worker_options: Mapping[str, Any] | None = None,
) -> AppSettings:
    """Read and validate every ``leader_*`` setting of *conf* (an app's ``conf``).

    Every setting is checked, also those only beat reads (a worker may run
    beat, ``-B``) and those of a store other than the one in use. Keys that
    celery-leader will not read as meant are warned of once
    (:mod:`celery_leader.settings.checks`). A setting that one process may
    override for itself (a metrics port) is read from the worker's options
    in *worker_options* first, then from its environment variable in
    *environ* (``os.environ`` unless given).
    """
    url = default_backend_url(conf)
    timing = lease_timing(conf, url, store_class(url))
    names = election_names(conf, main)
    settings = AppSettings(
        backend_url=url,
        store_options=store_options(conf, url),
        stop_grace=stop_grace(conf, timing),
        metrics=metrics_settings(conf, environ=environ, options=worker_options),
        beat_metrics=metrics_settings(conf, BEAT_METRICS_PORT.name, environ=environ),
        beat=beat_settings(conf),
        names=names,
        elections={
            names.leader: ElectionSettings(names.leader, names.queue, timing),
            names.beat: ElectionSettings(names.beat, None, timing),
        },
        beat_unled=beat_unled(conf),
        choice=election_choice(conf),
        task_routes=leader_task_routes(conf),
        fast_failover=fast_failover(conf),
    )
    warn_about_spelling(conf)
    return settings


def load_settings(
    conf: Mapping[str, Any], main: str | None = None, *, name_suffix: str = ""
) -> LeaderSettings:
    """The settings of one election of *conf*: the workers', or beat's with ``name_suffix=".beat"``.

    Kept for callers of earlier releases; :func:`load_app_settings` reads
    every election at once.
    """
    settings = load_app_settings(conf, main)
    if name_suffix not in ("", BEAT_SUFFIX):
        # Another suffix names an election of its own, as in earlier releases.
        return replace(settings.worker, name=settings.names.leader + name_suffix)
    view = settings.for_election(settings.names.leader + name_suffix)
    # Earlier releases gave beat's election the worker's metrics port here.
    return replace(view, metrics=settings.metrics) if name_suffix else view


#: Where an app keeps the settings its process read (see :func:`app_settings`).
_SETTINGS_ATTR = "_celery_leader_settings"
_NAMES_ATTR = "_celery_leader_names"


def app_settings(
    app: Any, *, fresh: bool = False, worker_options: Mapping[str, Any] | None = None
) -> AppSettings:
    """The :class:`AppSettings` of *app*, kept on the app for the rest of the process.

    The worker step, beat and the CLI read them *fresh* when they start, and
    hand them down; routing then reads the same object. A ``leader_*`` key
    changed after that start is not seen until the next one (a test that
    starts a new worker with other settings gets them). The worker step
    passes its keyword arguments as *worker_options*: the values of
    ``celery worker --leader-...`` options (see :func:`load_app_settings`).
    """
    settings = None if fresh else getattr(app, _SETTINGS_ATTR, None)
    if settings is None:
        settings = load_app_settings(
            app.conf, getattr(app, "main", None), worker_options=worker_options
        )
        setattr(app, _SETTINGS_ATTR, settings)
    return settings


def names_for_app(app: Any) -> ElectionNames:
    """The :class:`ElectionNames` of *app*: its process settings' when read, else read once."""
    settings = getattr(app, _SETTINGS_ATTR, None)
    if settings is not None:
        return settings.names  # type: ignore[no-any-return]
    names = getattr(app, _NAMES_ATTR, None)
    if names is None:
        names = election_names(app.conf, getattr(app, "main", None))
        setattr(app, _NAMES_ATTR, names)
    return names


def settings_for_app(app: Any, *, name_suffix: str = "") -> LeaderSettings:
    """:func:`load_settings` for a Celery app object (kept for callers of earlier releases)."""
    return load_settings(app.conf, getattr(app, "main", None), name_suffix=name_suffix)
