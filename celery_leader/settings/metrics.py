"""Metrics and health settings: Prometheus export, the HTTP port, its address, the stuck bound."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from celery_leader._catalogue import Owner, Setting, register
from celery_leader.exceptions import ConfigurationError
from celery_leader.settings.parsing import positive_seconds, tcp_port, true_or_false
from celery_leader.settings.spelling import spelled, spelled_as_given

#: Where the metrics port listens unless ``leader_metrics_address`` says otherwise.
DEFAULT_METRICS_ADDRESS = "0.0.0.0"  # noqa: S104 - scraped from outside the host
#: Seconds a loop may stand still before the process counts as stuck, unless
#: ``leader_health_stuck_after`` says otherwise.
DEFAULT_STUCK_AFTER = 60.0


def _address(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigurationError(f"{name}={value!r} is not allowed: it must be a host address")
    return value


METRICS: Setting[bool] = Setting(
    "leader_metrics",
    Owner.METRICS,
    default="`False` (`True` when a metrics port is set)",
    allowed="`True`, `False`",
    description=(
        "Export Prometheus metrics in the default registry (the `prometheus` extra installs "
        "the client)."
    ),
    parse=true_or_false,
)
METRICS_PORT: Setting[int | None] = Setting(
    "leader_metrics_port",
    Owner.METRICS,
    default="none (0 too means none)",
    allowed="a TCP port, 1..65535",
    description=(
        "Serve the worker's metrics on `GET /metrics` and its health on `GET /healthz` on "
        "this port. Workers on one host need a port each: give each its own with the "
        "environment variable or the worker option, which override this setting."
    ),
    parse=tcp_port,
    environment="CELERY_LEADER_METRICS_PORT",
    option="--leader-metrics-port",
)
METRICS_ADDRESS: Setting[str] = Setting(
    "leader_metrics_address",
    Owner.METRICS,
    default=f"`{DEFAULT_METRICS_ADDRESS}` (every interface)",
    allowed="a host address",
    description="The address the metrics ports (the worker's and beat's) listen on.",
    parse=_address,
)
BEAT_METRICS_PORT: Setting[int | None] = Setting(
    "leader_beat_metrics_port",
    Owner.METRICS,
    default="none (0 too means none)",
    allowed="a TCP port, 1..65535",
    description=(
        "Serve beat's metrics and health on this port, for a beat of its own or one embedded "
        "in a worker (`-B`): it may share a host with a worker. The environment variable "
        "overrides it for one beat."
    ),
    parse=tcp_port,
    environment="CELERY_LEADER_BEAT_METRICS_PORT",
)
HEALTH_STUCK_AFTER: Setting[float] = Setting(
    "leader_health_stuck_after",
    Owner.METRICS,
    default=f"{DEFAULT_STUCK_AFTER:g} seconds",
    allowed="a number of seconds > 0",
    description=(
        "How long the consumer's loop (beat's, for beat) may stand still, with no task "
        "holding it, before `/healthz` answers 503."
    ),
    parse=positive_seconds,
)
register(METRICS, METRICS_PORT, METRICS_ADDRESS, BEAT_METRICS_PORT, HEALTH_STUCK_AFTER)

#: The port settings by name: a worker's and beat's.
_PORTS = {setting.name: setting for setting in (METRICS_PORT, BEAT_METRICS_PORT)}


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
    port_from: str = METRICS_PORT.name
    """Where the port was given, as the user wrote it: the setting, the environment variable
    or the worker option (``CELERY_LEADER_METRICS_PORT``); messages about the port name it."""
    asked_by: str = f"{METRICS.name}=True"
    """The setting that turned metrics on, with its value (``leader_metrics_port=9100``):
    what a missing ``prometheus`` extra is reported against."""


@spelled_as_given
def metrics_settings(
    conf: Mapping[str, Any],
    port_key: str = METRICS_PORT.name,
    *,
    environ: Mapping[str, str] | None = None,
    options: Mapping[str, Any] | None = None,
) -> MetricsSettings:
    """The validated metrics and health settings of *conf*; the port from *port_key*.

    *port_key* is ``leader_metrics_port`` (a worker's) or
    ``leader_beat_metrics_port`` (beat's). This process's own port comes
    first: the worker option in *options* (a worker's keyword arguments),
    then the setting's environment variable in *environ* (``os.environ``
    unless given), then *conf*.
    """
    setting = _PORTS[port_key]
    port, given_as = setting.read_for_process(
        conf, os.environ if environ is None else environ, options or {}
    )
    address = METRICS_ADDRESS.read_or(conf, DEFAULT_METRICS_ADDRESS)
    enabled = METRICS.read_or(conf, False) or port is not None
    stuck_after = HEALTH_STUCK_AFTER.read_or(conf, DEFAULT_STUCK_AFTER)
    port_from = spelled(conf, given_as) if given_as == setting.name else given_as
    asked_by = f"{port_from}={port}" if port is not None else f"{METRICS.name}=True"
    return MetricsSettings(
        enabled=enabled,
        port=port,
        address=address,
        stuck_after=stuck_after,
        port_from=port_from,
        asked_by=asked_by,
    )
