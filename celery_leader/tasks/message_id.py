"""Every task message carries an id of its own, stamped when it is published.

The leader's redelivery record (:mod:`celery_leader.worker.message_identity`)
must know one message across all of its deliveries, on every broker, and
tell it from any other message under the same task id. A broker's delivery
tag cannot: AMQP numbers tags per channel from 1 again after a reconnect,
and SQS issues a new receipt handle on every receive. So each message gets,
in its headers, :data:`HEADER`: 32 hex digits drawn at random when it is
published. Headers travel with the message: every broker hands the same
value back however often it delivers the message again (a visibility
timeout, a reconnect, a requeue).

Guarantees: every publish through Celery (``apply_async``, ``send_task``,
beat, ``self.retry()``, ``self.replace()``) in a process that imported
:mod:`celery_leader` draws a new id, also when the message copies another
one's headers (Celery's retry passes the running message's headers on),
so a retry or a message sent again on purpose is never taken for the one
before it. A publish that kombu retries after a connection error sends the
same message again, with the same id: both copies are one message.

Assumption: a message published by a process that never imported
celery_leader (another language's client, a bare kombu producer) has no
id; the worker then falls back on what its transport keeps, or on nothing
(see :mod:`celery_leader.worker.message_identity`).
"""

from __future__ import annotations

import uuid
from typing import Any

from celery.signals import before_task_publish

#: The message header that holds the message's own id.
HEADER = "leader_message_id"


def stamp(headers: dict[str, Any]) -> None:
    """Give the message whose *headers* these are an id of its own (a new one every time)."""
    headers[HEADER] = uuid.uuid4().hex


def _stamp_published(headers: dict[str, Any] | None = None, **_: Any) -> None:
    """``before_task_publish``: stamp the message about to be sent."""
    if isinstance(headers, dict):
        stamp(headers)


before_task_publish.connect(_stamp_published, weak=False, dispatch_uid="celery_leader.message_id")
