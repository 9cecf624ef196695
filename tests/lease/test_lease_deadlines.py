"""The lease manager's deadlines under a virtual clock: loss on time, stop before release.

The real LeaseManager is driven step by step (``step()``) against a small
model store on the same virtual clock. Store calls go through an injected
caller that makes them take virtual time, as a slow or hanging store would.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from celery_leader.exceptions import StoreCallTimeoutError, StoreError
from celery_leader.lease import EventKind, LeaseEvent, LeaseManager, LossReason
from celery_leader.lease.bounded import BoundedCaller
from celery_leader.lease.timing import LeaseTiming
from celery_leader.stores.base import AcquireResult, Holder, NullWatch

TIMING = LeaseTiming.create(3.0)  # renew 1.0, margin 0.06, op_timeout 0.5


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class ModelStore:
    """One lease on the virtual clock; records the order of calls."""

    clock: Clock
    url: str = "model://"
    holder: str | None = None
    expires_at: float = 0.0
    token: int = 0
    calls: list[str] = field(default_factory=list)
    fail_with: BaseException | None = None

    def acquire(self, name, holder, ttl, min_token=0):
        self.calls.append("acquire")
        if self.fail_with is not None:
            raise self.fail_with
        if self.holder not in (None, holder.lease_id) and self.clock() < self.expires_at:
            return AcquireResult(acquired=False, retry_in=self.expires_at - self.clock())
        self.holder, self.expires_at = holder.lease_id, self.clock() + ttl
        self.token = max(self.token, min_token) + 1
        return AcquireResult(acquired=True, token=self.token)

    def renew(self, name, lease_id, ttl):
        self.calls.append("renew")
        if self.fail_with is not None:
            raise self.fail_with
        if self.holder != lease_id or self.clock() >= self.expires_at:
            return False
        self.expires_at = self.clock() + ttl
        return True

    def release(self, name, lease_id):
        self.calls.append("release")
        if self.holder == lease_id:
            self.holder = None
            return True
        return False

    def watch(self, name, callback):
        return NullWatch()


class SlowCaller:
    """Store calls take *delay* virtual seconds; past their bound they time out there."""

    def __init__(self, clock: Clock) -> None:
        self.clock, self.delay, self.bounds = clock, 0.0, []

    def __call__(self, fn, bound, what):
        self.bounds.append((what, bound))
        if self.delay > bound:
            self.clock.now += max(bound, 0.0)
            raise StoreCallTimeoutError(f"{what} timed out")
        self.clock.now += self.delay
        return fn()


def make(clock, store, events, **kwargs):
    return LeaseManager(
        store,
        "job",
        TIMING,
        holder=Holder("lease-1", "n1", "h", 1),
        listeners=(events.append,),
        clock=clock,
        rand=lambda: 0.5,
        call=kwargs.pop("call", None) or SlowCaller(clock),
        **kwargs,
    )


def drive(manager, clock, until):
    """Run the manager's steps on the virtual clock until *until*."""
    while clock.now < until:
        delay = manager.step()
        clock.now = min(until, clock.now + max(delay, 0.001))


def test_elected_then_renewed_every_interval():
    """A free lease is taken at once; renewals follow every renew_interval."""
    clock, events = Clock(), []
    store = ModelStore(clock)
    manager = make(clock, store, events)
    drive(manager, clock, 104.0)
    assert [e.kind for e in events][:1] == [EventKind.ELECTED]
    assert store.calls.count("renew") == 3  # at 101, 102 and 103
    assert manager.is_leader()


@pytest.mark.parametrize("delay", [0.3, 0.49, 0.8, 5.0])
def test_loss_is_declared_no_later_than_validity_whatever_the_store_takes(delay):
    """Slow or hanging renewals: LOST comes at or before the term's local validity."""
    clock, events = Clock(), []
    store = ModelStore(clock)
    caller = SlowCaller(clock)
    manager = make(clock, store, events, call=caller)
    manager.step()
    term = events[0].term
    caller.delay = delay
    store.fail_with = StoreError("unreachable")  # every call now fails, after its delay
    drive(manager, clock, 110.0)
    lost = [e for e in events if e.kind is EventKind.LOST]
    assert lost, "the lease was declared lost"
    assert lost[0].at <= term.valid_until
    assert all(bound <= TIMING.op_timeout + 1e-9 for _, bound in caller.bounds)


def test_a_renewal_is_never_given_more_time_than_validity_left():
    """The bound of a renewal is min(op_timeout, valid_until - now)."""
    clock, events = Clock(), []
    store = ModelStore(clock)
    caller = SlowCaller(clock)
    manager = make(clock, store, events, call=caller)
    manager.step()
    valid_until = events[0].term.valid_until
    clock.now = valid_until - TIMING.op_timeout - 0.01  # just in time for one more renewal
    store.fail_with = StoreError("unreachable")
    manager.step()
    renew_bounds = [b for what, b in caller.bounds if what == "renew"]
    assert renew_bounds and renew_bounds[-1] <= valid_until - (
        valid_until - TIMING.op_timeout - 0.01
    )


def test_any_exception_from_a_store_is_a_failed_call():
    """A store raising something other than StoreError: the manager fails closed and goes on."""
    clock, events = Clock(), []
    store = ModelStore(clock)
    manager = make(clock, store, events)
    manager.step()
    store.fail_with = KeyError("not ours")
    drive(manager, clock, 106.0)
    assert any(e.kind is EventKind.LOST for e in events)
    assert not manager.is_leader()
    store.fail_with = None
    drive(manager, clock, 112.0)
    assert manager.is_leader(), "it competes again once the store answers"


def test_listeners_hear_released_before_the_store_release():
    """Stop, then release: RELEASED reaches listeners before release() reaches the store."""
    clock, events = Clock(), []
    store = ModelStore(clock)
    order: list[str] = []

    def listener(event: LeaseEvent) -> None:
        if event.kind is EventKind.RELEASED:
            order.append(f"heard-released, store calls so far: {store.calls.count('release')}")

    manager = make(clock, store, events)
    manager.add_listener(listener)
    manager.step()
    manager._give_up(release=True)  # what stop() and step_down() do on the thread
    assert order == ["heard-released, store calls so far: 0"]
    assert store.calls[-1] == "release"


def test_release_guard_that_sees_work_running_keeps_the_lease_in_the_store():
    """When the guard says the term's work still runs, nothing is released."""
    clock, events = Clock(), []
    store = ModelStore(clock)
    guarded = []
    manager = make(clock, store, events, release_guard=lambda term: guarded.append(term) or False)
    manager.step()
    manager._give_up(release=True)
    assert guarded and guarded[0].token == events[0].term.token
    assert "release" not in store.calls
    assert store.holder == "lease-1", "the lease ends in the store at its expiry"


def test_not_live_leader_releases_only_after_its_work_stopped():
    """A leader whose loop is stuck: LOST first, then the guard, then the release."""
    clock, events = Clock(), []
    store = ModelStore(clock)
    live = [True]
    seen = []

    def guard(term):
        seen.append(("guard", [e.kind for e in events]))
        return True

    manager = make(clock, store, events, liveness=lambda: live[0], release_guard=guard)
    manager.step()
    live[0] = False
    drive(manager, clock, 102.0)
    assert events[-1].kind is EventKind.LOST and events[-1].reason is LossReason.NOT_LIVE
    assert seen == [("guard", [EventKind.ELECTED, EventKind.LOST])]
    assert store.calls[-1] == "release"


def test_bounded_caller_returns_on_time_while_the_call_hangs():
    """A call that hangs is given up at its bound, and later calls still run."""
    import threading
    import time

    caller = BoundedCaller("t")
    gate = threading.Event()
    started = time.monotonic()
    with pytest.raises(StoreCallTimeoutError):
        caller.call(gate.wait, 0.2, "renew")
    assert time.monotonic() - started < 0.5
    assert caller.call(lambda: 42, 1.0) == 42
    gate.set()
    with pytest.raises(ValueError, match="boom"):
        caller.call(lambda: (_ for _ in ()).throw(ValueError("boom")), 1.0)
    caller.close()


def test_bounded_caller_stops_piling_up_hung_calls():
    """After max_abandoned calls hang, further calls fail at once instead of adding threads."""
    import threading

    caller = BoundedCaller("t", max_abandoned=2)
    gate = threading.Event()
    for _ in range(2):
        with pytest.raises(StoreCallTimeoutError):
            caller.call(gate.wait, 0.05)
    with pytest.raises(StoreCallTimeoutError, match="still hang"):
        caller.call(lambda: 1, 5.0)
    gate.set()
    for job in list(caller._abandoned):
        assert job.done.wait(2.0)
    assert caller.call(lambda: 1, 1.0) == 1


class AbandoningCaller(SlowCaller):
    """Gives up on every release at its bound and keeps it, to deliver it late."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self.abandoned = []

    def __call__(self, fn, bound, what):
        if what == "release":
            self.abandoned.append(fn)
            self.clock.now += bound
            raise StoreCallTimeoutError("release timed out")
        return super().__call__(fn, bound, what)


def test_a_release_of_an_earlier_term_that_lands_late_leaves_the_next_term_alone():
    """Each term has its own lease id: a release given up, then run, cannot end a later term."""
    clock, events = Clock(), []
    store = ModelStore(clock)
    caller = AbandoningCaller(clock)
    manager = make(clock, store, events, call=caller)
    manager.step()
    first_id = manager.holder.lease_id
    manager._give_up(release=True)  # the release is abandoned at its bound, still on its way
    drive(manager, clock, clock.now + 2 * TIMING.ttl)  # the old lease expires; a new term
    assert manager.is_leader()
    assert [e.term.token for e in events if e.kind is EventKind.ELECTED] == [1, 2]
    assert manager.holder.lease_id != first_id
    assert caller.abandoned[0]() is False, "the late release does not name the new lease"
    assert store.holder == manager.holder.lease_id
    drive(manager, clock, clock.now + 2.0)
    assert manager.is_leader()


def test_a_renew_grid_puts_renewals_on_its_multiples_never_later():
    """With renew_grid, renewals land on the grid (so one worker's leases renew together)."""
    clock, events = Clock(), []
    clock.now = 100.3
    store = ModelStore(clock)
    renewed_at: list[float] = []
    real_renew = store.renew

    def renew(name, lease_id, ttl):
        renewed_at.append(round(clock.now, 6))
        return real_renew(name, lease_id, ttl)

    store.renew = renew  # type: ignore[method-assign]
    manager = make(clock, store, events, renew_grid=1.0)
    drive(manager, clock, 104.5)
    assert renewed_at == [101.0, 102.0, 103.0, 104.0], "on the grid, <= one interval apart"
    assert manager.is_leader()


def recording_attempts(clock, store) -> list[float]:
    """Make *store* note the time of every acquire; the list it notes them in."""
    tried_at: list[float] = []
    real_acquire = store.acquire

    def acquire(name, holder, ttl, min_token=0):
        tried_at.append(round(clock.now, 6))
        return real_acquire(name, holder, ttl, min_token)

    store.acquire = acquire
    return tried_at


def test_a_renew_grid_puts_a_followers_delayed_attempts_on_its_multiples():
    """With renew_grid, an attempt after a balancer's delay falls on the grid (batched with
    this worker's renewals)."""
    clock, events = Clock(), []
    clock.now = 200.0
    store = ModelStore(clock)
    store.holder, store.expires_at = "someone-else", 202.37
    tried_at = recording_attempts(clock, store)
    delays = iter([0.0, 0.25])  # at once; at the next grid point (201), a balancer's 0.25 s
    manager = make(clock, store, events, renew_grid=1.0, acquire_delay=lambda: next(delays, 0.0))
    drive(manager, clock, 203.5)
    assert tried_at[0] == 200.0, "the first attempt is at once"
    assert tried_at[1] == 202.0, "after the delay (201.25 and later): on the grid"
    assert 202.37 < tried_at[2] < 202.6, f"then at the lease's end: {tried_at}"
    assert manager.is_leader()


def test_a_renew_grid_never_delays_the_attempt_when_the_holders_lease_ends():
    """A follower looks on the grid while the lease lives (one batched call per grid point,
    not one per lease end), and tries at the lease's end once it comes before the next one:
    the failover is not moved to the grid."""
    clock, events = Clock(), []
    clock.now = 300.0
    store = ModelStore(clock)
    store.holder, store.expires_at = "someone-else", 302.37
    tried_at = recording_attempts(clock, store)
    manager = make(clock, store, events, renew_grid=1.0)
    drive(manager, clock, 303.5)
    assert tried_at[:3] == [300.0, 301.0, 302.0], tried_at
    assert 302.37 < tried_at[3] < 302.6, tried_at
    assert manager.is_leader()
