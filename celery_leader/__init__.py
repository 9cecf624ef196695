"""Leader election for Celery: leader-only tasks, a single active beat, fencing tokens."""

from __future__ import annotations

from celery_leader import beat_unled as _beat_unled  # noqa: F401 - connects a beat_init warning
from celery_leader import signals
from celery_leader.exceptions import (
    ConfigurationError,
    LeaseError,
    LeaseLost,
    StoreAuthError,
    StoreError,
)
from celery_leader.install import install
from celery_leader.lease import (
    EventKind,
    LeaseEvent,
    LeaseManager,
    LeaseState,
    LossReason,
    Role,
    Term,
)
from celery_leader.runtime import check_leadership, current_token, lease_lost
from celery_leader.settings import LeaderSettings, load_settings
from celery_leader.stores import open_store
from celery_leader.tasks import LeaderTask, leader_only
from celery_leader.term_end import OnLoss
from celery_leader.timing import LeaseTiming
from celery_leader.worker.bootsteps import LeaderElection

# The one place the version is written: pyproject.toml reads it from here.
__version__ = "0.1.0.dev0"

__all__ = [
    "ConfigurationError",
    "EventKind",
    "LeaderElection",
    "LeaderSettings",
    "LeaderTask",
    "LeaseError",
    "LeaseEvent",
    "LeaseLost",
    "LeaseManager",
    "LeaseState",
    "LeaseTiming",
    "LossReason",
    "OnLoss",
    "Role",
    "StoreAuthError",
    "StoreError",
    "Term",
    "__version__",
    "check_leadership",
    "current_token",
    "install",
    "leader_only",
    "lease_lost",
    "load_settings",
    "open_store",
    "signals",
]
