"""The ``leader_*`` settings of a Celery app: one catalogue entry each, read once per process.

Every setting is declared once, as a catalogue entry that carries its name,
Django spelling, default, allowed values, description, owner and parser
(:mod:`celery_leader.settings.catalogue`): the election's, beat's and the
metrics' here, each store's in its own module. Only this package and the
store modules read ``leader_*`` keys from ``app.conf``; everything else asks
the settings objects built here. Every problem is reported at start as one
:class:`~celery_leader.exceptions.ConfigurationError` line that names the
setting as the user wrote it, the value given and what is allowed.

Modules, one concern each:

* ``catalogue``: the entries, gathered; ``reference``: the Markdown page of them;
* ``names``: election names, lease names and queues (the one place they are
  derived); ``timing``: the lease's timing; ``store``: the store URL and the
  store's options; ``elections``: named elections and ``leader_tasks``;
  ``beat`` and ``metrics``: theirs;
* ``app``: the settings objects of a process; ``checks``: warnings about
  keys never read; ``spelling``: names as the user wrote them (Django's
  ``CELERY_LEADER_*``); ``parsing``: the value parsers.
"""

from __future__ import annotations

# isort: off
# The election's settings are declared in this order, which the settings reference keeps:
# where the lease lives, what the election is called, its timing (the rest follows).
import celery_leader.settings.store
import celery_leader.settings.names
import celery_leader.settings.timing  # noqa: F401 - imported for its declarations

# isort: on
from celery_leader.settings.app import (
    AppSettings,
    ElectionSettings,
    LeaderSettings,
    app_settings,
    load_app_settings,
    load_settings,
    names_for_app,
    settings_for_app,
)
from celery_leader.settings.beat import (
    DEFAULT_BEAT_SCHEDULER,
    MISSED_POLICIES,
    STANDBY_MODES,
    BeatSettings,
    beat_settings,
    beat_unled,
)
from celery_leader.settings.catalogue import entries, given_settings, known_names
from celery_leader.settings.elections import (
    ElectionChoice,
    election_choice,
    leader_task_patterns,
    leader_task_routes,
)
from celery_leader.settings.metrics import (
    DEFAULT_METRICS_ADDRESS,
    DEFAULT_STUCK_AFTER,
    MetricsSettings,
    metrics_settings,
)
from celery_leader.settings.names import (
    BEAT_SUFFIX,
    ELECTION_NAME,
    RESERVED_ELECTIONS,
    ElectionNames,
    check_election_name,
    default_name,
    default_queue,
    election_names,
    schedule_slot,
    step_down_slot,
)
from celery_leader.settings.spelling import spelled, spelled_in
from celery_leader.settings.store import ERR_NO_BACKEND, default_backend_url, store_options
from celery_leader.settings.timing import DEFAULT_TTL

__all__ = [
    "BEAT_SUFFIX",
    "DEFAULT_BEAT_SCHEDULER",
    "DEFAULT_METRICS_ADDRESS",
    "DEFAULT_STUCK_AFTER",
    "DEFAULT_TTL",
    "ELECTION_NAME",
    "ERR_NO_BACKEND",
    "MISSED_POLICIES",
    "RESERVED_ELECTIONS",
    "STANDBY_MODES",
    "AppSettings",
    "BeatSettings",
    "ElectionChoice",
    "ElectionNames",
    "ElectionSettings",
    "LeaderSettings",
    "MetricsSettings",
    "app_settings",
    "beat_settings",
    "beat_unled",
    "check_election_name",
    "default_backend_url",
    "default_name",
    "default_queue",
    "election_choice",
    "election_names",
    "entries",
    "given_settings",
    "known_names",
    "leader_task_patterns",
    "leader_task_routes",
    "load_app_settings",
    "load_settings",
    "metrics_settings",
    "names_for_app",
    "schedule_slot",
    "settings_for_app",
    "spelled",
    "spelled_in",
    "step_down_slot",
    "store_options",
]
