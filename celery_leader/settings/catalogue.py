"""The settings catalogue: every ``leader_*`` setting celery-leader reads, one entry each.

Entries are :class:`~celery_leader._catalogue.Setting` objects, declared where
they are read: the election's, beat's and the metrics' in this package, each
store's in its own module. This module reads them back: for the unknown-key
warning, for the settings reference (:mod:`celery_leader.settings.reference`)
and for what a configuration gives.

A third-party store declares its settings the same way, with
:func:`register` at the import of its module (before it imports an SDK that
may be missing), and names them in its class's ``option_keys``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celery_leader._catalogue import (
    DJANGO_PREFIX,
    Owner,
    Setting,
    names_of,
    register,
    registered,
    unset,
)
from celery_leader.settings.spelling import own_keys, prefix_of
from celery_leader.stores.registry import load_every_store

__all__ = [
    "DJANGO_PREFIX",
    "Owner",
    "Setting",
    "entries",
    "given_settings",
    "known_names",
    "listed_keys",
    "register",
    "store_entries",
    "unset",
]


def entries() -> tuple[Setting[Any], ...]:
    """Every setting: the election's, beat's, the metrics' and every registered store's.

    Imports the module of every registered store (each declares its own
    settings); a store whose extra is missing still declares them.
    """
    load_every_store()
    return registered()


def known_names() -> frozenset[str]:
    """The name of every setting in the catalogue (:func:`entries`)."""
    return names_of(entries())


def listed_keys(conf: Mapping[str, Any]) -> dict[str, str]:
    """The ``leader_*`` keys *conf* lists, as Celery reads them, each to the key as written.

    Under a namespace only the keys with its prefix are Celery's (the others
    are the project's own, Django's): ``{"leader_lease_ttl":
    "CELERY_LEADER_LEASE_TTL"}``. Keys as written that Celery does not read
    at all are left out (see :mod:`celery_leader.settings.checks`).
    """
    prefix = prefix_of(conf).lower()
    found: dict[str, str] = {}
    for written in own_keys(conf):
        key = str(written).lower()
        if prefix:
            if not key.startswith(prefix):
                continue
            key = key[len(prefix) :]
        if key.startswith("leader_"):
            found[key] = str(written)
    return found


def _complete_for(conf: Mapping[str, Any]) -> tuple[Setting[Any], ...]:
    """The entries known so far, or every entry when *conf* lists a key not among them.

    Loading every store's module costs imports (their SDKs), so it is done
    only when *conf* names a setting that may be another store's.
    """
    known = registered()
    if set(listed_keys(conf)) - names_of(known):
        return entries()
    return known


def store_entries(conf: Mapping[str, Any]) -> tuple[Setting[Any], ...]:
    """Every store's settings that *conf* may give (each store in use declares its own)."""
    return tuple(s for s in _complete_for(conf) if s.owner is Owner.STORE)


def given_settings(conf: Mapping[str, Any]) -> dict[str, Any]:
    """The settings *conf* gives, by name, with their values as given (not parsed).

    A setting set to None or ``""`` counts as not given (:func:`unset`).
    """
    return {
        setting.name: value
        for setting in _complete_for(conf)
        if (value := setting.given(conf)) is not None
    }
