"""RenewBatch: renewals that arrive together go out as one renew_many call, each with its answer."""

from __future__ import annotations

import threading

import pytest

from celery_leader.exceptions import StoreError
from celery_leader.stores.batch import RenewBatch


class Counting:
    """A BatchRenew store that records each call (pure logic: what the batch sends)."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[list[tuple[str, str]]] = []
        self.fail = fail

    def renew_many(self, leases, ttl):
        self.calls.append(list(leases))
        if self.fail:
            raise StoreError("store down")
        return [lease_id == "ok" for _, lease_id in leases]


def renew_together(batch, leases):
    answers: dict[str, object] = {}

    def one(name, lease_id):
        try:
            answers[name] = batch.renew(name, lease_id, 3.0)
        except StoreError as exc:
            answers[name] = exc

    threads = [threading.Thread(target=one, args=lease) for lease in leases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    return answers


def test_renewals_within_the_window_go_out_in_one_call_with_their_own_answers():
    store = Counting()
    batch = RenewBatch(store, window=0.2)
    answers = renew_together(batch, [("a", "ok"), ("b", "stale"), ("c", "ok")])
    assert answers == {"a": True, "b": False, "c": True}
    assert len(store.calls) == 1 and sorted(store.calls[0]) == [
        ("a", "ok"),
        ("b", "stale"),
        ("c", "ok"),
    ]


def test_a_failed_call_fails_every_renewal_in_it():
    batch = RenewBatch(Counting(fail=True), window=0.1)
    answers = renew_together(batch, [("a", "ok"), ("b", "ok")])
    assert all(isinstance(answer, StoreError) for answer in answers.values())


def test_a_view_renews_through_the_batch_and_passes_the_rest_on():
    class Store:
        url = "memory://x"

        def read(self, name):
            return f"read {name}"

    counting = Counting()
    view = RenewBatch(counting, window=0.0).view(Store())
    assert view.renew("a", "ok", 3.0) is True
    assert counting.calls == [[("a", "ok")]]
    assert view.read("a") == "read a" and view.url == "memory://x"
    with pytest.raises(AttributeError):
        view.no_such_call  # noqa: B018 - the delegation raises like the store would


def test_a_wrong_number_of_answers_fails_every_renewal_in_the_call():
    class Short(Counting):
        def renew_many(self, leases, ttl):
            super().renew_many(leases, ttl)
            return [True]

    answers = renew_together(RenewBatch(Short(), window=0.1), [("a", "ok"), ("b", "ok")])
    assert all(isinstance(answer, StoreError) for answer in answers.values()), answers


def test_redis_answers_a_foreign_key_for_its_own_lease_only(redis_server):
    """A meta key holding another type (WRONGTYPE) fails that lease's renewal, not the batch."""
    import redis

    from celery_leader.stores import Holder, open_store
    from celery_leader.stores.redis import meta_key

    store = open_store(redis_server.url, timeout=2)
    try:
        mine = Holder("mine", "n", "h", 1)
        assert store.acquire("a", mine, 5.0).acquired
        assert store.acquire("b", mine, 5.0).acquired
        redis.Redis.from_url(redis_server.url).set(meta_key("b"), "not a hash")
        assert store.renew_many([("a", "mine"), ("b", "mine")], 5.0) == [True, False]
    finally:
        store.close()


def test_a_renew_grid_is_at_most_the_renew_interval():
    from celery_leader.lease import LeaseManager
    from celery_leader.lease.timing import LeaseTiming

    timing = LeaseTiming.create(3.0)
    store = RenewBatch(Counting()).view(object())  # never called: the manager is not started
    for bad in (0.0, -1.0, timing.renew_interval * 2):
        with pytest.raises(ValueError, match="renew_grid"):
            LeaseManager(store, "x", timing, renew_grid=bad)
