"""harness.servers.SqsServer: an SQS-compatible server that kombu's SQS transport talks to.

What tests/integration/test_sqs_broker.py relies on, through kombu as a
worker uses it: an unacknowledged message comes back once the visibility
timeout passes, with a new delivery tag (its ReceiptHandle) and the same
SQS MessageId, its ApproximateReceiveCount one higher; an acknowledged one
does not come back.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kombu import Connection

from harness.servers import SqsServer

VISIBILITY = 1  # seconds


@pytest.fixture
def sqs(tmp_path: Path) -> Iterator[SqsServer]:
    server = SqsServer(tmp_path).start()
    yield server
    server.stop()


def test_a_message_comes_back_after_the_visibility_timeout_with_a_new_tag(sqs):
    options = {**sqs.transport_options(), "visibility_timeout": VISIBILITY}
    with (
        Connection(sqs.url, transport_options=options) as connection,
        connection.SimpleQueue("harness.sqs") as queue,
    ):
        queue.put({"n": 1})
        first = queue.get(timeout=5)
        received_at = time.monotonic()
        again = queue.get(timeout=VISIBILITY + 5)  # first is not acknowledged
        waited = time.monotonic() - received_at
        assert again.payload == first.payload == {"n": 1}
        assert again.delivery_tag != first.delivery_tag
        sqs_first = first.delivery_info["sqs_message"]
        sqs_again = again.delivery_info["sqs_message"]
        assert sqs_again["MessageId"] == sqs_first["MessageId"]
        assert sqs_first["Attributes"]["ApproximateReceiveCount"] == "1"
        assert sqs_again["Attributes"]["ApproximateReceiveCount"] == "2"
        assert waited >= VISIBILITY - 0.1, f"delivered again after {waited:.2f} s"
        again.ack()
        with pytest.raises(queue.Empty):
            queue.get(timeout=VISIBILITY + 1)
    assert sqs.messages("harness.sqs") == {"visible": 0, "in_flight": 0, "delayed": 0}
