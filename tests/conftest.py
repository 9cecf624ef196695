"""Shared fixtures: real redis-server processes, stores, and a history checker."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_leader.stores import open_store
from celery_leader.stores.base import LeaseStore
from tests.servers import RedisServer
from tests.store_matrix import QUICK, STORES, RunningStore

#: Files whose tests must stay on one pytest-xdist worker: they share a module-scoped
#: fixture (started once per worker that runs them), or write the same files.
XDIST_GROUPS = {
    "tests/integration/test_example_project.py": "example_project",  # its workers
    "tests/test_django_beat_state.py": "django",  # Django, configured once a process
    "tests/test_install.py": "install",  # each builds a wheel in the source tree
}

#: Tests (node id prefixes) that bound a time tightly enough that the load of other
#: tests beside them could break it: marked ``serial``, run.sh runs them in a pass of
#: their own after the parallel one.
SERIAL: tuple[str, ...] = ()


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark XDIST_GROUPS and SERIAL; under pytest-xdist, send the slow tests out first."""
    for item in items:
        group = XDIST_GROUPS.get(item.nodeid.split("::", 1)[0])
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        if item.nodeid.startswith(SERIAL):
            item.add_marker(pytest.mark.serial)
    if hasattr(config, "workerinput"):  # a pytest-xdist worker
        # The longest first, so that no worker starts one near the end while the others
        # idle (run.sh keeps this order: --no-loadscope-reorder). The sort is stable.
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh redis-server on a free port, killed after the test."""
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()


@pytest.fixture(params=QUICK)
def store_url(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """The URL of a fresh, real store of each kind that starts quickly (tests/store_matrix.py)."""
    with STORES[request.param].run(tmp_path, monkeypatch) as store:
        yield store.url


@pytest.fixture(params=list(STORES))
def running_store(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[RunningStore]:
    """A fresh store of every kind in tests/store_matrix.py, Azure Blob (Azurite) included."""
    with STORES[request.param].run(tmp_path, monkeypatch) as store:
        yield store


@pytest.fixture
def any_store_url(running_store: RunningStore) -> str:
    """The URL of a fresh store of every kind in tests/store_matrix.py."""
    return running_store.url


@pytest.fixture
def lease_ttl(running_store: RunningStore) -> float:
    """A lease length the store accepts (Azure: 15..60 s)."""
    return running_store.kind.lease_ttl


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
