"""Leader election for Celery: leader-only tasks, a single active beat, fencing tokens.

The package, floor by floor; each imports only from the floors above it
(``tests/package/test_layers.py`` checks the rules marked *checked*):

* ``stores/``: lease stores, I/O only, one module per store chosen by URL
  scheme; the token and hold-off rules (``stores/rules.py``); each store
  declares its own settings. *Checked*: imports only ``exceptions``,
  ``clock``, ``_masking``, ``_values``, ``_catalogue`` (what a setting is);
  no Celery.
* ``lease/``: one lease, no Celery: :class:`~celery_leader.lease.LeaseManager`,
  its timing and its bounded store calls. *Checked*: above stores only.
* ``elections/``: the elections a process takes part in, no Celery: the
  ``Election`` unit (manager, shared-memory slot, listener), the group of a
  process's elections, the shared lease slots, the run table and the
  liveness of the process's loop (read by the lease thread and the health
  probe). *Checked*: above lease and stores only.
* ``term_end/``: what happens to leader work when a term ends: the policy,
  the sequence in the worker (``in_worker``), the run's side (``in_run``)
  and the watchdog. *Checked*: above elections only; never the task side,
  the worker or beat.
* ``tasks/``: the task side: ``@leader_only``, ``LeaderTask`` (a run under
  its election's term), which tasks are leader-only, routing, and
  ``lease_lost()``/``check_leadership()`` inside a run. *Checked*: never
  ``worker/`` or beat.
* ``worker/`` (bootsteps, the coordinator's wiring, the gate, remote
  control) and ``beat/`` (the scheduler, split by job: its election,
  taking a term over, pauses and run-now, step-down requests; its state;
  the refusal of an unled beat).
  *Checked*: beat never imports ``worker/`` or the task side.
* ``observe/``: metrics, health (one verdict for worker and beat), their
  HTTP endpoint and the one call that turns them on. *Checked*: never
  the worker, beat or the task side.
* ``settings/``: the catalogue of ``leader_*`` settings (one entry each;
  the stores declare theirs), read once into settings objects; the one
  place that reads ``leader_*`` keys outside the stores, and that derives a
  lease name or a queue.
* ``cli/``, ``demo/``, ``simulation/``, ``pytest_plugin.py``,
  ``testing.py``: tools on top of everything.
"""

from __future__ import annotations

from celery_leader import signals
from celery_leader.beat import unled as _beat_unled  # noqa: F401 - connects the unled beat's refusal
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
from celery_leader.lease.timing import LeaseTiming
from celery_leader.settings import LeaderSettings, load_settings
from celery_leader.stores import open_store
from celery_leader.tasks import LeaderTask, leader_only
from celery_leader.tasks import message_id as _message_id  # noqa: F401 - stamps each message
from celery_leader.tasks.runtime import check_leadership, current_token, lease_lost
from celery_leader.term_end import OnLoss
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
