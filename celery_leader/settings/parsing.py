"""Parsers of setting values: ``parse(name, value)`` gives the value or one line naming the setting.

Each parser is what a :class:`~celery_leader._catalogue.Setting` entry calls
on a value that is set; the message it raises starts with
``<name>=<value> is not allowed`` and says what is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery_leader._values import positive_seconds, seconds_value
from celery_leader.exceptions import ConfigurationError

__all__ = [
    "non_empty_string",
    "non_negative_seconds",
    "one_of",
    "positive_seconds",
    "seconds_value",
    "tcp_port",
    "true_or_false",
]

_MAX_PORT = 65535


def non_negative_seconds(name: str, value: Any) -> float:
    """A number of seconds >= 0."""
    number = seconds_value(name, value)
    if number < 0:
        raise ConfigurationError(
            f"{name}={number:g} is not allowed: it must be a number of seconds >= 0"
        )
    return number


def true_or_false(name: str, value: Any) -> bool:
    """True or False, nothing else: "no" or "0" from an environment would be truthy."""
    if not isinstance(value, bool):
        raise ConfigurationError(f"{name}={value!r} is not allowed: it must be True or False")
    return value


def tcp_port(name: str, value: Any) -> int | None:
    """A TCP port number, 1..65535; 0 (or False, or "0" from an environment) is no port (None)."""
    if value == 0:
        return None
    try:
        # A whole number, also as text from an environment ("9101"); never a bool or 0.5.
        fraction = isinstance(value, float) and not value.is_integer()
        port = -1 if isinstance(value, bool) or fraction else int(value)
    except (TypeError, ValueError):
        port = -1
    if port == 0:
        return None
    if not 1 <= port <= _MAX_PORT:
        raise ConfigurationError(
            f"{name}={value!r} is not allowed: it must be a TCP port number, 1..65535"
        )
    return port


def one_of(*allowed: str) -> Callable[[str, Any], str]:
    """A parser taking exactly one of *allowed*."""

    def parse(name: str, value: Any) -> str:
        if value not in allowed:
            raise ConfigurationError(
                f"{name}={value!r} is not allowed: use one of {', '.join(allowed)}"
            )
        return str(value)

    return parse


def non_empty_string(what: str) -> Callable[[str, Any], str]:
    """A parser taking a string that is not blank; the message says it must be *what*."""

    def parse(name: str, value: Any) -> str:
        if not isinstance(value, str) or not value.strip():
            raise ConfigurationError(f"{name}={value!r} is not allowed: it must be {what}")
        return value

    return parse
