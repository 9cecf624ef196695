"""What names one message across its deliveries, on each transport the docs name.

The redelivery record (:mod:`celery_leader.worker.redelivery`) acknowledges
a message without running it only when it proves that this very message
already ran to completion. It proves that by an identity that stays the
same however often the broker delivers the message again and differs for
any other message, also one under the same task id (a retry, a replacement,
a message sent again on purpose).

When each transport delivers a message again, and what stays the same:

* **Redis, Sentinel**: again after the visibility timeout while a run goes
  on, and at a reconnect or shutdown (the unacknowledged ones are restored).
  The delivery tag is a uuid drawn at publish and kept in the message: the
  same on every delivery. Headers stay too.
* **RabbitMQ (AMQP)**: again after a reconnect (a restart, a missed
  heartbeat, a network blip) and a requeue. The delivery tag is a number
  per channel from 1: another message's after a reconnect. Only headers
  stay.
* **SQS**: again after the visibility timeout while a run goes on, and a
  requeue. The delivery tag is the receipt handle, a new one on every
  receive. Headers and the SQS ``MessageId`` stay.

So :func:`message_identity` answers, in order: the id stamped into the
headers at publish (:mod:`celery_leader.tasks.message_id`; every process
that imported celery_leader stamps); for a message without one, the Redis
delivery tag or the SQS MessageId; else ``None``: nothing proves which
message it is, and the record never drops it (at least once beats lost).
"""

from __future__ import annotations

from typing import Any, TypeAlias

from celery_leader.tasks.message_id import HEADER

#: One message's identity: (where it comes from, its value), or None when nothing names it.
Identity: TypeAlias = tuple[str, str]

#: The modules of kombu transports whose delivery tag is drawn at publish and kept in the
#: message (kombu's virtual transports' default), so that it names the message for good.
STABLE_TAG_TRANSPORTS = ("kombu.transport.redis",)


def message_identity(request: Any) -> Identity | None:
    """The identity of *request*'s message across its deliveries, or None when nothing names it."""
    headers = getattr(request, "_request_dict", None)
    stamped = headers.get(HEADER) if isinstance(headers, dict) else None
    if isinstance(stamped, str) and stamped:
        return "stamp", stamped
    message = getattr(request, "_message", None)
    if message is None:
        return None
    sqs_message = (getattr(message, "delivery_info", None) or {}).get("sqs_message")
    if isinstance(sqs_message, dict) and isinstance(sqs_message.get("MessageId"), str):
        return "sqs", sqs_message["MessageId"]
    channel = getattr(message, "channel", None)
    tag = getattr(message, "delivery_tag", None)
    if isinstance(tag, str) and type(channel).__module__ in STABLE_TAG_TRANSPORTS:
        return "tag", tag
    return None
