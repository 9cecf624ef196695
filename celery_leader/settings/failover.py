"""``leader_fast_failover``: whether a leader's death is seen at once, where the store can."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celery_leader._catalogue import Owner, Setting, register
from celery_leader.settings.parsing import true_or_false
from celery_leader.settings.spelling import spelled_as_given

FAST_FAILOVER: Setting[bool] = Setting(
    "leader_fast_failover",
    Owner.ELECTION,
    default="`False`",
    allowed="`True`, `False`",
    description=(
        "Replace a leader whose process died within about half a second, instead of when its "
        "lease expires, on stores that can see a process die (PostgreSQL, Redis, Redis "
        "Sentinel, SQLite). Each worker and beat keeps one more connection (or lock) for it, "
        "and a leader stops acting when that connection has not answered for 0.25 s. A "
        "stopped or partitioned leader is still replaced when its lease expires."
    ),
    parse=true_or_false,
)
register(FAST_FAILOVER)


@spelled_as_given
def fast_failover(conf: Mapping[str, Any]) -> bool:
    """``leader_fast_failover``: True ties every term to a lifeline where the store has one."""
    return FAST_FAILOVER.read_or(conf, False)
