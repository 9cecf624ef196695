"""The lease server's own limits, checked once at worker and beat start.

A store that offers :class:`~celery_leader.stores.base.ServerLimits` is asked
whether the server keeps a lease of the configured ttl as the store
documents (etcd grants at least its minimum TTL). A ttl it would keep longer
is a configuration error: the worker or beat stops at start with one line.
A server that cannot be reached at start is no configuration error (store
trouble never stops a worker): it is logged, and the store reports what the
server grants when it first grants a lease.
"""

from __future__ import annotations

import logging

from celery_leader._masking import mask_text
from celery_leader.exceptions import StoreError
from celery_leader.stores.base import LeaseStore, ServerLimits

logger = logging.getLogger(__name__)


def check_server_limits(store: LeaseStore, ttl: float) -> None:
    """Ask *store*'s server whether it keeps a lease of *ttl* seconds as documented.

    Raises :class:`~celery_leader.exceptions.ConfigurationError` (naming
    ``leader_lease_ttl``, the value and the smallest allowed) when it would
    not. Returns at once for a store without server limits, and after one
    logged warning when the server cannot be asked now.
    """
    if not isinstance(store, ServerLimits):
        return
    try:
        store.check_ttl(ttl)
    except StoreError as exc:
        logger.warning(
            "celery-leader: could not ask %s for its smallest lease ttl (%s); a ttl it "
            "raises is logged at the first acquire",
            store.url,
            mask_text(str(exc)),
        )
