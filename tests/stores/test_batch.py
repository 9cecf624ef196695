"""CallBatch: renewals and acquires that arrive together go out as one call_many, each answered."""

from __future__ import annotations

import threading

import pytest

from celery_leader.exceptions import StoreError
from celery_leader.stores.base import AcquireResult, Holder
from celery_leader.stores.batch import CallBatch


class Counting:
    """A BatchCalls store that records each call (pure logic: what the batch sends)."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[list[tuple[str, str]], list[str]]] = []
        self.fail = fail

    def call_many(self, renewals, acquires, ttl):
        self.calls.append((list(renewals), [request.name for request in acquires]))
        if self.fail:
            raise StoreError("store down")
        acquired = [
            StoreError(f"acquire {r.name}: refused")
            if r.name == "broken"
            else AcquireResult(acquired=r.name.startswith("free"), token=7)
            for r in acquires
        ]
        return [lease_id == "ok" for _, lease_id in renewals], acquired


def together(batch, calls):
    """Run each call (("renew", name, lease id) or ("acquire", name)) on its own thread."""
    answers: dict[str, object] = {}

    def one(kind, name, *rest):
        try:
            if kind == "renew":
                answers[name] = batch.renew(name, rest[0], 3.0)
            else:
                answers[name] = batch.acquire(name, Holder("id", "n", "h", 1), 3.0)
        except StoreError as exc:
            answers[name] = exc

    threads = [threading.Thread(target=one, args=call) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    return answers


def test_calls_within_the_window_go_out_in_one_round_trip_with_their_own_answers():
    store = Counting()
    batch = CallBatch(store, window=0.2)
    answers = together(
        batch,
        [
            ("renew", "a", "ok"),
            ("renew", "b", "stale"),
            ("acquire", "free-c"),
            ("acquire", "held-d"),
            ("acquire", "broken"),
        ],
    )
    assert answers["a"] is True and answers["b"] is False
    assert answers["free-c"].acquired and not answers["held-d"].acquired
    assert isinstance(answers["broken"], StoreError), "an acquire's own error, for it alone"
    assert len(store.calls) == 1
    renewals, acquires = store.calls[0]
    assert sorted(renewals) == [("a", "ok"), ("b", "stale")]
    assert sorted(acquires) == ["broken", "free-c", "held-d"]


def test_a_failed_call_fails_every_call_in_it():
    batch = CallBatch(Counting(fail=True), window=0.1)
    answers = together(batch, [("renew", "a", "ok"), ("acquire", "free-b")])
    assert all(isinstance(answer, StoreError) for answer in answers.values())


def test_a_view_renews_and_acquires_through_the_batch_and_passes_the_rest_on():
    class Store:
        url = "memory://x"

        def read(self, name):
            return f"read {name}"

    counting = Counting()
    view = CallBatch(counting, window=0.0).view(Store())
    assert view.renew("a", "ok", 3.0) is True
    assert view.acquire("free-b", Holder("id", "n", "h", 1), 3.0).acquired
    assert counting.calls == [([("a", "ok")], []), ([], ["free-b"])]
    assert view.read("a") == "read a" and view.url == "memory://x"
    with pytest.raises(AttributeError):
        view.no_such_call  # noqa: B018 - the delegation raises like the store would


def test_a_wrong_number_of_answers_fails_every_call_in_the_round_trip():
    class Short(Counting):
        def call_many(self, renewals, acquires, ttl):
            renewed, acquired = super().call_many(renewals, acquires, ttl)
            return renewed[:1], acquired

    answers = together(CallBatch(Short(), window=0.1), [("renew", "a", "ok"), ("renew", "b", "ok")])
    assert all(isinstance(answer, StoreError) for answer in answers.values()), answers


def test_redis_answers_a_foreign_key_for_its_own_lease_only(redis_server):
    """A key holding another type fails that lease's call, not the round trip."""
    import redis

    from celery_leader.stores import open_store
    from celery_leader.stores.base import AcquireRequest
    from celery_leader.stores.redis import lease_key, meta_key

    store = open_store(redis_server.url, timeout=2)
    try:
        mine = Holder("mine", "n", "h", 1)
        assert store.acquire("a", mine, 5.0).acquired
        assert store.acquire("b", mine, 5.0).acquired
        client = redis.Redis.from_url(redis_server.url)
        client.set(meta_key("b"), "not a hash")
        client.hset(lease_key("c"), "x", "a hash where a lease should be")
        renewed, acquired = store.call_many(
            [("a", "mine"), ("b", "mine")],
            [AcquireRequest("c", mine), AcquireRequest("d", mine)],
            5.0,
        )
        assert renewed == [True, False]
        assert isinstance(acquired[0], StoreError), acquired[0]
        assert isinstance(acquired[1], AcquireResult) and acquired[1].acquired
    finally:
        store.close()


def test_a_renew_grid_is_at_most_the_renew_interval():
    from celery_leader.lease import LeaseManager
    from celery_leader.lease.timing import LeaseTiming

    timing = LeaseTiming.create(3.0)
    store = CallBatch(Counting()).view(object())  # never called: the manager is not started
    for bad in (0.0, -1.0, timing.renew_interval * 2):
        with pytest.raises(ValueError, match="renew_grid"):
            LeaseManager(store, "x", timing, renew_grid=bad)


def test_a_store_that_cannot_batch_answers_renewals_before_slow_acquires():
    """One call per lease (a cluster-mode Redis): a renewal never waits for the acquires."""
    import time

    class OneByOne(Counting):
        batches = False

        def call_many(self, renewals, acquires, ttl):
            if acquires:
                time.sleep(0.6)  # acquires on an unreachable shard, one after another
            return super().call_many(renewals, acquires, ttl)

    batch = CallBatch(OneByOne(), window=0.05)
    answered: dict[str, float] = {}
    started = time.monotonic()

    def renew():
        batch.renew("a", "ok", 3.0)
        answered["renew"] = time.monotonic() - started

    def acquire():
        batch.acquire("free-b", Holder("id", "n", "h", 1), 3.0)
        answered["acquire"] = time.monotonic() - started

    threads = [threading.Thread(target=renew), threading.Thread(target=acquire)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    assert answered["renew"] < 0.4 < answered["acquire"], answered
