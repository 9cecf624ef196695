"""Shared fixtures: real redis-server processes, stores, and a history checker."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_leader.stores import open_store
from celery_leader.stores.base import LeaseStore
from tests.servers import AzuriteServer, RedisServer


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh redis-server on a free port, killed after the test."""
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()


@pytest.fixture(params=["redis", "sqlite"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of a fresh, real store of each kind."""
    if request.param == "redis":
        server = RedisServer(tmp_path).start()
        yield server.url
        server.stop()
    else:
        yield f"sqlite:///{tmp_path}/leader.db"


@pytest.fixture(params=["redis", "sqlite", "azure", "memory"])
def any_store_url(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """The URL of a fresh, real store of every kind, Azure Blob (Azurite) included."""
    if request.param == "azure":
        server = AzuriteServer(tmp_path).start()
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", server.connection_string)
        yield f"azureblob://c{uuid.uuid4().hex[:12]}/leases"
        server.stop()
    elif request.param == "memory":
        yield f"memory://{uuid.uuid4().hex}"
    elif request.param == "redis":
        redis_server = RedisServer(tmp_path).start()
        yield redis_server.url
        redis_server.stop()
    else:
        yield f"sqlite:///{tmp_path}/leader.db"


@pytest.fixture
def lease_ttl(any_store_url: str) -> float:
    """A lease length every store accepts (Azure: 15..60 s)."""
    return 15.0 if any_store_url.startswith("azureblob") else 5.0


@pytest.fixture
def open_stores() -> Iterator[list[LeaseStore]]:
    """Stores opened in a test, closed after it."""
    stores: list[LeaseStore] = []
    yield stores
    for store in stores:
        store.close()


@pytest.fixture
def make_store(any_store_url: str, open_stores: list[LeaseStore]):  # type: ignore[no-untyped-def]
    """Open another client of the test's store."""

    def make(timeout: float = 2.0) -> LeaseStore:
        store = open_store(any_store_url, timeout=timeout)
        open_stores.append(store)
        return store

    return make


@pytest.fixture(autouse=True)
def _quiet_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="celery_leader")
