"""What a new leader's line says of the term it follows: released, expired, or not known.

The real LeaseManager driven step by step on a virtual clock, against the
model store of :mod:`tests.lease.test_lease_deadlines` that also says who
holds the lease when an acquire is refused.
"""

from __future__ import annotations

import logging

from celery_leader.stores.base import AcquireResult, LeaseRecord
from tests.lease.test_lease_deadlines import Clock, ModelStore, drive, make


class StoryStore(ModelStore):
    """The model store, naming the holder (n2, token 7) when it refuses an acquire."""

    def acquire(self, name, holder, ttl, min_token=0):
        result = super().acquire(name, holder, ttl, min_token)
        if result.acquired:
            return result
        record = LeaseRecord("n2", "h2", 2, 7, 0.0, self.expires_at - self.clock())
        return AcquireResult(acquired=False, retry_in=result.retry_in, holder=record)

    def release_by_holder(self) -> None:
        self.holder = None


def follow(delays, release_at=None):
    """n1 follows n2 (lease ends at 102); n2 may release at *release_at*; n1's line."""
    clock, events = Clock(), []
    store = StoryStore(clock)
    store.holder, store.expires_at = "n2-lease", 102.0
    manager = make(clock, store, events, acquire_delay=lambda: next(delays, 0.0))
    if release_at is not None:
        drive(manager, clock, release_at)
        store.release_by_holder()
        manager._on_store_change()  # what the store's release notification calls
    drive(manager, clock, 106.0)  # from the release on: the notification woke the manager
    assert manager.is_leader()
    return manager


def line_of(caplog) -> str:
    (line,) = [r.getMessage() for r in caplog.records if "leads election" in r.getMessage()]
    return line


def test_a_release_taken_at_once_is_a_release(caplog):
    """n2 released at 100.5 and n1, woken by the notification, took it then."""
    with caplog.at_level(logging.INFO, logger="celery_leader.lease.manager"):
        follow(iter([]), release_at=100.5)
    assert line_of(caplog).endswith("after n2 (token 7), which released it")


def test_a_lease_that_ran_out_expired(caplog):
    """No release heard: the lease ran out at 102 and n1 took it then."""
    with caplog.at_level(logging.INFO, logger="celery_leader.lease.manager"):
        follow(iter([]))
    assert line_of(caplog).endswith("after n2 (token 7), whose lease expired")


def test_held_back_past_a_release_it_does_not_claim_to_know_what_came_between(caplog):
    """n2 released at 100.5; a balancer held n1 back 3 s: another term may have come and gone
    meanwhile (n1 was not looking), so n2 is only the earliest predecessor it can name."""
    with caplog.at_level(logging.INFO, logger="celery_leader.lease.manager"):
        follow(iter([0.0, 3.0]), release_at=100.5)
    assert line_of(caplog).endswith(
        "after n2 (token 7) or a later holder: this worker had not looked at the lease for 3.5 s"
    )


def test_a_release_heard_while_a_refused_attempt_was_on_its_way_is_a_release(caplog):
    """The store refused n1's attempt (n2 held it), and n2 released before the answer came."""
    clock, events = Clock(), []
    store = StoryStore(clock)
    store.holder, store.expires_at = "n2-lease", 102.0
    manager = make(clock, store, events)
    refuse = store.acquire

    def acquire(name, holder, ttl, min_token=0):
        result = refuse(name, holder, ttl, min_token)
        if not result.acquired:
            store.release_by_holder()
            manager._on_store_change()  # heard before the refusal reached n1
        return result

    store.acquire = acquire
    with caplog.at_level(logging.INFO, logger="celery_leader.lease.manager"):
        drive(manager, clock, 106.0)
    assert manager.is_leader()
    assert line_of(caplog).endswith("after n2 (token 7), which released it")


def test_held_back_while_the_holder_renewed_past_the_end_it_saw(caplog):
    """n1 looked at 100 (end 102) and was held back; n2 renewed and released at 103.5: n1
    does not call that an expiry of the lease it saw."""
    clock, events = Clock(), []
    store = StoryStore(clock)
    store.holder, store.expires_at = "n2-lease", 102.0
    delays = iter([0.0, 5.0])
    manager = make(clock, store, events, acquire_delay=lambda: next(delays, 0.0))
    drive(manager, clock, 101.0)
    store.expires_at = 105.0  # n2 renewed: n1, held back, does not look
    drive(manager, clock, 103.5)
    store.release_by_holder()
    manager._on_store_change()
    with caplog.at_level(logging.INFO, logger="celery_leader.lease.manager"):
        drive(manager, clock, 108.0)
    assert manager.is_leader()
    assert "or a later holder: this worker had not looked at the lease for" in line_of(caplog)
