"""Which lease store an app uses (``leader_backend_url``), and the options its store reads.

The election knows no store: each store module declares its own settings
(:mod:`celery_leader._catalogue`); here they are read from the app's
configuration, every store's, and each store checks its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from celery_leader._catalogue import Owner, Setting, check, register
from celery_leader._masking import mask_url
from celery_leader.exceptions import ConfigurationError
from celery_leader.settings.catalogue import store_entries
from celery_leader.settings.spelling import spelled_as_given
from celery_leader.stores.base import BrokerOptions
from celery_leader.stores.registry import shared_store_urls, store_class, validate_store_options

ERR_NO_BACKEND = (
    "leader_backend_url is not set and the broker ({broker}) is not Redis: set "
    "leader_backend_url to a {urls} URL"
)

#: Broker URL schemes whose servers can hold the lease as well (the Redis store's).
_REDIS_SCHEMES = ("redis", "rediss", "unix", "sentinel")


def _url(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigurationError(
            f"{name}={type(value).__name__} is not allowed: it must be a URL string"
        )
    return value


BACKEND_URL: Setting[str] = Setting(
    "leader_backend_url",
    Owner.ELECTION,
    default="the broker URL when it is Redis (`redis://`, `rediss://`, `unix://`, "
    "`sentinel://`); otherwise required",
    allowed=(
        "a lease store URL: `redis://`, `rediss://`, `unix://`, `sentinel://`, "
        "`postgresql://`, `sqlite:///`, `azureblob://`, `etcd://` (and stores added by plugins)"
    ),
    description=(
        "Where the lease lives. Workers (and beats) that share a store and an election name "
        "elect one leader; the store's own settings are listed under its name below."
    ),
    parse=_url,
)
register(BACKEND_URL)


@spelled_as_given
def default_backend_url(conf: Mapping[str, Any]) -> str:
    """``leader_backend_url``, else the broker URL when it is Redis."""
    url = BACKEND_URL.read(conf)
    if url:
        return url
    broker = _broker_url(conf)
    if urlsplit(broker).scheme in _REDIS_SCHEMES:
        return broker
    raise ConfigurationError(
        ERR_NO_BACKEND.format(broker=mask_url(broker) or "not set", urls=shared_store_urls())
    )


def _broker_url(conf: Mapping[str, Any]) -> str:
    broker = conf.get("broker_url") or ""
    if isinstance(broker, (list, tuple)):
        broker = broker[0] if broker else ""
    return str(broker)


@spelled_as_given
def store_options(conf: Mapping[str, Any], url: str) -> dict[str, Any]:
    """The store settings *conf* gives, checked, by name: what the store of *url* is opened with.

    Every store's settings are checked, also those of a store other than the
    one in use or one whose extra is not installed: a bad value is reported
    at start, before it is ever used.
    Values the store takes from the broker's settings
    (:class:`~celery_leader.stores.base.BrokerOptions`) fill in those not set.
    """
    entries = store_entries(conf)
    given = {
        setting.name: value for setting in entries if (value := setting.given(conf)) is not None
    }
    cls = store_class(url)
    transport = conf.get("broker_transport_options") or {}
    broker = conf.get("broker_url") or ""
    if (
        isinstance(cls, BrokerOptions)
        and isinstance(transport, Mapping)
        and isinstance(broker, str)
    ):
        given = {**cls.options_from_broker(url, broker, transport), **given}
    # Each entry checks its value, also a store's whose extra is not installed (its class
    # cannot load); then the store classes check what they check beyond single values.
    check(entries, given)
    validate_store_options(url, given)
    return {name: value for name, value in given.items() if value}
