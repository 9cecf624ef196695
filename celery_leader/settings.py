"""The ``leader_*`` settings of a Celery app, with defaults and validation.

Every ``leader_*`` key is read here and nowhere else. Every problem is
reported at start as one :class:`ConfigurationError` line that names the
setting, the value given and what is allowed.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import logging
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal, ParamSpec, TypeVar
from urllib.parse import urlsplit

from celery_leader._masking import mask_url
from celery_leader._values import seconds
from celery_leader.exceptions import ConfigurationError
from celery_leader.lease.timing import LeaseTiming
from celery_leader.observe.health import DEFAULT_STUCK_AFTER
from celery_leader.stores.registry import shared_store_urls, store_class, validate_store_options
from celery_leader.stores.sentinel import parse_sentinel_url

_P = ParamSpec("_P")
_R = TypeVar("_R")

_KEY = re.compile(r"\bleader_[a-z_]+")

logger = logging.getLogger(__name__)

#: Every ``leader_*`` key celery-leader reads (README, "Settings").
KNOWN_KEYS = frozenset(
    {
        "leader_backend_url",
        "leader_name",
        "leader_lease_ttl",
        "leader_renew_interval",
        "leader_queue",
        "leader_lease_margin",
        "leader_store_timeout",
        "leader_stop_grace",
        "leader_tasks",
        "leader_beat_scheduler",
        "leader_beat_standby",
        "leader_beat_missed_default",
        "leader_beat_missed",
        "leader_beat_unled",
        "leader_azure_connection_string",
        "leader_azure_account_url",
        "leader_azure_watch_interval",
        "leader_sentinel_master_name",
        "leader_sentinel_kwargs",
        "leader_metrics",
        "leader_metrics_port",
        "leader_metrics_address",
        "leader_beat_metrics_port",
        "leader_health_stuck_after",
        "leader_elections",
        "leader_elections_exclude",
        "leader_balance",
    }
)


def spelled(conf: Mapping[str, Any], key: str) -> str:
    """*key* as the user wrote it: ``CELERY_LEADER_LEASE_TTL`` under a namespace.

    Celery's ``config_from_object(..., namespace="CELERY")`` finds
    ``leader_lease_ttl`` in ``CELERY_LEADER_LEASE_TTL``; an error that named
    the lower-case key would name something the user never wrote.
    """
    prefix = getattr(conf, "prefix", None)
    if not prefix or key in _own_keys(conf):
        return key
    given = f"{prefix}{key.upper()}"
    return given if given in _own_keys(conf) else key


def _own_keys(conf: Mapping[str, Any]) -> set[str]:
    try:
        return set(conf.keys())
    except Exception:  # noqa: BLE001 - a conf that cannot list keys keeps the plain names
        return set()


def spelled_in(conf: Mapping[str, Any], message: str) -> str:
    """*message* with each ``leader_*`` key it names spelled as *conf* has it (:func:`spelled`)."""
    if not getattr(conf, "prefix", None):
        return message
    return _KEY.sub(lambda m: spelled(conf, m.group(0)), message)


def _spelled_as_given(func: Callable[_P, _R]) -> Callable[_P, _R]:
    """Rewrite the keys a :class:`ConfigurationError` names as the conf (first arg) spells them."""

    @functools.wraps(func)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return func(*args, **kwargs)
        except ConfigurationError as exc:
            conf = args[0] if args else None
            if not isinstance(conf, Mapping) or not getattr(conf, "prefix", None):
                raise
            message = _KEY.sub(lambda m: spelled(conf, m.group(0)), str(exc))
            raise ConfigurationError(message) from None

    return wrapper


#: Lease length when ``leader_lease_ttl`` is not set, in seconds.
DEFAULT_TTL = 5.0

ERR_NO_BACKEND = (
    "leader_backend_url is not set and the broker ({broker}) is not Redis: set "
    "leader_backend_url to a {urls} URL"
)

_REDIS_SCHEMES = ("redis", "rediss", "unix", "sentinel")
_MAX_PORT = 65535

#: What a new beat leader does with a slot missed in the leaderless gap.
MISSED_POLICIES = ("once", "skip")
#: How beat standbys keep in step (see celery_leader.beat).
STANDBY_MODES = ("auto", "reserve", "idle")
#: The scheduler LeaderScheduler wraps unless ``leader_beat_scheduler`` names another.
DEFAULT_BEAT_SCHEDULER = "celery.beat:PersistentScheduler"
#: Beat's election is the workers' election name with this suffix.
BEAT_SUFFIX = ".beat"
#: Where the metrics port listens unless ``leader_metrics_address`` says otherwise.
DEFAULT_METRICS_ADDRESS = "0.0.0.0"  # noqa: S104 - scraped from outside the host


@dataclass(frozen=True)
class MetricsSettings:
    """Metrics and health: ``leader_metrics``, the port, its address, the stuck bound.

    The port is ``leader_metrics_port`` for a worker and
    ``leader_beat_metrics_port`` for beat.
    """

    enabled: bool
    port: int | None
    address: str
    stuck_after: float = DEFAULT_STUCK_AFTER
    """Seconds a loop may stand still before ``/healthz`` says the process is stuck."""


@dataclass(frozen=True)
class BeatSettings:
    """``leader_beat_*``: the wrapped scheduler, standby mode and missed-slot policies."""

    scheduler: str
    standby: Literal["auto", "reserve", "idle"]
    missed: Mapping[str, str | float]
    missed_default: str | float

    def missed_policy(self, entry_name: str) -> str | float:
        """``"once"``, ``"skip"`` or a catch-up window in seconds for *entry_name*."""
        return self.missed.get(entry_name, self.missed_default)

    def catch_up_window(self, entry_name: str) -> float:
        """How old a missed slot of *entry_name* may be and still be sent at a takeover, seconds.

        ``"once"`` is no limit (infinity), ``"skip"`` is 0 (never sent).
        """
        policy = self.missed_policy(entry_name)
        if policy == "once":
            return math.inf
        if policy == "skip":
            return 0.0
        return float(policy)


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

    @property
    def masked_backend_url(self) -> str:
        """The store URL with secrets masked, safe to print."""
        return mask_url(self.backend_url)


def _number(conf: Mapping[str, Any], key: str, default: float | None) -> float | None:
    return seconds(conf, key, default)


def _choice(conf: Mapping[str, Any], key: str, allowed: tuple[str, ...], default: str) -> str:
    value = conf.get(key)
    if value is None or value == "":
        return default
    if value not in allowed:
        raise ConfigurationError(f"{key}={value!r} is not allowed: use one of {', '.join(allowed)}")
    return str(value)


@_spelled_as_given
def metrics_settings(
    conf: Mapping[str, Any], port_key: str = "leader_metrics_port"
) -> MetricsSettings:
    """The validated metrics and health settings of *conf*; the port from *port_key*."""
    port = conf.get(port_key)
    if port in (None, "", 0):
        port_number = None
    else:
        try:
            port_number = int(port)
        except (TypeError, ValueError):
            port_number = -1
        if not 1 <= port_number <= _MAX_PORT or isinstance(port, bool):
            raise ConfigurationError(
                f"{port_key}={port!r} is not allowed: it must be a TCP port number, 1..65535"
            )
    address = conf.get("leader_metrics_address") or DEFAULT_METRICS_ADDRESS
    if not isinstance(address, str):
        raise ConfigurationError(
            f"leader_metrics_address={address!r} is not allowed: it must be a host address"
        )
    flag = conf.get("leader_metrics")
    if flag is not None and not isinstance(flag, bool):
        # "no" or "0" from an environment would be truthy: only a real bool is clear.
        raise ConfigurationError(
            f"leader_metrics={flag!r} is not allowed: it must be True or False"
        )
    enabled = bool(flag) or port_number is not None
    stuck_after = _number(conf, "leader_health_stuck_after", DEFAULT_STUCK_AFTER)
    assert stuck_after is not None
    if stuck_after <= 0:
        raise ConfigurationError(
            f"leader_health_stuck_after={stuck_after:g} is not allowed: it must be a number "
            "of seconds > 0"
        )
    return MetricsSettings(
        enabled=enabled, port=port_number, address=address, stuck_after=stuck_after
    )


@_spelled_as_given
def beat_settings(conf: Mapping[str, Any]) -> BeatSettings:
    """The validated ``leader_beat_*`` settings of *conf*."""
    scheduler = conf.get("leader_beat_scheduler") or DEFAULT_BEAT_SCHEDULER
    if not isinstance(scheduler, str):
        raise ConfigurationError(
            f"leader_beat_scheduler={scheduler!r} is not allowed: name a scheduler class "
            "as 'module:Class'"
        )
    standby = _choice(conf, "leader_beat_standby", STANDBY_MODES, "auto")
    given_default = conf.get("leader_beat_missed_default")
    default = (
        "once"
        if given_default is None or given_default == ""
        else _missed_policy("leader_beat_missed_default", given_default)
    )
    missed = conf.get("leader_beat_missed") or {}
    if not isinstance(missed, Mapping):
        raise ConfigurationError(
            f"leader_beat_missed={missed!r} is not allowed: it must be a dict of entry "
            f"name to {_MISSED_ALLOWED}"
        )
    policies = {
        str(entry): _missed_policy(f"leader_beat_missed[{entry!r}]", policy)
        for entry, policy in missed.items()
    }
    return BeatSettings(
        scheduler=scheduler,
        standby=standby,  # type: ignore[arg-type]
        missed=policies,
        missed_default=default,
    )


_MISSED_ALLOWED = f"one of {', '.join(MISSED_POLICIES)} or a catch-up window in seconds (>= 0)"


def _missed_policy(key: str, value: Any) -> str | float:
    """A missed-slot policy as given: ``"once"``, ``"skip"`` or a window in seconds."""
    if value in MISSED_POLICIES:
        return str(value)
    window: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        window = float(value)
    elif isinstance(value, str):  # from an environment variable: "3600"
        with contextlib.suppress(ValueError):
            window = float(value)
    if window is not None and math.isfinite(window) and window >= 0:
        return window
    raise ConfigurationError(f"{key}={value!r} is not allowed: use {_MISSED_ALLOWED}")


@_spelled_as_given
def beat_unled(conf: Mapping[str, Any]) -> bool:
    """``leader_beat_unled``: True lets a beat run a scheduler other than LeaderScheduler.

    Only a real bool: "no" or "0" from an environment would be truthy.
    """
    value = conf.get("leader_beat_unled")
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ConfigurationError(
            f"leader_beat_unled={value!r} is not allowed: it must be True or False"
        )
    return value


#: What an election may be called (``@leader_only(election=...)``, ``leader_elections``).
ELECTION_NAME = re.compile(r"[A-Za-z0-9_-]+")
#: Election names taken by celery-leader itself: ``beat`` is beat's own election.
RESERVED_ELECTIONS = frozenset({"beat"})


def check_election_name(name: object, where: str) -> str:
    """*name* when it may name an election; else a :class:`ConfigurationError` naming *where*."""
    if not isinstance(name, str) or not ELECTION_NAME.fullmatch(name):
        raise ConfigurationError(
            f"{where}={name!r} is not allowed: an election name is a non-empty string of "
            "letters, digits, '-' and '_'"
        )
    if name in RESERVED_ELECTIONS:
        raise ConfigurationError(
            f"{where}={name!r} is not allowed: {name!r} is reserved (beat's own election)"
        )
    return name


@_spelled_as_given
def leader_task_routes(conf: Mapping[str, Any]) -> tuple[tuple[str, str | None], ...]:
    """``leader_tasks``: (pattern, election) pairs for leader-only tasks sent by name.

    A list (or one string) names patterns of the default election (None); a
    mapping ``{pattern: election}`` names each pattern's election (None or
    ``""`` for the default one). A single string is one pattern, never a
    sequence of one-letter patterns.
    """
    value = conf.get("leader_tasks") or ()
    if isinstance(value, Mapping):
        pairs: list[tuple[object, object]] = list(value.items())
    elif isinstance(value, str):
        pairs = [(value, None)]
    else:
        try:
            pairs = [(pattern, None) for pattern in value]
        except TypeError:
            pairs = [(None, None)]
    if not all(isinstance(p, str) and p for p, _ in pairs):
        raise ConfigurationError(
            f"leader_tasks={value!r} is not allowed: it must be a list of task names or "
            "glob patterns, or a mapping {pattern: election}"
        )
    return tuple(
        (str(pattern), check_election_name(election, f"leader_tasks[{pattern!r}]"))
        if election
        else (str(pattern), None)
        for pattern, election in pairs
    )


def leader_task_patterns(conf: Mapping[str, Any]) -> tuple[str, ...]:
    """``leader_tasks``: the names or glob patterns, whatever their election."""
    return tuple(pattern for pattern, _ in leader_task_routes(conf))


def _election_list(conf: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = conf.get(key) or ()
    if isinstance(value, str):
        value = (value,)
    try:
        names = tuple(value)
    except TypeError:
        raise ConfigurationError(
            f"{key}={value!r} is not allowed: it must be a list of election names"
        ) from None
    return tuple(dict.fromkeys(check_election_name(name, key) for name in names))


@_spelled_as_given
def election_choice(conf: Mapping[str, Any]) -> ElectionChoice:
    """``leader_elections``, ``leader_elections_exclude`` and ``leader_balance``, validated."""
    balance = conf.get("leader_balance", True)
    if not isinstance(balance, bool):
        raise ConfigurationError(
            f"leader_balance={balance!r} is not allowed: it must be True or False"
        )
    return ElectionChoice(
        extra=_election_list(conf, "leader_elections"),
        excluded=frozenset(_election_list(conf, "leader_elections_exclude")),
        balance=balance,
    )


@dataclass(frozen=True)
class ElectionChoice:
    """Which named elections a worker competes in, besides those its tasks name."""

    extra: tuple[str, ...] = ()
    """``leader_elections``: elections whose tasks this worker may not import."""
    excluded: frozenset[str] = frozenset()
    """``leader_elections_exclude``: elections this worker never leads."""
    balance: bool = True
    """``leader_balance``: spread the elections over the workers."""

    def elections(self, from_tasks: Iterable[str | None]) -> tuple[str | None, ...]:
        """The elections to compete in: None (the default one) first, then named ones sorted."""
        named = {name for name in (*from_tasks, *self.extra) if name is not None}
        return (None, *sorted(named - self.excluded))


def _sentinel_from_broker(
    conf: Mapping[str, Any], url: str, given: Mapping[str, Any]
) -> dict[str, Any]:
    """A Sentinel store's primary name and sentinel options, from the broker's.

    Taken from ``broker_transport_options`` when not set on their own, as
    Celery's Sentinel broker reads them.
    """
    if urlsplit(url).scheme != "sentinel":
        return {}
    # Only for the broker's own sentinels: another deployment's name and password would
    # be wrong, and the password must not travel to sentinels it was not meant for.
    broker = conf.get("broker_url") or ""
    if not isinstance(broker, str) or _sentinel_hosts(broker) != _sentinel_hosts(url):
        return {}
    transport = conf.get("broker_transport_options") or {}
    if not isinstance(transport, Mapping):
        return {}
    found: dict[str, Any] = {}
    if "leader_sentinel_master_name" not in given and transport.get("master_name"):
        found["leader_sentinel_master_name"] = transport["master_name"]
    if "leader_sentinel_kwargs" not in given and transport.get("sentinel_kwargs"):
        found["leader_sentinel_kwargs"] = transport["sentinel_kwargs"]
    return found


def _sentinel_hosts(url: str) -> frozenset[tuple[str, int]] | None:
    """The sentinels a ``sentinel://`` URL lists; None for any other URL or a bad one."""
    if urlsplit(url).scheme != "sentinel":
        return None
    try:
        return frozenset(parse_sentinel_url(url).sentinels)
    except ConfigurationError:
        return None


@_spelled_as_given
def default_backend_url(conf: Mapping[str, Any]) -> str:
    """``leader_backend_url``, else the broker URL when it is Redis."""
    url = conf.get("leader_backend_url")
    if url:
        if not isinstance(url, str):
            raise ConfigurationError(
                f"leader_backend_url={type(url).__name__} is not allowed: it must be a URL string"
            )
        return url
    broker = conf.get("broker_url") or ""
    if isinstance(broker, (list, tuple)):
        broker = broker[0] if broker else ""
    broker = str(broker)
    if urlsplit(broker).scheme in _REDIS_SCHEMES:
        return broker
    raise ConfigurationError(
        ERR_NO_BACKEND.format(broker=mask_url(broker) or "not set", urls=shared_store_urls())
    )


@_spelled_as_given
def default_name(conf: Mapping[str, Any], main: str | None) -> str:
    """``leader_name``, else the app's main module name, else ``"celery"``."""
    name = conf.get("leader_name") or main or "celery"
    if not isinstance(name, str) or not name.strip():
        raise ConfigurationError(
            f"leader_name={name!r} is not allowed: it must be a non-empty string"
        )
    return name


@_spelled_as_given
def default_queue(conf: Mapping[str, Any], main: str | None) -> str:
    """``leader_queue``, else ``"<leader_name>.leader"``."""
    queue = conf.get("leader_queue")
    if queue is None or queue == "":
        return f"{default_name(conf, main)}.leader"
    if not isinstance(queue, str) or not queue.strip():
        raise ConfigurationError(
            f"leader_queue={queue!r} is not allowed: it must be a non-empty queue name"
        )
    return queue


@dataclass(frozen=True)
class ElectionNames:
    """The names of an app's elections: the one place a lease name or a queue is derived.

    ``leader`` is the workers' election (``leader_name``, else the app's main
    module, else ``"celery"``), ``queue`` its leader queue (``leader_queue``,
    else ``"<leader>.leader"``) and ``beat`` beat's own election
    (``"<leader>.beat"``).
    """

    leader: str
    queue: str

    @property
    def beat(self) -> str:
        """Beat's election: the workers' name with :data:`BEAT_SUFFIX`."""
        return self.leader + BEAT_SUFFIX

    @property
    def members(self) -> str:
        """The group the workers announce themselves in, for balancing named elections."""
        return f"{self.leader}.members"

    def lease_of(self, election: str | None) -> str:
        """The lease name of *election* (None: the default election): ``"<leader>.<election>"``."""
        return self.leader if election is None else f"{self.leader}.{election}"

    def queue_of(self, election: str | None) -> str:
        """The leader queue of *election* (None: the default): ``"<leader>.<name>.leader"``."""
        return self.queue if election is None else f"{self.leader}.{election}.leader"

    def election_of_queue(self, queue: str) -> tuple[bool, str | None]:
        """``(True, election)`` for the leader queue of *election*, else ``(False, None)``."""
        if queue == self.queue:
            return True, None
        prefix, suffix = f"{self.leader}.", ".leader"
        if queue.startswith(prefix) and queue.endswith(suffix):
            election = queue[len(prefix) : -len(suffix)]
            if ELECTION_NAME.fullmatch(election) and election not in RESERVED_ELECTIONS:
                return True, election
        return False, None


def step_down_slot(election: str) -> str:
    """The lease name beside *election* through which a step-down is asked of its holder.

    Used for beat's election, which listens to no broker queue.
    """
    return f"{election}.step-down"


def schedule_slot(election: str) -> str:
    """The lease name beside beat's *election* that holds its schedule controls.

    ``celery leader schedule pause|resume|run`` write there; the beat leader
    reads it (see :mod:`celery_leader.beat.controls`).
    """
    return f"{election}.schedule"


@_spelled_as_given
def election_names(conf: Mapping[str, Any], main: str | None) -> ElectionNames:
    """The validated :class:`ElectionNames` of *conf*; needs no store setting.

    A process that only sends (a web app) reads these, and nothing else,
    so a client whose broker is not Redis sends without ``leader_backend_url``.
    """
    return ElectionNames(leader=default_name(conf, main), queue=default_queue(conf, main))


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

    The worker's bootstep, beat's scheduler and the CLI each build one (through
    :func:`app_settings`) and hand it down; the task side reads the same object
    for routing. Values shared by every election (the store, metrics, grace)
    sit here once; what differs per election is an entry of :attr:`elections`,
    keyed by election name.
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
    choice: ElectionChoice = ElectionChoice()
    """Which named elections a worker competes in (``leader_elections``, ...)."""
    task_routes: tuple[tuple[str, str | None], ...] = ()
    """``leader_tasks`` as (pattern, election) pairs."""

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
        )

    def for_named(self, election: str | None) -> LeaderSettings:
        """The settings of the workers' *election* (None: the default one).

        A named election has the default one's timing, its own lease name and
        its own leader queue (see :class:`ElectionNames`).
        """
        if election is None:
            return self.worker
        default = self.worker
        return replace(
            default,
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


@_spelled_as_given
def load_app_settings(conf: Mapping[str, Any], main: str | None = None) -> AppSettings:
    """Read and validate every ``leader_*`` key of *conf* (an app's ``conf``)."""
    url = default_backend_url(conf)
    cls = store_class(url)
    low, high = cls.ttl_range
    ttl = _number(conf, "leader_lease_ttl", None)
    if ttl is None:
        ttl = max(DEFAULT_TTL, low or 0.0)
    if ttl > 0 and ((low is not None and ttl < low) or (high is not None and ttl > high)):
        scheme = urlsplit(url).scheme
        allowed = f"{'' if low is None else f'{low:g}'}..{'' if high is None else f'{high:g}'}"
        raise ConfigurationError(
            f"leader_lease_ttl={ttl:g} is not allowed with the {scheme}:// store: "
            f"allowed range is {allowed} seconds"
        )
    timing = LeaseTiming.create(
        ttl,
        _number(conf, "leader_renew_interval", None),
        _number(conf, "leader_lease_margin", None),
        _number(conf, "leader_store_timeout", None),
        renew_fraction=cls.default_renew_fraction,
    )
    names = election_names(conf, main)
    given = {
        key: conf.get(key)
        for key in (
            "leader_azure_connection_string",
            "leader_azure_account_url",
            "leader_azure_watch_interval",
            "leader_sentinel_master_name",
            "leader_sentinel_kwargs",
        )
        if conf.get(key) is not None
    }
    given.update(_sentinel_from_broker(conf, url, given))
    # Each store checks its own keys (LeaseStoreClass.validate_options), also keys of a
    # store other than the one in use: a bad value is reported before it is ever used.
    validate_store_options(url, given)
    options = {key: value for key, value in given.items() if value}
    if "leader_azure_connection_string" not in options and os.environ.get(
        "AZURE_STORAGE_CONNECTION_STRING"
    ):
        options["leader_azure_connection_string"] = os.environ["AZURE_STORAGE_CONNECTION_STRING"]
    stop_grace = _number(conf, "leader_stop_grace", timing.ttl)
    assert stop_grace is not None
    if stop_grace < 0:
        raise ConfigurationError(
            f"leader_stop_grace={stop_grace:g} is not allowed: it must be a number of seconds >= 0"
        )
    # Every key is checked at start, also those only beat reads: a worker may run beat (-B).
    settings = AppSettings(
        backend_url=url,
        store_options=options,
        stop_grace=stop_grace,
        metrics=metrics_settings(conf),
        beat_metrics=metrics_settings(conf, "leader_beat_metrics_port"),
        beat=beat_settings(conf),
        names=names,
        elections={
            names.leader: ElectionSettings(names.leader, names.queue, timing),
            names.beat: ElectionSettings(names.beat, None, timing),
        },
        beat_unled=beat_unled(conf),
        choice=election_choice(conf),
        task_routes=leader_task_routes(conf),
    )
    _warn_unknown_keys(conf)
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


def _warn_unknown_keys(conf: Mapping[str, Any]) -> None:
    """Log one warning per ``leader_*`` key celery-leader does not read (a typo keeps a default)."""
    prefix = str(getattr(conf, "prefix", None) or "").lower()
    for given in sorted(_own_keys(conf), key=str):
        key = str(given).lower()
        if prefix:
            if not key.startswith(prefix):
                continue  # another setting of the project (Django's), not Celery's
            key = key[len(prefix) :]
        if not key.startswith("leader_") or key in KNOWN_KEYS:
            continue
        close = difflib.get_close_matches(key, KNOWN_KEYS, n=1)
        meant = f"{prefix}{close[0]}".upper() if close and prefix else (close or [""])[0]
        hint = f"; did you mean {meant}?" if meant else ""
        if (given, hint) in _warned:
            continue  # settings are read at every start (beat builds its scheduler twice)
        _warned.add((given, hint))
        logger.warning("celery-leader: %s is not a celery-leader setting%s", given, hint)


#: Unknown keys warned about in this process: each is named once.
_warned: set[tuple[object, str]] = set()


#: Where an app keeps the settings its process read (see :func:`app_settings`).
_SETTINGS_ATTR = "_celery_leader_settings"
_NAMES_ATTR = "_celery_leader_names"


def app_settings(app: Any, *, fresh: bool = False) -> AppSettings:
    """The :class:`AppSettings` of *app*, kept on the app for the rest of the process.

    The worker step, beat and the CLI read them *fresh* when they start, and
    hand them down; routing then reads the same object. A ``leader_*`` key
    changed after that start is not seen until the next one (a test that
    starts a new worker with other settings gets them).
    """
    settings = None if fresh else getattr(app, _SETTINGS_ATTR, None)
    if settings is None:
        settings = load_app_settings(app.conf, getattr(app, "main", None))
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
