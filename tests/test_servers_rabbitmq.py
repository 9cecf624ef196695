"""harness.servers.RabbitMQServer: a private node whose restart keeps durable data."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kombu import Connection, Exchange, Queue

from harness.servers import RabbitMQServer


@pytest.fixture
def rabbitmq(tmp_path: Path) -> Iterator[RabbitMQServer]:
    server = RabbitMQServer(tmp_path).start()
    yield server
    server.stop()
    assert server.pids() == [], "stop() left processes of the node behind"


def publish(url: str, queue: Queue, body: str, delivery_mode: int) -> None:
    # Confirmed, so the message is in the broker before the restart begins.
    with Connection(url, transport_options={"confirm_publish": True}) as connection:
        connection.Producer().publish(
            body,
            exchange=queue.exchange,
            routing_key=queue.routing_key,
            declare=[queue],
            delivery_mode=delivery_mode,
        )


def drain(url: str, queue: Queue) -> list[str]:
    bodies = []
    with Connection(url) as connection, connection.SimpleQueue(queue) as simple:
        while True:
            try:
                message = simple.get(timeout=2)
            except simple.Empty:
                return bodies
            bodies.append(message.payload)
            message.ack()


@pytest.mark.slow
def test_restart_keeps_a_durable_queues_persistent_message(rabbitmq: RabbitMQServer) -> None:
    """A persistent message in a durable queue survives a restart on the same port; a
    transient one does not, which shows the node really went down."""
    queue = Queue("kept", Exchange("kept", type="direct", durable=True), "kept", durable=True)
    publish(rabbitmq.url, queue, "persistent", delivery_mode=2)
    publish(rabbitmq.url, queue, "transient", delivery_mode=1)
    url, before = rabbitmq.url, rabbitmq.pids()

    rabbitmq.restart()

    assert rabbitmq.url == url
    assert not set(before) & set(rabbitmq.pids()), "the same processes kept running"
    assert drain(rabbitmq.url, queue) == ["persistent"]
