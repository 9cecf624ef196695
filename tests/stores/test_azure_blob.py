"""Azure Blob store against Azurite: elections, pauses, bad credentials, ttl rules."""

from __future__ import annotations

import logging
import time
import uuid

import pytest

from celery_leader.exceptions import ConfigurationError, StoreAuthError
from celery_leader.lease import EventKind, LeaseManager
from celery_leader.lease.timing import LeaseTiming
from celery_leader.settings import load_settings
from celery_leader.stores import open_store
from celery_leader.stores.azure_blob import lease_guid
from celery_leader.stores.base import Holder
from harness.servers import AZURITE_KEY, AzuriteServer
from tests.history import History

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
    from harness.servers import AZURITE_ACCOUNT, free_port

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


# -- a broken lease, Azure's clock, internal errors ----------------------------

import contextlib  # noqa: E402 - appended section: its own imports
import types  # noqa: E402

from azure.core.exceptions import HttpResponseError  # noqa: E402
from azure.storage.blob import BlobLeaseClient, BlobServiceClient  # noqa: E402

from celery_leader.exceptions import StoreError  # noqa: E402
from celery_leader.lease import LossReason  # noqa: E402
from celery_leader.stores import azure_blob  # noqa: E402
from celery_leader.stores.azure_blob import AzureBlobLeaseStore  # noqa: E402


def container_of(url: str) -> str:
    return url.split("/")[2]


def blob_client(azurite, url: str, name: str = "job"):
    service = BlobServiceClient.from_connection_string(azurite.connection_string, retry_total=0)
    return service.get_blob_client(container_of(url), f"leases/{name}")


def break_lease(azurite, url: str) -> None:
    """What an operator (or a script) does: break the lease at once."""
    BlobLeaseClient(blob_client(azurite, url)).break_lease(lease_break_period=0)


def test_broken_lease_makes_the_next_holder_hold_off(azurite, azure_url):
    """Someone breaks the leader's lease: the next holder holds off one ttl, not at once."""
    warm(azure_url)
    store = open_store(azure_url, timeout=2)
    try:
        first_holder, second_holder = Holder.for_this_process("a"), Holder.for_this_process("b")
        first = store.acquire("job", first_holder, TTL)
        assert first.acquired and first.hold_off == 0
        break_lease(azurite, azure_url)
        assert not store.renew("job", first_holder.lease_id, TTL)
        second = store.acquire("job", second_holder, TTL)
        assert second.acquired and second.hold_off >= TTL
        assert second.token > first.token
        record = store.read("job")
        assert record is not None and record.hold_off >= TTL - 1
        # Our own lease again (the reply was lost): its hold-off still runs.
        again = store.acquire("job", second_holder, TTL)
        assert again.acquired and again.hold_off >= TTL - 1 and again.token > second.token
    finally:
        store.close()


@pytest.mark.slow
def test_broken_lease_under_managers_never_overlaps(azurite, azure_url):
    """Break the leader's lease: it stops at its next renewal; the next one waits a ttl."""
    warm(azure_url)
    history = History()
    group = managers(azure_url, 2, history)
    for manager in group:
        manager.start()
    try:
        leader = wait_leader(group, 5)
        before = [t.token for t in history.terms()]
        break_lease(azurite, azure_url)
        broke_at = time.monotonic()
        successor = wait_leader(group, TTL + 10, exclude=leader)
        assert time.monotonic() - broke_at >= TTL, "the next holder held off one ttl"
        assert not leader.is_leader()
        lost = [e for _, e in history.events if e.kind is EventKind.LOST]
        assert lost and lost[0].reason is LossReason.RENEW_REJECTED
        assert lost[0].at <= lost[0].term.valid_until
        assert successor.current_token() > max(before)
    finally:
        for manager in group:
            manager.stop()
    assert history.overlaps() == []


def client_clock_behind(seconds: float) -> types.SimpleNamespace:
    """The time module as a client whose wall clock is *seconds* behind sees it."""
    fields = {name: getattr(time, name) for name in dir(time) if not name.startswith("_")}
    fields["time"] = lambda: time.time() - seconds
    fields["time_ns"] = lambda: time.time_ns() - int(seconds * 1e9)
    return types.SimpleNamespace(**fields)


def test_tokens_and_hold_off_come_from_azures_clock(azurite, azure_url, monkeypatch):
    """A client whose clock is an hour behind, after the store lost its data (twice).

    Its token must still exceed every earlier one (Azure's clock, not the
    client's), and the hold-off it records must read the same to a client
    with a correct clock.
    """
    warm(azure_url)  # the first loss: a new blob
    store = open_store(azure_url, timeout=2)
    try:
        tokens = []
        for tag in ("a", "b"):
            holder = Holder.for_this_process(tag)
            result = store.acquire("job", holder, TTL)
            tokens.append(result.token)
            assert store.release("job", holder.lease_id)
        time.sleep(1.1)  # Azure's clock has whole seconds: the next loss is in a later one
        service = BlobServiceClient.from_connection_string(azurite.connection_string)
        service.delete_container(container_of(azure_url))  # the second loss
        behind = open_store(azure_url, timeout=2)
        with monkeypatch.context() as patch:
            patch.setattr(azure_blob, "time", client_clock_behind(3600))
            late = behind.acquire("job", Holder.for_this_process("late"), TTL)
        behind.close()
        assert late.acquired and late.hold_off >= TTL
        assert late.token > max(tokens), (late.token, tokens)
        record = store.read("job")
        assert record is not None and record.token == late.token
        assert TTL - 2 <= record.hold_off <= TTL + 1
        assert abs(record.acquired_at - time.time()) < 5
    finally:
        store.close()


def test_token_is_at_least_azures_clock_on_every_acquire(azurite, azure_url):
    """A counter far behind Azure's clock (an old copy of the blob): tokens jump to the clock."""
    warm(azure_url)
    blob = blob_client(azurite, azure_url)
    blob.upload_blob(b'{"last_token": 5}', overwrite=True)
    store = open_store(azure_url, timeout=2)
    try:
        floor = int(time.time() - 2) * 1_000_000
        result = store.acquire("job", Holder.for_this_process("a"), TTL)
        assert result.acquired and result.token >= floor
    finally:
        store.close()


def store_with_request_hook(azurite, url: str, hook) -> AzureBlobLeaseStore:
    """A store whose HTTP requests first run *hook* (to race them with real requests)."""
    service = BlobServiceClient.from_connection_string(
        azurite.connection_string, retry_total=0, raw_request_hook=hook
    )
    container, prefix = container_of(url), url.split("/", 3)[3]
    return AzureBlobLeaseStore(service, container, prefix, url, timeout=2)


def test_lease_taken_between_acquire_and_write_is_a_store_error(azurite, azure_url):
    """Our lease is broken and taken by another right after Azure granted it to us.

    The read and write under our lease then fail with "not our lease": the
    acquire must end in a StoreError, not leak an internal exception.
    """
    warm(azure_url)
    other = Holder.for_this_process("other")
    done = []

    def hook(request) -> None:
        http = request.http_request
        if done or http.method != "GET" or "x-ms-lease-id" not in http.headers:
            return
        done.append(True)  # the download under the lease we just got: take the lease away
        break_lease(azurite, azure_url)
        BlobLeaseClient(
            blob_client(azurite, azure_url), lease_id=lease_guid(other.lease_id)
        ).acquire(lease_duration=int(TTL))

    store = store_with_request_hook(azurite, azure_url, hook)
    try:
        with pytest.raises(StoreError, match="acquire failed"):
            store.acquire("job", Holder.for_this_process("a"), TTL)
        assert done
        assert not store.renew("job", Holder.for_this_process("a").lease_id, TTL)
    finally:
        store.close()


def test_blob_gone_while_reading_the_holder_is_not_acquired(azurite, azure_url):
    """The lease is held; the container vanishes before the holder is read: no internal error."""
    warm(azure_url)
    keeper = open_store(azure_url, timeout=2)
    assert keeper.acquire("job", Holder.for_this_process("keeper"), TTL).acquired
    keeper.close()
    state = {"lease_sent": False, "deleted": False}

    def hook(request) -> None:
        http = request.http_request
        if http.headers.get("x-ms-lease-action") == "acquire":
            state["lease_sent"] = True
        elif state["lease_sent"] and not state["deleted"] and http.method in ("HEAD", "GET"):
            state["deleted"] = True
            service = BlobServiceClient.from_connection_string(azurite.connection_string)
            service.delete_container(container_of(azure_url))

    store = store_with_request_hook(azurite, azure_url, hook)
    try:
        try:
            result = store.acquire("job", Holder.for_this_process("a"), TTL)
        except StoreError:
            pass  # also fine: what is not allowed is any other exception
        else:
            assert not result.acquired
        assert state["deleted"]
    finally:
        store.close()


@pytest.mark.parametrize(
    "content",
    [b'{"state": [1, 2]}', b'{"state": "text"}', b'{"holder": [], "last_token": "x"}', b"[1]"],
)
def test_foreign_blob_content_never_raises_anything_but_store_errors(azure_url, azurite, content):
    """Content this store did not write: every method answers or raises StoreError only."""
    warm(azure_url)
    blob_client(azurite, azure_url).upload_blob(content, overwrite=True)
    store = open_store(azure_url, timeout=2)
    holder = Holder.for_this_process("a")
    try:
        calls = [
            lambda: store.get_state("job"),
            lambda: store.read("job"),
            lambda: store.acquire("job", holder, TTL),
            lambda: store.set_state("job", holder.lease_id, "k", "v"),
            lambda: store.get_state("job"),
            lambda: store.renew("job", holder.lease_id, TTL),
            lambda: store.release("job", holder.lease_id),
        ]
        for call in calls:
            with contextlib.suppress(StoreError):
                call()
    finally:
        store.close()


def test_no_store_method_leaks_an_azure_error(azurite, azure_url):
    """Every method on a missing container answers or raises StoreError, never an SDK error."""
    store = open_store(azure_url, timeout=2)
    holder = Holder.for_this_process("a")
    try:
        assert store.read("job") is None
        assert store.get_state("job") == {}
        assert not store.renew("job", holder.lease_id, TTL)
        assert not store.release("job", holder.lease_id)
        assert not store.set_state("job", holder.lease_id, "k", "v")
        assert store.lease_is_free("job")
    except HttpResponseError as exc:  # pragma: no cover - the failure this guards against
        pytest.fail(f"SDK error leaked: {exc!r}")
    finally:
        store.close()
