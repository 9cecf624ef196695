"""A message is known by what stays the same across its deliveries, on every broker.

AMQP numbers delivery tags per channel from 1: after the worker reconnects
to the broker, a message delivered again can carry the tag another message
had before. The redelivery record must never take a retry for a copy of a
completed run because of that (it would acknowledge the retry without
running it).
"""

from __future__ import annotations

import time
import uuid
from urllib.parse import unquote, urlsplit

import pytest
import redis
from celery.signals import before_task_publish
from kombu import Connection

from celery_leader.tasks.message_id import HEADER
from celery_leader.worker.message_identity import message_identity
from tests.integration.conftest import rabbitmqctl

pytestmark = pytest.mark.slow


#: What Celery logs when its broker connection was cut (it then reconnects by itself).
LOST = "Connection to broker lost"


def cut_broker_connections(cluster, broker: str) -> None:  # type: ignore[no-untyped-def]
    """Close every client connection of the cluster's broker; Celery reconnects by itself."""
    if broker == "rabbitmq":
        vhost = unquote(urlsplit(cluster.env["LEADER_BROKER"]).path.lstrip("/")) or "/"
        rabbitmqctl("close_all_connections", "-p", vhost, "cut by the test")
        return
    client = redis.Redis(host="127.0.0.1", port=cluster.data.port)
    client.client_kill_filter(_type="normal", skipme=True)
    client.client_kill_filter(_type="pubsub", skipme=True)
    client.close()


def test_a_retry_waiting_out_its_countdown_runs_after_a_broker_reconnect(cluster_for, broker):
    """The retry held for its countdown comes back after the reconnect, and runs.

    On RabbitMQ it comes back under the delivery tag its first run had (the
    new channel numbers from 1 again): it must still run, twice in all.
    """
    cluster = cluster_for(broker)
    (worker,) = cluster.start(1)
    cluster.leader_worker()
    cluster.send("retry_later", 8)
    rows = cluster.wait_history(lambda rows: any(r["kind"] == "start" for r in rows), 30)
    assert [r["retries"] for r in rows if r["kind"] == "start"] == [0], rows
    time.sleep(2)  # the retry is held by the worker, waiting out its countdown
    cut_broker_connections(cluster, broker)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and LOST not in worker.text():
        time.sleep(0.1)
    assert LOST in worker.text(), "the cut reached the worker"
    rows = cluster.wait_history(lambda rows: any(r["kind"] == "end" for r in rows), 40)
    starts = [r["retries"] for r in rows if r["kind"] == "start"]
    assert starts == [0, 1], (
        f"runs {starts}; the retry must run once after the reconnect:\n{worker.text()[-4000:]}"
    )
    assert [r["retries"] for r in rows if r["kind"] == "end"] == [1]


class Delivered:
    """What message_identity reads of a worker's request: its headers and its message."""

    def __init__(self, message):  # type: ignore[no-untyped-def]
        self._message = message
        self._request_dict = dict(message.headers)


def deliver_twice(url: str, headers: dict) -> tuple:  # type: ignore[type-arg]
    """Publish one message, receive it, drop the connection unacknowledged, receive it again."""
    name = f"identity-{uuid.uuid4().hex[:8]}"
    identities, tags = [], []
    with Connection(url) as connection:
        queue = connection.SimpleQueue(name)
        queue.put({"x": 1}, headers=headers)
        message = queue.get(timeout=10)
        identities.append(message_identity(Delivered(message)))
        tags.append(message.delivery_tag)
        queue.close()  # unacknowledged: handed back to the broker
    with Connection(url) as connection:
        queue = connection.SimpleQueue(name)
        message = queue.get(timeout=10)
        identities.append(message_identity(Delivered(message)))
        tags.append(message.delivery_tag)
        message.ack()
        queue.close()
    return identities, tags


def test_identity_across_deliveries_on_each_broker(broker, cluster_for):
    """A stamped message is named by its stamp on every broker; without one, only Redis names it
    (by its tag), and AMQP's tag, reused after the reconnect, names nothing."""
    cluster = cluster_for(broker)
    url = cluster.env["LEADER_BROKER"]
    identities, _ = deliver_twice(url, {HEADER: "a" * 32})
    assert identities == [("stamp", "a" * 32)] * 2
    identities, tags = deliver_twice(url, {})
    if broker == "redis":
        assert identities[0] == ("tag", tags[0]) and identities == [identities[0]] * 2
    else:
        assert tags == [1, 1], "AMQP numbers tags per channel: the same tag on both channels"
        assert identities == [None, None]


def test_every_publish_is_stamped_anew(cluster_for):
    """A send, and a send that copies another message's headers (as a retry does), each get
    an id of their own."""
    cluster = cluster_for("redis")
    seen: list[dict] = []  # type: ignore[type-arg]

    def keep(headers=None, **_):  # type: ignore[no-untyped-def]
        seen.append(dict(headers))

    before_task_publish.connect(keep, weak=False)
    try:
        cluster.send("leader_record", 1)
        cluster.send("leader_record", 1, headers={HEADER: seen[0][HEADER]})
    finally:
        before_task_publish.disconnect(keep)
    stamps = [headers.get(HEADER) for headers in seen]
    assert all(isinstance(s, str) and len(s) == 32 for s in stamps), stamps
    assert stamps[0] != stamps[1]


# On the oldest Celery too (compat): its pool's flush is what this guards against. The
# flush does not depend on the broker, so the compat runs take Redis alone.
@pytest.mark.parametrize(
    "broker", [pytest.param("redis", marks=pytest.mark.compat), "rabbitmq"], indirect=True
)
def test_a_run_going_on_through_a_broker_reconnect_settles_and_its_copy_never_runs(
    cluster_for, broker
):
    """A 6 s run that then retries once; the broker connection is cut 2 s into it.

    The broker delivers the run's message again on the new connection: it must
    wait for the run and go when the run retried (two runs in all). Celery
    before 5.6 forgot, at the reconnect, the jobs its prefork pool was running
    (their runs never settled here), and the copy ran as a third run.
    """
    cluster = cluster_for(broker)
    (worker,) = cluster.start(1, extra=["-c", "2"])
    cluster.leader_worker()
    cluster.send("long_retry", 6, queue=f"{cluster.name}.leader")
    cluster.wait_history(lambda rows: any(r["kind"] == "start" for r in rows), 30)
    time.sleep(2)
    cut_broker_connections(cluster, broker)
    rows = cluster.wait_history(lambda rows: any(r["kind"] == "end" for r in rows), 60)
    assert LOST in worker.text(), "the cut reached the worker"
    time.sleep(3)  # a copy let through would have started by now
    starts = [r["retries"] for r in cluster.history() if r["kind"] == "start"]
    assert starts == [0, 1], f"runs {starts}:\n{worker.text()[-4000:]}"
    assert any(r["kind"] == "end" for r in rows)
