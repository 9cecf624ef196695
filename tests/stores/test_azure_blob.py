"""Azure Blob store against Azurite: elections, pauses, bad credentials, ttl rules."""

from __future__ import annotations

import logging
import time
import uuid

import pytest

from celery_leader.exceptions import ConfigurationError, StoreAuthError
from celery_leader.lease import EventKind, LeaseManager
from celery_leader.settings import load_settings
from celery_leader.stores import open_store
from celery_leader.stores.azure_blob import lease_guid
from celery_leader.stores.base import Holder
from celery_leader.timing import LeaseTiming
from tests.history import History
from tests.servers import AZURITE_KEY, AzuriteServer

TTL = 15.0


@pytest.fixture
def azurite(tmp_path, monkeypatch):
    server = AzuriteServer(tmp_path).start()
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", server.connection_string)
    yield server
    server.stop()


@pytest.fixture
def azure_url(azurite):
    return f"azureblob://c{uuid.uuid4().hex[:12]}/leases"


def managers(url: str, count: int, history: History, timing: LeaseTiming | None = None):
    timing = timing or LeaseTiming.create(TTL, renew_fraction=0.25)
    made = []
    for i in range(count):
        store = open_store(url, timeout=timing.op_timeout)
        manager = LeaseManager(
            store,
            "job",
            timing,
            holder=Holder.for_this_process(f"m{i}"),
            listeners=(history.listener(f"m{i}"),),
        )
        made.append(manager)
    return made


def warm(url: str) -> None:
    store = open_store(url, timeout=2)
    holder = Holder.for_this_process("warm")
    assert store.acquire("job", holder, TTL).acquired
    assert store.release("job", holder.lease_id)
    store.close()


def wait_leader(group, timeout, exclude=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for manager in group:
            if manager is not exclude and manager.is_leader():
                return manager
        time.sleep(0.02)
    raise AssertionError("no leader")


def test_lease_ids_are_guids():
    """Azure accepts only GUID lease ids: our hex ids are sent in GUID form."""
    guid = lease_guid(uuid.uuid4().hex)
    assert str(uuid.UUID(guid)) == guid
    assert str(uuid.UUID(lease_guid("not-a-hex-id"))) == lease_guid("not-a-hex-id")


def test_one_leader_and_immediate_handover_on_release(azure_url):
    """Two managers: one leads; a graceful stop hands over at the watch interval, not the ttl."""
    warm(azure_url)
    history = History()
    group = managers(azure_url, 2, history)
    for manager in group:
        manager.start()
    try:
        leader = wait_leader(group, 5)
        time.sleep(1)
        assert sum(m.is_leader() for m in group) == 1
        stopped = time.monotonic()
        leader.stop()
        successor = wait_leader(group, 3, exclude=leader)
        assert time.monotonic() - stopped < 2.0
        assert successor.current_token() > history.terms()[0].token
    finally:
        for manager in group:
            manager.stop()
    assert history.overlaps() == []


@pytest.mark.slow
def test_takeover_after_the_leader_stops_renewing(azure_url):
    """A leader that vanishes without releasing: another leads once Azure expires the lease."""
    warm(azure_url)
    history = History()
    group = managers(azure_url, 2, history)
    for manager in group:
        manager.start()
    try:
        leader = wait_leader(group, 5)
        frozen = time.monotonic()
        # Simulate a crash: stop the thread without releasing the lease.
        leader.stop(release=False)
        successor = wait_leader(group, TTL + 10, exclude=leader)
        took = time.monotonic() - frozen
        assert TTL * 0.5 < took < TTL + 5, took
        assert successor is not leader
    finally:
        for manager in group:
            manager.stop()
    assert history.overlaps() == []


@pytest.mark.slow
def test_azurite_paused_past_ttl_leader_steps_down_in_time(azurite, azure_url):
    """SIGSTOP Azurite past the ttl: loss is declared before validity ends; it leads again after."""
    warm(azure_url)
    history = History()
    (manager,) = managers(azure_url, 1, history)
    manager.start()
    try:
        wait_leader([manager], 5)
        azurite.pause()
        try:
            deadline = time.monotonic() + TTL + 2
            while manager.is_leader() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not manager.is_leader()
            assert manager.running
        finally:
            azurite.resume()
        lost = [e for _, e in history.events if e.kind is EventKind.LOST]
        assert lost and lost[0].at <= lost[0].term.valid_until
        assert wait_leader([manager], TTL + 10) is manager
    finally:
        manager.stop()


def test_wrong_key_is_a_clear_masked_error(azurite):
    """A wrong account key: StoreAuthError naming the store; neither key appears."""
    wrong = azurite.connection_string.replace(AZURITE_KEY, "d3JvbmdrZXl3cm9uZ2tleQ==")
    store = open_store(
        "azureblob://leases/app", timeout=2, options={"leader_azure_connection_string": wrong}
    )
    try:
        with pytest.raises(StoreAuthError) as info:
            store.acquire("job", Holder.for_this_process(), TTL)
        message = str(info.value)
        assert "azureblob://leases/app" in message
        assert "d3JvbmdrZXl3cm9uZ2tleQ==" not in message and AZURITE_KEY not in message
    finally:
        store.close()


def test_bad_connection_string_is_a_configuration_error(monkeypatch):
    """A malformed connection string is refused at start, without echoing it."""
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    with pytest.raises(ConfigurationError) as info:
        open_store(
            "azureblob://leases/app",
            timeout=2,
            options={"leader_azure_connection_string": "AccountKey=s3cr3tvalue;nonsense"},
        )
    assert "leader_azure_connection_string" in str(info.value)
    assert "s3cr3tvalue" not in str(info.value)


def test_missing_account_is_a_configuration_error(monkeypatch):
    """No connection string and no account URL: the error says what to set."""
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    with pytest.raises(ConfigurationError, match="leader_azure_account_url"):
        open_store("azureblob://leases/app", timeout=2)


@pytest.mark.parametrize("ttl", [10, 90, 14.9, 61])
def test_ttl_outside_azure_range_is_refused(ttl):
    """leader_lease_ttl outside 15..60 with an Azure store: refused, naming key and range."""
    with pytest.raises(ConfigurationError) as info:
        load_settings({"leader_backend_url": "azureblob://c/b", "leader_lease_ttl": ttl}, "app")
    assert "leader_lease_ttl" in str(info.value) and "15..60" in str(info.value)


def test_azure_defaults_are_ttl_15_and_renew_a_quarter():
    """Without settings, an Azure store gets ttl 15 s and renews every ttl/4."""
    settings = load_settings({"leader_backend_url": "azureblob://c/b"}, "app")
    assert settings.timing.ttl == 15.0
    assert settings.timing.renew_interval == pytest.approx(3.75)


def test_unreachable_azure_never_raises_out_of_the_manager(caplog, monkeypatch):
    """Nothing listens at the endpoint: one clear error in the log, secrets masked, no crash."""
    from tests.servers import AZURITE_ACCOUNT, free_port

    port = free_port()
    conn = (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
        f"BlobEndpoint=http://127.0.0.1:{port}/{AZURITE_ACCOUNT};"
    )
    timing = LeaseTiming.create(TTL, renew_fraction=0.25)
    store = open_store(
        "azureblob://leases/app",
        timeout=timing.op_timeout,
        options={"leader_azure_connection_string": conn},
    )
    manager = LeaseManager(store, "job", timing)
    manager.start()
    try:
        time.sleep(2)
        assert manager.running and not manager.is_leader()
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1, errors
        assert AZURITE_KEY not in caplog.text
    finally:
        manager.stop()
