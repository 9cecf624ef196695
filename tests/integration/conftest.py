"""Real Celery workers (subprocesses), real redis-servers, a real RabbitMQ.

The cluster itself lives in :mod:`harness.cluster`, which the benchmarks use
too.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.cluster import RABBITMQ_URL, Cluster

RABBITMQCTL = "/usr/sbin/rabbitmqctl"


def rabbitmq_available() -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", 5672), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture(params=["redis", "rabbitmq"])
def broker(request: pytest.FixtureRequest) -> str:
    """Each broker in turn: Redis (own server) and RabbitMQ (the machine's)."""
    return str(request.param)


def rabbitmqctl(*args: str) -> None:
    """Run ``rabbitmqctl`` on the machine's RabbitMQ (through sudo when not root, as run.sh)."""
    command = [RABBITMQCTL, "-q", *args]
    if os.geteuid() != 0:
        command = ["sudo", "-n", *command]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {proc.returncode}: {proc.stderr.strip()}")


@pytest.fixture(scope="session")
def rabbitmq_url() -> Iterator[str]:
    """The machine's RabbitMQ, on a virtual host of this pytest process alone.

    Celery's remote control (``celery inspect``) and events are broadcast to
    every worker of a virtual host: in a shared one, workers of a test
    running at the same time (another pytest-xdist worker, a compat run)
    would answer too. ``LEADER_TEST_RABBITMQ`` names a broker to use as is.
    """
    if not rabbitmq_available():
        pytest.fail("RabbitMQ is not running on 127.0.0.1:5672: run the README's test command")
    if "LEADER_TEST_RABBITMQ" in os.environ:
        yield RABBITMQ_URL
        return
    vhost = f"celery-leader-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    rabbitmqctl("add_vhost", vhost)
    try:
        rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        yield f"amqp://guest:guest@127.0.0.1:5672/{vhost}"
    finally:
        rabbitmqctl("delete_vhost", vhost)


@pytest.fixture
def cluster_for(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator:
    made: list[Cluster] = []

    def make(broker: str = "redis", **options: float) -> Cluster:
        if broker == "rabbitmq":
            cluster = Cluster(tmp_path, broker, request.getfixturevalue("rabbitmq_url"), **options)
        else:
            cluster = Cluster(tmp_path, broker, **options)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.close()
