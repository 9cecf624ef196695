"""Pick a lease store class by URL scheme, through entry points."""

from __future__ import annotations

from collections.abc import Mapping
from importlib import import_module
from importlib.metadata import entry_points
from typing import Any
from urllib.parse import urlsplit

from celery_leader._masking import mask_url
from celery_leader.exceptions import ConfigurationError
from celery_leader.stores.base import LeaseStore

ENTRY_POINT_GROUP = "celery_leader.stores"

#: The stores this package ships, used as well when it runs from a source tree
#: whose distribution metadata (and so its entry points) is not installed.
BUILTIN_STORES: Mapping[str, str] = {
    "redis": "celery_leader.stores.redis:RedisLeaseStore",
    "rediss": "celery_leader.stores.redis:RedisLeaseStore",
    "unix": "celery_leader.stores.redis:RedisLeaseStore",
    "sqlite": "celery_leader.stores.sqlite:SQLiteLeaseStore",
    "azureblob": "celery_leader.stores.azure_blob:AzureBlobLeaseStore",
    "memory": "celery_leader.stores.memory:MemoryLeaseStore",
}


def _store_paths() -> dict[str, str]:
    paths = dict(BUILTIN_STORES)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        paths[ep.name] = ep.value
    return paths


#: Schemes for tests in one process; never offered in error hints.
TEST_ONLY_SCHEMES = frozenset({"memory"})


def available_schemes() -> list[str]:
    """The URL schemes a store is registered for, sorted."""
    return sorted(_store_paths())


def _load(path: str) -> Any:
    module_name, _, attr = path.partition(":")
    return getattr(import_module(module_name), attr)


def store_class(url: str) -> Any:
    """The store class registered for *url*'s scheme.

    Raises :class:`ConfigurationError` naming ``leader_backend_url`` and the
    known schemes when none is registered.
    """
    scheme = urlsplit(url).scheme.lower()
    paths = _store_paths()
    if scheme not in paths:
        raise ConfigurationError(
            f"leader_backend_url={mask_url(url)!r} is not allowed: unknown scheme "
            f"{scheme!r}; use one of "
            f"{', '.join(s + '://' for s in sorted(paths) if s not in TEST_ONLY_SCHEMES)}"
        )
    try:
        return _load(paths[scheme])
    except ImportError as exc:
        hint = " (pip install 'celery-leader[azure]')" if scheme == "azureblob" else ""
        raise ConfigurationError(
            f"leader_backend_url={mask_url(url)!r}: the {scheme}:// store cannot be "
            f"loaded: {exc}{hint}"
        ) from None


def open_store(url: str, *, timeout: float, options: Mapping[str, Any] | None = None) -> LeaseStore:
    """Open the store for *url*; every call on it is bounded by *timeout* seconds.

    *options* carries store-specific settings (e.g. Azure credentials).
    Opening connects lazily: an unreachable store raises on first use, not here.
    """
    cls = store_class(url)
    store: LeaseStore = cls.from_url(url, timeout=timeout, options=dict(options or {}))
    return store
