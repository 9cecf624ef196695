"""One lease, no Celery: the lease manager, its timing and its bounded store calls.

* :mod:`~celery_leader.lease.manager`: :class:`LeaseManager`, one election's
  lease on one daemon thread, and the events it sends;
* :mod:`~celery_leader.lease.timing`: :class:`LeaseTiming`, ttl, renew
  interval, margin and backoff, checked together;
* :mod:`~celery_leader.lease.bounded`: store calls bounded in wall time.

``celery_leader.lease`` keeps every name it had as a module.
"""

from celery_leader.lease.manager import (
    EventKind,
    LeaseEvent,
    LeaseManager,
    LeaseState,
    Listener,
    LossReason,
    Observation,
    ObservationKind,
    Observer,
    Role,
    StoreCall,
    Term,
)
from celery_leader.lease.timing import LeaseTiming

__all__ = [
    "EventKind",
    "LeaseEvent",
    "LeaseManager",
    "LeaseState",
    "LeaseTiming",
    "Listener",
    "LossReason",
    "Observation",
    "ObservationKind",
    "Observer",
    "Role",
    "StoreCall",
    "Term",
]
