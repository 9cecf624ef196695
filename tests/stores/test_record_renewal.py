"""What a lease record says about its holder's renewals, and whether a lease was ever held.

Run against every store of tests/store_matrix.py on a real server or file.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from celery_leader.stores.base import Holder, LeaseRecord, LeaseStore
from tests.store_matrix import kind_of

#: Azure's clock is read from the Date header, etcd counts a lease down: whole seconds.
CLOCK_SLACK = {"azureblob": 1.1, "etcd": 1.1}
DEFAULT_SLACK = 0.3


def slack(store: LeaseStore) -> float:
    """How far the store's own clock reading may be off (its resolution)."""
    return CLOCK_SLACK.get(kind_of(store.url).scheme, DEFAULT_SLACK)


def read_until(
    store: LeaseStore, accept: Callable[[LeaseRecord], bool], timeout: float = 10.0
) -> LeaseRecord:
    """The holder's record once *accept* takes it (a store may record a renewal a moment late)."""
    deadline = time.monotonic() + timeout
    record = store.read("job")
    while time.monotonic() < deadline:
        if record is not None and accept(record):
            return record
        time.sleep(0.1)
        record = store.read("job")
    raise AssertionError(f"the record never matched: {record}")


def test_record_says_how_long_ago_the_holder_renewed(make_store, lease_ttl):
    """renewed_ago: about 0 after an acquire, grows while nobody renews, about 0 again after."""
    store = make_store()
    assert store.acquire("job", Holder("id-a", "node-a", "host", 1), ttl=lease_ttl).acquired
    fresh = store.read("job")
    assert fresh is not None and fresh.renewed_ago is not None
    assert 0 <= fresh.renewed_ago <= slack(store)
    time.sleep(1.5)
    silent = make_store().read("job")  # any client reads it, not only the holder's
    assert silent is not None and silent.renewed_ago is not None
    assert 1.5 - slack(store) <= silent.renewed_ago <= 1.5 + 2 + slack(store)
    assert store.renew("job", "id-a", lease_ttl)
    renewed = read_until(
        store, lambda r: r.renewed_ago is not None and r.renewed_ago <= slack(store)
    )
    assert renewed.token == fresh.token


def test_refused_acquire_reports_the_holders_last_renewal(make_store, lease_ttl):
    """The holder in a refused acquire carries renewed_ago too (when the store reads it)."""
    store = make_store()
    assert store.acquire("job", Holder("id-a", "node-a", "host", 1), ttl=lease_ttl).acquired
    time.sleep(1.2)
    refused = make_store().acquire("job", Holder("id-b", "node-b", "host", 2), ttl=lease_ttl)
    assert not refused.acquired
    if refused.holder is not None:
        assert refused.holder.renewed_ago is not None
        assert refused.holder.renewed_ago >= 1.2 - slack(store)


def test_last_token_is_none_until_someone_held_the_lease(make_store, lease_ttl):
    """last_token: None on a store never used for the name; the latest token ever after."""
    store = make_store()
    assert store.last_token("job") is None  # type: ignore[attr-defined]
    first = store.acquire("job", Holder("id-a", "node-a", "host", 1), ttl=lease_ttl)
    assert first.acquired
    assert store.last_token("job") == first.token  # type: ignore[attr-defined]
    assert store.release("job", "id-a")
    assert store.read("job") is None
    assert make_store().last_token("job") == first.token  # type: ignore[attr-defined]
    assert store.last_token("other") is None  # type: ignore[attr-defined]


def test_a_state_write_keeps_the_last_renewal_known(make_store, lease_ttl):
    """set_state (beat's send marks) leaves renewed_ago known and unchanged in kind."""
    store = make_store()
    assert store.acquire("job", Holder("id-a", "node-a", "host", 1), ttl=lease_ttl).acquired
    assert store.renew("job", "id-a", lease_ttl)
    read_until(store, lambda r: r.renewed_ago is not None and r.renewed_ago <= slack(store))
    assert store.set_state("job", "id-a", "entry", '{"at": 1}')
    record = store.read("job")
    assert record is not None and record.renewed_ago is not None
    assert record.renewed_ago <= 2 + slack(store)
