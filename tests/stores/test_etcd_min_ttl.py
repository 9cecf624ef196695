"""etcd's minimum lease TTL: a ttl below it is refused at start; at or above it, the bound holds.

The members run etcd's default raft timings (heartbeat 100 ms, election
timeout 1 s), so the server's minimum TTL is ``ceil(1.5 x 1 s)`` = 2 s.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_leader.exceptions import ConfigurationError
from celery_leader.lease import LeaseManager, LeaseTiming
from celery_leader.stores import Holder, open_store
from celery_leader.stores.server_limits import check_server_limits
from harness.servers import EtcdCluster, etcd_post

#: etcd's own raft timings: the minimum lease TTL is then 2 s.
DEFAULT_RAFT = ["--heartbeat-interval", "100", "--election-timeout", "1000"]


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdCluster]:
    cluster = EtcdCluster(tmp_path, 1, extra=DEFAULT_RAFT).start()
    yield cluster
    cluster.close()


def leases(cluster: EtcdCluster) -> list[str]:
    answer = etcd_post(cluster.members[0].client_url, "/v3/lease/leases", {}, 5)
    return [lease["ID"] for lease in answer.get("leases") or []]


@pytest.mark.parametrize("ttl", [0.5, 1, 1.5])
def test_a_ttl_below_the_servers_minimum_is_refused_naming_the_smallest(etcd, ttl):
    """ttl 0.5, 1 or 1.5 on an etcd whose minimum is 2 s: one error naming both values."""
    store = open_store(etcd.url, timeout=5)
    with pytest.raises(ConfigurationError) as caught:
        check_server_limits(store, ttl)
    message = str(caught.value)
    assert f"leader_lease_ttl={ttl:g} is not allowed with the etcd store" in message
    assert "at least 2 s" in message and "leader_lease_ttl >= 2" in message
    assert "whole seconds" in message
    assert leases(etcd) == [], "the lease granted to ask was not revoked"


@pytest.mark.parametrize("ttl", [2, 2.5, 3])
def test_a_ttl_at_or_above_the_minimum_is_accepted(etcd, ttl):
    """ttl 2, 2.5 or 3: no error, and no lease left behind by the check."""
    check_server_limits(open_store(etcd.url, timeout=5), ttl)
    assert leases(etcd) == []


def test_an_etcd_unreachable_at_start_is_no_configuration_error(caplog):
    """Store trouble never stops a worker: the check is logged as skipped (port 9: nothing)."""
    check_server_limits(open_store("etcd://127.0.0.1:9/p", timeout=1), 0.5)
    assert "could not ask" in caplog.text


def test_an_acquire_that_etcd_lengthens_logs_the_error_once(etcd, caplog):
    """Not checked at start: the first acquire that etcd grants longer says so, once."""
    store = open_store(etcd.url, timeout=5)
    assert store.acquire("one", Holder("id-a", "a", "h", 1), 1).acquired
    assert store.acquire("two", Holder("id-a", "a", "h", 1), 1).acquired
    said = [r for r in caplog.records if "leader_lease_ttl=1 is not allowed" in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "ERROR"


def test_a_refused_acquire_leaves_no_etcd_lease_behind(etcd):
    """Only the holder's term has an etcd lease: attempts of others add none."""
    store = open_store(etcd.url, timeout=5)
    assert store.acquire("job", Holder("id-a", "a", "h", 1), 2).acquired
    for tag in "bcd":
        assert (
            not open_store(etcd.url, timeout=5).acquire("job", Holder(tag, tag, "h", 1), 2).acquired
        )
    assert len(leases(etcd)) == 1


@pytest.mark.parametrize("ttl", [2, 2.5])
def test_a_follower_leads_within_the_ttl_rounded_up_after_the_holder_stops(etcd, ttl):
    """The holder stops without releasing (a crash, to the store): the follower leads within
    ceil(ttl) + etcd's half-second expiry sweep + a generous margin."""
    timing = LeaseTiming.create(ttl)
    managers = [
        LeaseManager(open_store(etcd.url, timeout=1), "job", timing, holder=Holder(t, t, "h", 1))
        for t in ("a", "b")
    ]
    first, second = managers
    first.start()
    assert first.wait_for_leadership(10)
    second.start()
    time.sleep(timing.renew_interval * 2)  # the follower has seen the holder
    try:
        crashed_at = time.monotonic()
        threading.Thread(target=first.stop, kwargs={"release": False}).start()
        assert second.wait_for_leadership(math.ceil(ttl) + 0.5 + 3)
        waited = time.monotonic() - crashed_at
    finally:
        for manager in managers:
            manager.stop()
    assert waited <= math.ceil(ttl) + 0.5 + 3, waited
