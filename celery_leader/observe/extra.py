"""Whether the ``prometheus`` extra is installed, asked once at worker and beat start.

Metrics are optional: their client library comes with
``pip install 'celery-leader[prometheus]'``. A process whose settings turn
metrics on without it stops at start with one line naming the setting that
asked for them and the extra to install, as a store whose extra is missing
does, instead of a traceback from deep inside the start-up.
"""

from __future__ import annotations

import importlib

from celery_leader.exceptions import ConfigurationError
from celery_leader.settings import MetricsSettings

#: The module the extra installs.
CLIENT = "prometheus_client"
#: Said when metrics are on and the client cannot be imported; formatted with the setting.
ERR_NO_PROMETHEUS = (
    "{asked_by}: metrics need the prometheus extra: pip install 'celery-leader[prometheus]'"
)


def check_metrics_extra(metrics: MetricsSettings) -> None:
    """Raise :class:`ConfigurationError` when *metrics* are on and the client is not importable.

    Imports the client (the import is what start-up does next anyway), so a
    broken install counts as a missing one. Does nothing when metrics are off.
    """
    if not metrics.enabled:
        return
    try:
        importlib.import_module(CLIENT)
    except ImportError:
        raise ConfigurationError(ERR_NO_PROMETHEUS.format(asked_by=metrics.asked_by)) from None
