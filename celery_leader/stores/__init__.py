"""Lease stores, chosen by the scheme of ``leader_backend_url``.

Stores are found through the ``celery_leader.stores`` entry-point group, so a
third-party package can add one::

    [project.entry-points."celery_leader.stores"]
    etcd = "mypkg.store:EtcdLeaseStore"

A store class is called as ``cls.from_url(url, timeout=..., options=...)`` and
declares what :class:`~celery_leader.stores.base.LeaseStoreClass` lists (its
schemes, extra, ttl range, renew fraction, setting keys with their
``validate_options``, and capabilities). A store's settings are declared in
its module as catalogue entries (:class:`celery_leader._catalogue.Setting`),
documented there and listed in the settings reference under the store. Its
acquire applies the rules of :mod:`celery_leader.stores.rules`;
:mod:`celery_leader.stores.watch` runs its release watch.
"""

from __future__ import annotations

from celery_leader.stores.base import (
    AcquireRequest,
    AcquireResult,
    BatchCalls,
    BrokerOptions,
    Capability,
    Holder,
    LeaseRecord,
    LeaseStore,
    LeaseStoreClass,
    Lifeline,
    LifelineEndedError,
    LifelineReading,
    Lifelines,
    MissingExtraError,
    NullWatch,
    Presence,
    TokenHistory,
    Watch,
)
from celery_leader.stores.registry import available_schemes, open_store

__all__ = [
    "AcquireRequest",
    "AcquireResult",
    "BatchCalls",
    "BrokerOptions",
    "Capability",
    "Holder",
    "LeaseRecord",
    "LeaseStore",
    "LeaseStoreClass",
    "Lifeline",
    "LifelineEndedError",
    "LifelineReading",
    "Lifelines",
    "MissingExtraError",
    "NullWatch",
    "Presence",
    "TokenHistory",
    "Watch",
    "available_schemes",
    "open_store",
]
