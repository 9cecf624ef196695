"""Pick a lease store class by URL scheme, through entry points.

Every message that names the stores is built from what the store classes
declare (:class:`~celery_leader.stores.base.LeaseStoreClass`), so a store
added through an entry point is named in them with no change here.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import import_module
from importlib.metadata import entry_points
from typing import Any
from urllib.parse import urlsplit

from celery_leader._masking import mask_url
from celery_leader.exceptions import ConfigurationError
from celery_leader.stores.base import LeaseStore, LeaseStoreClass, MissingExtraError

ENTRY_POINT_GROUP = "celery_leader.stores"

#: The stores this package ships, used as well when it runs from a source tree
#: whose distribution metadata (and so its entry points) is not installed.
BUILTIN_STORES: Mapping[str, str] = {
    "redis": "celery_leader.stores.redis:RedisLeaseStore",
    "rediss": "celery_leader.stores.redis:RedisLeaseStore",
    "unix": "celery_leader.stores.redis:RedisLeaseStore",
    "sentinel": "celery_leader.stores.sentinel:SentinelLeaseStore",
    "postgresql": "celery_leader.stores.postgres:PostgresLeaseStore",
    "postgres": "celery_leader.stores.postgres:PostgresLeaseStore",
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


#: What a store class declares (celery_leader.stores.base.LeaseStoreClass).
_DECLARED = (
    "schemes",
    "extra",
    "ttl_range",
    "default_renew_fraction",
    "option_keys",
    "capabilities",
    "validate_options",
    "from_url",
)


def _load(path: str) -> LeaseStoreClass:
    module_name, _, attr = path.partition(":")
    cls: LeaseStoreClass = getattr(import_module(module_name), attr)
    missing = [name for name in _DECLARED if not hasattr(cls, name)]
    if missing:
        raise ImportError(
            f"{path} does not declare {', '.join(missing)} "
            "(see celery_leader.stores.base.LeaseStoreClass)"
        )
    return cls


def store_class(url: str) -> LeaseStoreClass:
    """The store class registered for *url*'s scheme.

    Raises :class:`ConfigurationError` naming ``leader_backend_url`` and the
    known schemes when none is registered, or when the class cannot be
    loaded: a store whose extra is missing (:class:`MissingExtraError`) says
    which extra to install, once; any other import failure is quoted.
    """
    scheme = urlsplit(url).scheme.lower()
    paths = _store_paths()
    if scheme not in paths:
        raise ConfigurationError(
            f"leader_backend_url={mask_url(url)!r} is not allowed: unknown scheme "
            f"{scheme!r}; use one of {', '.join(_url_starts(paths, by_scheme=True))}"
        )
    try:
        return _load(paths[scheme])
    except MissingExtraError as exc:
        raise _extra_missing(url, exc) from None
    except ImportError as exc:
        raise ConfigurationError(
            f"leader_backend_url={mask_url(url)!r}: the {scheme}:// store cannot be loaded: {exc}"
        ) from None


def _extra_missing(url: str, exc: MissingExtraError) -> ConfigurationError:
    """The one-line error for a store whose extra is not installed, naming the setting.

    The store's own message is the whole hint (which store, which extra, the
    pip line): wrapped in "the ... store cannot be loaded" it would name the
    store twice.
    """
    return ConfigurationError(f"leader_backend_url={mask_url(url)!r}: {exc}")


def _url_starts(paths: Mapping[str, str], *, by_scheme: bool = False) -> list[str]:
    """How the URLs of each registered scheme begin, as its store class declares (``schemes``).

    Test-only schemes are left out. A scheme whose class cannot be loaded
    (its extra is not installed) is still named, as ``<scheme>://``. Sorted
    by scheme with *by_scheme*, else in registration order (the built-in
    stores first, most used first).
    """
    starts = []
    for scheme in sorted(paths) if by_scheme else paths:
        if scheme in TEST_ONLY_SCHEMES:
            continue
        try:
            forms = _load(paths[scheme]).schemes
        except Exception:  # noqa: BLE001 - a store that cannot load is named all the same
            forms = ()
        declared = [form for form in forms if form.partition(":")[0].lower() == scheme]
        starts.append(declared[0] if declared else f"{scheme}://")
    return starts


def shared_store_urls() -> str:
    """The URL beginnings of every store workers can share, for messages.

    ``"redis://, rediss://, unix://, sqlite:/// or azureblob://"``: read from
    each store class's ``schemes``, so a store added through an entry point
    is named too. Loads every store class: call it on error paths only.
    """
    starts = _url_starts(_store_paths())
    return ", ".join(starts[:-1]) + f" or {starts[-1]}" if len(starts) > 1 else "".join(starts)


def validate_store_options(url: str, options: Mapping[str, Any]) -> None:
    """Let each store check its own keys in *options* (the values given, by key).

    The store of *url* always checks. When *options* holds keys that store
    does not read, every other registered store that reads one of them checks
    too, so that a bad value is reported at start even before it is used (a
    store whose extra is not installed cannot check, and is passed over).
    Raises :class:`ConfigurationError` naming the key.
    """
    own = store_class(url)
    own.validate_options(options)
    others = set(options) - own.option_keys
    if not others:
        return
    seen = {own}
    for path in _store_paths().values():
        try:
            cls = _load(path)
        except Exception:  # noqa: BLE001,S112 - a store that cannot load cannot check its keys
            continue
        if cls not in seen and others & cls.option_keys:
            seen.add(cls)
            cls.validate_options(options)


def load_every_store() -> None:
    """Import the module of every registered store, so that each declares its settings.

    A store declares its setting entries when its module is imported, before
    it imports its SDK: a store whose extra is not installed declares them
    all the same. A module that fails otherwise is passed over.
    """
    for path in dict.fromkeys(_store_paths().values()):
        try:
            import_module(path.partition(":")[0])
        except Exception:  # noqa: BLE001,S112 - a store that cannot load is not ours to report here
            continue


def open_store(url: str, *, timeout: float, options: Mapping[str, Any] | None = None) -> LeaseStore:
    """Open the store for *url*; every call on it is bounded by *timeout* seconds.

    *options* carries store-specific settings (e.g. Azure credentials).
    Opening connects lazily: an unreachable store raises on first use, not here.
    A store that imports its SDK only when opened (PostgreSQL, etcd) and finds
    its extra missing raises :class:`ConfigurationError` naming
    ``leader_backend_url`` and the extra, as :func:`store_class` does for one
    that imports it with its module: every caller (worker, beat, the CLI)
    reports one line, not a traceback.
    """
    cls = store_class(url)
    try:
        return cls.from_url(url, timeout=timeout, options=dict(options or {}))
    except MissingExtraError as exc:
        raise _extra_missing(url, exc) from None
