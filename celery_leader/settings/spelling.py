"""Settings named as the user wrote them: ``CELERY_LEADER_LEASE_TTL`` under Django's namespace.

Celery's ``config_from_object(..., namespace="CELERY")`` finds
``leader_lease_ttl`` in ``CELERY_LEADER_LEASE_TTL``; a message that named the
lower-case key would name something the user never wrote. Every error and
warning about a setting goes through here on its way out.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, TypeVar

from celery_leader.exceptions import ConfigurationError

_P = ParamSpec("_P")
_R = TypeVar("_R")

_KEY = re.compile(r"\bleader_[a-z_]+")


def own_keys(conf: Mapping[str, Any]) -> set[str]:
    """The keys *conf* lists (Celery's defaults among them); none when it cannot list them."""
    try:
        return set(conf.keys())
    except Exception:  # noqa: BLE001 - a conf that cannot list keys keeps the plain names
        return set()


def prefix_of(conf: Mapping[str, Any]) -> str:
    """The namespace prefix Celery reads *conf* under (``"CELERY_"``), else ``""``."""
    return str(getattr(conf, "prefix", None) or "")


def spelled(conf: Mapping[str, Any], key: str) -> str:
    """*key* as the user wrote it: ``CELERY_LEADER_LEASE_TTL`` under a namespace."""
    prefix = prefix_of(conf)
    if not prefix or key in own_keys(conf):
        return key
    given = f"{prefix}{key.upper()}"
    return given if given in own_keys(conf) else key


def spelled_in(conf: Mapping[str, Any], message: str) -> str:
    """*message* with each ``leader_*`` key it names spelled as *conf* has it (:func:`spelled`)."""
    if not prefix_of(conf):
        return message
    return _KEY.sub(lambda m: spelled(conf, m.group(0)), message)


def spelled_as_given(func: Callable[_P, _R]) -> Callable[_P, _R]:
    """Rewrite the keys a :class:`ConfigurationError` names as the conf (first arg) spells them."""

    @functools.wraps(func)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return func(*args, **kwargs)
        except ConfigurationError as exc:
            conf = args[0] if args else None
            if not isinstance(conf, Mapping) or not prefix_of(conf):
                raise
            raise ConfigurationError(spelled_in(conf, str(exc))) from None

    return wrapper
