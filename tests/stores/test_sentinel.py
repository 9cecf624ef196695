"""The Sentinel store: its URL, its settings, and a failover that lost writes, on real servers."""

from __future__ import annotations

import time

import pytest

from celery_leader._masking import mask_url
from celery_leader.exceptions import ConfigurationError
from celery_leader.settings import load_app_settings
from celery_leader.stores import Holder, open_store
from celery_leader.stores.sentinel import parse_sentinel_url
from harness.servers import SentinelRedis

URL = "sentinel://:s3cret@10.0.0.1:26379;sentinel://:s3cret@10.0.0.2:26380/2?master_name=main"


def test_the_url_lists_every_sentinel_and_names_the_primary():
    parsed = parse_sentinel_url(URL)
    assert parsed.sentinels == [("10.0.0.1", 26379), ("10.0.0.2", 26380)]
    assert (parsed.password, parsed.db, parsed.master_name) == ("s3cret", 2, "main")
    assert parse_sentinel_url("sentinel://h").sentinels == [("h", 26379)], "the default port"
    acl = parse_sentinel_url("sentinel://app:pw@h:1;sentinel://app:pw@h:2")
    assert (acl.username, acl.password) == ("app", "pw"), "an ACL user, as kombu passes it"
    assert parse_sentinel_url("sentinel://secret@h:1").password == "secret", "password alone"
    semicolon = parse_sentinel_url("sentinel://:pa;ss@h:1;sentinel://:pa;ss@h:2")
    assert semicolon.password == "pa;ss" and len(semicolon.sentinels) == 2


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("sentinel://h:1;redis://h:2", "each part must be sentinel://host:port"),
        ("sentinel://h:1/zero", "the database 'zero' is not a number"),
        ("sentinel://h:notaport", "a host:port is not valid"),
    ],
)
def test_a_bad_url_names_the_form(url, why):
    with pytest.raises(ConfigurationError) as found:
        parse_sentinel_url(url)
    assert why in str(found.value) and "sentinel://[:password@]host:port" in str(found.value)


@pytest.mark.parametrize(
    "url",
    [
        URL,
        "sentinel://s3cret@h:1;sentinel://s3cret@h:2/0",
        "sentinel://:pa;s3cret@h:1;sentinel://:pa;s3cret@h:2",
        "postgresql://u:se/s3cret@h:5432/db",
        "postgresql://u@h/db?sslpassword=s3cret",
    ],
)
def test_every_password_in_the_url_is_masked(url):
    masked = mask_url(url)
    assert "s3cret" not in masked and "***" in masked, masked


def test_without_a_primary_name_the_error_says_where_to_set_it():
    with pytest.raises(ConfigurationError, match="leader_sentinel_master_name") as found:
        open_store("sentinel://:s3cret@127.0.0.1:1", timeout=1)
    assert "s3cret" not in str(found.value)


def test_the_primary_name_comes_from_the_broker_transport_options():
    conf = {
        "broker_url": "sentinel://127.0.0.1:26379;sentinel://127.0.0.1:26380",
        "broker_transport_options": {"master_name": "main", "sentinel_kwargs": {"x": 1}},
    }
    settings = load_app_settings(conf, "proj")
    assert settings.backend_url.startswith("sentinel://"), "a Sentinel broker is the default"
    assert settings.store_options["leader_sentinel_master_name"] == "main"
    assert settings.store_options["leader_sentinel_kwargs"] == {"x": 1}
    other = load_app_settings({**conf, "leader_backend_url": "sentinel://10.1.1.1:26379"}, "proj")
    assert "leader_sentinel_master_name" not in other.store_options, "not the broker's sentinels"
    given = load_app_settings({**conf, "leader_sentinel_master_name": "own"}, "proj")
    assert given.store_options["leader_sentinel_master_name"] == "own", "its own key first"
    with pytest.raises(ConfigurationError, match="leader_sentinel_master_name=5 is not allowed"):
        load_app_settings({**conf, "leader_sentinel_master_name": 5}, "proj")


@pytest.mark.slow
def test_a_failover_to_a_replica_that_missed_the_acquire_holds_the_next_holder_off(tmp_path):
    """The replica never got the lease (its link is cut); the primary dies; the promoted
    replica has no lease, another run id: the next holder waits one ttl, with a greater
    token, while the old holder cannot renew there and declares loss."""
    servers = SentinelRedis(tmp_path, proxied_replica=True).start()
    store = open_store(servers.url, timeout=1)
    try:
        assert servers.proxy is not None
        earlier, old = Holder("earlier", "w1", "h", 1), Holder("old", "w1", "h", 1)
        new = Holder("new", "w2", "h", 2)
        assert store.acquire("x", earlier, 5.0).acquired  # a first term, replicated
        assert store.release("x", "earlier")
        servers.wait_replicated()
        time.sleep(0.3)  # the release reached the replica
        servers.proxy.set_mode("blackhole")  # from now on the replica hears nothing
        first = store.acquire("x", old, 5.0)
        assert first.acquired and first.hold_off == 0, "a known store: no hold-off"
        primary = servers.primary_port()
        assert primary is not None
        servers.server_on(primary).stop()  # SIGKILL: the acquire above never left it
        servers.wait_failover(primary)
        deadline = time.monotonic() + 10
        while True:
            try:
                renewed = store.renew("x", "old", 5.0)
                break
            except Exception:  # noqa: BLE001 - reconnecting to the promoted replica
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert renewed is False, "the promoted replica never saw the old holder's lease"
        taken = store.acquire("x", new, 5.0)
        assert taken.acquired and taken.token is not None and first.token is not None
        assert taken.token > first.token
        assert taken.hold_off >= 4.9, f"another incarnation of the data: hold off one ttl ({taken})"
    finally:
        store.close()
        servers.stop()


def _fencing_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "min-replicas-to-write" in r.getMessage()]


def test_a_primary_that_accepts_unreplicated_writes_is_warned_of_once(tmp_path, caplog):
    """Without min-replicas-to-write, a holder cut off with the old primary renews there while
    the sentinels promote a replica: the store says so once, and not when it is set."""
    sentinels = SentinelRedis(tmp_path).start()
    try:
        caplog.set_level("WARNING", logger="celery_leader.stores.sentinel")
        for index in range(2):  # two stores of one process on one URL
            store = open_store(sentinels.url, timeout=2)
            try:
                assert store.acquire(f"fenced{index}", Holder.for_this_process("n"), 5).acquired
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and not _fencing_warnings(caplog):
                    time.sleep(0.05)
            finally:
                store.close()
        warned = _fencing_warnings(caplog)
        assert len(warned) == 1, warned
        assert "min-replicas-max-lag" in warned[0] and sentinels.master_name in warned[0]
        caplog.clear()
        sentinels.primary.client().config_set("min-replicas-to-write", 1)
        sentinels.primary.client().config_set("min-replicas-max-lag", 2)
        # Another URL (db 1): warned of once per URL, so this one is checked afresh.
        store = open_store(sentinels.url.replace("/0?", "/1?"), timeout=2)
        try:
            assert store.acquire("fenced2", Holder.for_this_process("n"), 5).acquired
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not store.fencing_checked:
                time.sleep(0.05)
            assert store.fencing_checked, "the check ran"
        finally:
            store.close()
        assert _fencing_warnings(caplog) == []
    finally:
        sentinels.stop()
