"""Make kombu's Redis transport see a newly added queue at once.

kombu's Redis transport consumes with one ``BRPOP`` over all its queues,
re-issued every ``brpop_timeout`` (1 s). A queue added while that BRPOP
blocks is only watched from the next one: up to a second of a new leader not
taking leader work. ``CLIENT UNBLOCK <id> TIMEOUT`` (Redis >= 5) makes the
pending BRPOP return as if it had timed out, so kombu re-issues it with the
new queue list straight away.

This reaches into kombu internals (the channel's blocked connection, its
pool); any failure is logged at debug level and the wait simply falls back
to kombu's own timeout. It changes no message and pops nothing.
"""

from __future__ import annotations

import logging
from typing import Any

import redis

logger = logging.getLogger(__name__)


def wake_redis_consumer(consumer: Any) -> bool:
    """Unblock the consumer's pending BRPOP; True when one was unblocked."""
    try:
        channel = consumer.task_consumer.channel
        blocked = getattr(channel, "_in_poll", None)
        sock = getattr(blocked, "_sock", None)
        if sock is None or not hasattr(channel, "pool"):
            return False
        host, port = sock.getsockname()[:2]
        admin = redis.Redis(connection_pool=channel.pool)
        try:
            for client in admin.client_list():
                if client.get("addr") == f"{host}:{port}":
                    return bool(admin.client_unblock(int(client["id"]), error=False))
        finally:
            admin.close()
    except Exception as exc:  # noqa: BLE001 - an optimisation: never let it break the worker
        logger.debug("celery-leader: could not wake the Redis consumer: %r", exc)
    return False
