"""The lease's timing settings: ttl, renewal, drift margin, store-call bound, stop grace.

The store in use bounds the ttl (its class declares ``ttl_range``) and sets
the default renew fraction; :class:`~celery_leader.lease.timing.LeaseTiming`
checks how the values fit together.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from celery_leader._catalogue import Owner, Setting, register
from celery_leader.exceptions import ConfigurationError
from celery_leader.lease.timing import LeaseTiming
from celery_leader.settings.parsing import non_negative_seconds, seconds_value
from celery_leader.stores.base import LeaseStoreClass

#: Lease length when ``leader_lease_ttl`` is not set, in seconds.
DEFAULT_TTL = 5.0

LEASE_TTL: Setting[float] = Setting(
    "leader_lease_ttl",
    Owner.ELECTION,
    default="5 seconds, or the store's lowest allowed ttl when that is higher (Azure: 15)",
    allowed=(
        "a number of seconds > 0, at least 4 x `leader_lease_margin` (0.2 with the default "
        "margin), within the store's range (Azure: 15..60; etcd: at least its minimum lease "
        "TTL, 2 s by default)"
    ),
    description=(
        "How long a lease lasts unless renewed. A leader that stops (killed, paused, cut off) "
        "is replaced within about this long; a leader keeps leading only while its renewals "
        "land within it."
    ),
    parse=seconds_value,
)
RENEW_INTERVAL: Setting[float] = Setting(
    "leader_renew_interval",
    Owner.ELECTION,
    default="ttl / 3 (Azure: ttl / 4)",
    allowed="a number of seconds > 0 and < ttl / 2",
    description=(
        "Seconds between renewals of a held lease, and between a follower's attempts to take "
        "a lease that is not released. Below half the ttl, so that a failed renewal is "
        "retried before the lease runs out."
    ),
    parse=seconds_value,
)
LEASE_MARGIN: Setting[float] = Setting(
    "leader_lease_margin",
    Owner.ELECTION,
    default="max(0.05, 2 % of ttl) seconds",
    allowed="a number of seconds >= 0 and <= ttl / 4",
    description=(
        "The allowance for clock-rate drift between a worker and the store: a holder counts "
        "its lease as ending this much before the store does."
    ),
    parse=seconds_value,
)
STORE_TIMEOUT: Setting[float] = Setting(
    "leader_store_timeout",
    Owner.ELECTION,
    default="min(renew interval / 2, 5) seconds",
    allowed="a number of seconds > 0 and < ttl - margin - renew interval",
    description=(
        "The bound on one store call, its whole wall time: a renewal is started only when it "
        "can end before the lease does."
    ),
    parse=seconds_value,
)
STOP_GRACE: Setting[float] = Setting(
    "leader_stop_grace",
    Owner.ELECTION,
    default="the lease ttl",
    allowed="a number of seconds >= 0",
    description=(
        "How long a step-down or a warm shutdown lets leader tasks stop before a prefork pool "
        "kills them."
    ),
    parse=non_negative_seconds,
)
register(LEASE_TTL, RENEW_INTERVAL, LEASE_MARGIN, STORE_TIMEOUT, STOP_GRACE)


def lease_timing(conf: Mapping[str, Any], url: str, store: LeaseStoreClass) -> LeaseTiming:
    """The validated timing of *conf* for the store of *url* (its class *store*)."""
    low, high = store.ttl_range
    ttl = LEASE_TTL.read_or(conf, max(DEFAULT_TTL, low or 0.0))
    if ttl > 0 and ((low is not None and ttl < low) or (high is not None and ttl > high)):
        scheme = urlsplit(url).scheme
        allowed = f"{'' if low is None else f'{low:g}'}..{'' if high is None else f'{high:g}'}"
        raise ConfigurationError(
            f"{LEASE_TTL.name}={ttl:g} is not allowed with the {scheme}:// store: "
            f"allowed range is {allowed} seconds"
        )
    return LeaseTiming.create(
        ttl,
        RENEW_INTERVAL.read(conf),
        LEASE_MARGIN.read(conf),
        STORE_TIMEOUT.read(conf),
        renew_fraction=store.default_renew_fraction,
    )


def stop_grace(conf: Mapping[str, Any], timing: LeaseTiming) -> float:
    """``leader_stop_grace``, else the lease ttl."""
    return STOP_GRACE.read_or(conf, timing.ttl)
