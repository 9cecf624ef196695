"""Parsers of setting values that both the settings and the stores' own entries use.

Stores may not import :mod:`celery_leader.settings` (they sit below it), so
the parsers both need live here, with the messages users see.
"""

from __future__ import annotations

import math
from typing import Any

from celery_leader.exceptions import ConfigurationError


def seconds_value(key: str, value: Any) -> float:
    """*value* of setting *key* as a finite number of seconds.

    Raises :class:`ConfigurationError` naming the key and what is allowed.
    """
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigurationError(
            f"{key}={value!r} is not allowed: it must be a number of seconds"
        ) from None
    if math.isnan(number) or math.isinf(number):
        raise ConfigurationError(f"{key}={value!r} is not allowed: it must be a finite number")
    return number


def positive_seconds(key: str, value: Any) -> float:
    """:func:`seconds_value`, also refusing 0 and less."""
    number = seconds_value(key, value)
    if number <= 0:
        raise ConfigurationError(
            f"{key}={number:g} is not allowed: it must be a number of seconds > 0"
        )
    return number
