"""The store matrix: every store the tests run against, in one table.

Each row says how to start a fresh, real store of one kind and build its URL,
which lease ttl it accepts, and how to make it lose its data. The store
fixtures of ``tests/conftest.py`` (``store_url``, ``any_store_url``,
``running_store``, ``lease_ttl``) read it, and so do the store tests; a new
store is one new row.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from celery_leader.stores.memory import reset_memory_stores
from harness.servers import AzuriteServer, EtcdCluster, PostgresServer, RedisServer, SentinelRedis


@dataclass
class RunningStore:
    """A fresh store of one kind, up for one test."""

    kind: StoreKind
    url: str
    #: Make the store lose every lease, counter and state it holds (no lease may be held).
    lose_data: Callable[[], None]
    #: Stop the whole store from answering (SIGSTOP), and let it go on; None: cannot.
    pause: Callable[[], None] | None = None
    resume: Callable[[], None] | None = None


@dataclass(frozen=True)
class StoreKind:
    """One row of the matrix."""

    #: The test id (``test_x[redis]``).
    name: str
    #: The URL scheme of its stores.
    scheme: str
    #: A context manager that starts a fresh store and stops it after the test.
    run: Callable[[Path, pytest.MonkeyPatch], AbstractContextManager[RunningStore]]
    #: A lease length the store accepts (Azure: 15..60 s).
    lease_ttl: float
    #: The shortest lease length it accepts, for tests that wait for an expiry.
    short_ttl: float
    #: A real store that starts in well under a second: ``store_url`` runs on it.
    quick: bool


@contextmanager
def _redis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RunningStore]:
    server = RedisServer(tmp_path).start()

    def lose_data() -> None:
        server.restart_empty()

    try:
        yield RunningStore(STORES["redis"], server.url, lose_data, server.pause, server.resume)
    finally:
        server.stop()


@contextmanager
def _sqlite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RunningStore]:
    path = tmp_path / "leader.db"

    def lose_data() -> None:
        for file in tmp_path.glob("leader.db*"):
            file.unlink()

    yield RunningStore(STORES["sqlite"], f"sqlite:///{path}", lose_data)


@contextmanager
def _azure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RunningStore]:
    server = AzuriteServer(tmp_path).start()
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", server.connection_string)
    container = f"c{uuid.uuid4().hex[:12]}"

    def lose_data() -> None:
        from azure.storage.blob import BlobServiceClient

        service = BlobServiceClient.from_connection_string(server.connection_string)
        with service:
            blobs = service.get_container_client(container)
            for blob in blobs.list_blobs():
                blobs.delete_blob(blob.name)

    try:
        yield RunningStore(STORES["azure"], f"azureblob://{container}/leases", lose_data)
    finally:
        server.stop()


@contextmanager
def _sentinel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RunningStore]:
    servers = SentinelRedis(tmp_path / "sentinel").start()

    def lose_data() -> None:
        port = servers.primary_port()
        assert port is not None, "the sentinels name no primary"
        with servers.server_on(port).client() as client:
            client.flushall()  # replicated: the replica loses it too

    paused: list[int] = []

    def pause() -> None:  # the primary: the sentinels may promote the replica meanwhile
        port = servers.primary_port()
        assert port is not None, "the sentinels name no primary"
        servers.server_on(port).pause()
        paused.append(port)

    def resume() -> None:
        while paused:
            servers.server_on(paused.pop()).resume()

    try:
        yield RunningStore(STORES["sentinel"], servers.url, lose_data, pause, resume)
    finally:
        servers.stop()


@contextmanager
def _postgres(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RunningStore]:
    server = PostgresServer().start()

    def lose_data() -> None:
        import psycopg

        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute(
                "DROP TABLE IF EXISTS celery_leader_lease, celery_leader_state,"
                " celery_leader_member; DROP SEQUENCE IF EXISTS celery_leader_token_seq"
            )
            # Connections of the store under test: they see the tables gone at once.
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE pid <> pg_backend_pid() AND datname = current_database()"
            )

    try:
        yield RunningStore(STORES["postgres"], server.url, lose_data, server.pause, server.resume)
    finally:
        server.stop()


@contextmanager
def _etcd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RunningStore]:
    cluster = EtcdCluster(tmp_path / "etcd").start()

    def lose_data() -> None:
        cluster.restart_empty()  # a new cluster on the same ports: no keys, revisions from 1

    def pause() -> None:
        for member in cluster.members:
            member.pause()

    def resume() -> None:
        for member in cluster.members:
            member.resume()

    try:
        yield RunningStore(STORES["etcd"], cluster.url, lose_data, pause, resume)
    finally:
        cluster.close()


@contextmanager
def _memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RunningStore]:
    yield RunningStore(STORES["memory"], f"memory://{uuid.uuid4().hex}", reset_memory_stores)


STORES: dict[str, StoreKind] = {
    kind.name: kind
    for kind in (
        StoreKind("redis", "redis", _redis, lease_ttl=5.0, short_ttl=0.6, quick=True),
        StoreKind("sqlite", "sqlite", _sqlite, lease_ttl=5.0, short_ttl=0.6, quick=True),
        StoreKind("azure", "azureblob", _azure, lease_ttl=15.0, short_ttl=15.0, quick=False),
        StoreKind("memory", "memory", _memory, lease_ttl=5.0, short_ttl=0.6, quick=False),
        # A primary, a replica and three sentinels: about 2 s to start, so not "quick".
        StoreKind("sentinel", "sentinel", _sentinel, lease_ttl=5.0, short_ttl=0.6, quick=False),
        # initdb and a start take about 1.3 s.
        StoreKind("postgres", "postgresql", _postgres, lease_ttl=5.0, short_ttl=0.6, quick=False),
        # One member; etcd counts leases in whole seconds and checks expiry every 0.5 s.
        StoreKind("etcd", "etcd", _etcd, lease_ttl=5.0, short_ttl=3.0, quick=False),
    )
}

#: The real stores that start quickly: what ``store_url`` runs on.
QUICK = [kind.name for kind in STORES.values() if kind.quick]


def kind_of(url: str) -> StoreKind:
    """The matrix row of a store URL."""
    scheme = urlsplit(url).scheme
    (kind,) = (kind for kind in STORES.values() if kind.scheme == scheme)
    return kind
