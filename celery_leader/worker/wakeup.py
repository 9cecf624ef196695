"""Make a new leader's consumer take leader work at once, whatever its loop waits on.

A new leader asks its consumer, through ``call_soon``, to consume the leader
queue. How soon that happens depends on where the consumer's loop waits:

* **Celery's blocking loop** (``synloop``: gevent and eventlet pools, and
  transports without asynchronous I/O such as kombu's filesystem
  transport) runs pending operations only between two
  ``drain_events(timeout=2.0)`` calls: up to two seconds of a new leader
  taking no work. Only a message delivered on the consumer's own
  connection ends that wait. With prefork, threads and solo the worker's
  remote-control queue is on that connection, so :func:`wake_blocking_loop`
  sends the worker a control message (a ``ping``, answered by no one),
  from a short-lived thread so that a broker that is down never holds up
  the lease thread. gevent and eventlet run remote control on a connection
  of its own: nothing can wake their loop from outside, and a new leader
  there takes its first leader task up to two seconds after its election
  (:func:`can_wake_blocking_loop` says which case applies).
* **kombu's Redis transport** consumes with one ``BRPOP`` over all its
  queues, re-issued every ``brpop_timeout`` (1 s); a queue added meanwhile
  is only watched from the next one. :func:`wake_redis_consumer` sends
  ``CLIENT UNBLOCK <id> TIMEOUT`` (Redis >= 5), so the pending BRPOP returns
  as if it had timed out and kombu re-issues it with the new queue list.

Both are optimisations: any failure is logged at debug level, and the wait
falls back to the loop's own timeout. Neither changes or pops a message.
"""

from __future__ import annotations

import logging
import threading
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


def can_wake_blocking_loop(consumer: Any) -> bool:
    """True when *consumer* runs Celery's blocking loop and a control message wakes it.

    That is a loop with no event hub, in a pool that is not green (green
    pools read remote control on a connection of their own).
    """
    if consumer is None or getattr(consumer, "hub", None) is not None:
        return False
    return not getattr(getattr(consumer, "pool", None), "is_green", False)


def wake_blocking_loop(app: Any, nodename: str) -> threading.Thread:
    """End the ``drain_events`` wait of the worker *nodename*, from a thread of its own.

    The message goes out on a connection from the app's pool (one already
    open, usually), with kombu's bounded publish retries.
    """

    def send() -> None:
        try:
            app.control.broadcast("ping", destination=[nodename], reply=False)
        except Exception as exc:  # noqa: BLE001 - an optimisation: never let it break the worker
            logger.debug("celery-leader: could not wake the worker's loop: %r", exc)

    thread = threading.Thread(target=send, name="celery-leader-wake", daemon=True)
    thread.start()
    return thread
