"""A lease manager with a lifeline: its terms are tied to the lifeline the store records."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection
from typing import Any

from celery_leader.exceptions import StoreCallTimeoutError
from celery_leader.lease import EventKind, LeaseEvent, LeaseManager, LossReason, Role
from celery_leader.lease.lifeline import HolderLifeline, LifelineMonitor
from celery_leader.lease.timing import LeaseTiming
from celery_leader.simulation.model_store import ModelStore
from celery_leader.stores import open_store
from celery_leader.stores.base import (
    AcquireResult,
    Holder,
    LeaseRecord,
    LifelineEndedError,
    LifelineReading,
)
from celery_leader.stores.memory import reset_memory_stores

#: The first confirmation's round trip (a fresh connection: setup, authentication).
FIRST_CONFIRMATION = 0.2


class _Line:
    """A lifeline whose first confirmation takes FIRST_CONFIRMATION seconds."""

    key = "line-1"

    def __init__(self) -> None:
        self._confirmed = threading.Event()

    def confirm(self, timeout: float) -> None:
        if not self._confirmed.is_set():
            time.sleep(FIRST_CONFIRMATION)
            self._confirmed.set()

    def fileno(self) -> int:
        return -1

    def close(self) -> None:
        pass


class _Lifelines:
    """The lifeline half of a store (a fake: the lease half is the real memory store)."""

    def open_lifeline(self) -> _Line:
        return _Line()

    def read_lifelines(self, keys: Collection[str]) -> LifelineReading:
        return LifelineReading("session", frozenset(keys))

    def take_over(
        self, name: str, holder: Holder, ttl: float, dead: LeaseRecord, min_token: int = 0
    ) -> AcquireResult:
        raise AssertionError("nobody to take over from")


def test_the_first_term_waits_for_the_first_confirmation_and_is_tied_to_the_lifeline():
    """Without the wait, the first acquire goes out before any confirmation: a term without one."""
    reset_memory_stores()
    lifelines = _Lifelines()
    holder = HolderLifeline(lifelines, "memory://")
    monitor = LifelineMonitor(lifelines, "memory://")
    manager = LeaseManager(
        open_store("memory://", timeout=0.5),
        "job",
        LeaseTiming.create(1.0),
        holder=Holder.for_this_process("m0"),
        lifeline=holder,
        lifelines=monitor,
    )
    holder.start()
    manager.start()
    try:
        assert manager.wait_for_leadership(5.0)
        assert manager.state().lifeline == "line-1"
    finally:
        manager.stop()
        holder.stop()


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _InstantLine:
    """A lifeline confirmed at once, every time it is asked (the test decides when)."""

    key = "line-1"

    def confirm(self, timeout: float) -> None:
        pass

    def fileno(self) -> int:
        return -1

    def close(self) -> None:
        pass


class _InstantLifelines(_Lifelines):
    def open_lifeline(self) -> _InstantLine:  # type: ignore[override]
        return _InstantLine()


class _LateCalls:
    """The manager's store calls; the ones it is told to hold back time out, and run later."""

    def __init__(self) -> None:
        self.hold_back = False
        self.held: list[Callable[[], Any]] = []

    def __call__(self, fn: Callable[[], Any], timeout: float, what: str) -> Any:
        if self.hold_back:
            self.held.append(fn)  # reaches the store after its caller gave up
            raise StoreCallTimeoutError(f"{what} timed out")
        return fn()


def test_a_late_attempt_with_another_lifeline_never_ties_the_stores_record_to_it():
    """An attempt that timed out may be applied after the next one: it must not re-tie the term.

    The first attempt goes out tied to the lifeline, and is held back; the
    lifeline's confirmations come late (its validity lapses), so the next
    attempt goes out untied and wins; then the first arrives. Had both the
    same lease id, the store would record the term as tied to a lifeline
    that does not bound it: a follower that saw that lifeline end would take
    over while the holder still leads.
    """
    clock = _Clock()
    store = ModelStore(lambda: clock.now)
    someone = Holder(lease_id="x", nodename="x", hostname="h", pid=9)
    store.acquire("job", someone, 3.0)  # a clean earlier term: the next one does not hold off
    store.release("job", "x")
    lifelines = _InstantLifelines()
    holder = HolderLifeline(lifelines, "sim", now=clock)
    calls = _LateCalls()
    manager = LeaseManager(
        store,  # type: ignore[arg-type]
        "job",
        LeaseTiming.create(3.0),
        holder=Holder(lease_id="first", nodename="m0", hostname="h", pid=1),
        clock=clock,
        call=calls,
        lifeline=holder,
        lifelines=LifelineMonitor(lifelines, "sim", now=clock, threaded=False),
    )
    holder.step()  # confirmed: valid until now + GRACE
    calls.hold_back = True
    manager.step()  # the first attempt, tied to line-1: held back
    calls.hold_back = False
    clock.now += 1.0  # no confirmation meanwhile: the lifeline's validity lapsed
    manager.step()  # the next attempt, untied
    assert manager.state().role is Role.LEADER
    holder.step()  # confirmed again: line-1 never ended
    for late in calls.held:
        late()  # the first attempt reaches the store now
    record = store.read("job")
    assert record is not None
    assert record.lifeline == manager.state().lifeline


class _EndingLine(_InstantLine):
    """A lifeline that ends (the server dropped it) once told to."""

    def __init__(self) -> None:
        self.gone = False

    def confirm(self, timeout: float) -> None:
        if self.gone:
            raise LifelineEndedError("the server dropped it")


def test_a_term_whose_lifeline_ended_during_its_hold_off_is_never_elected():
    """The lifeline ends while a renewal is out, and the hold-off ends meanwhile: no ELECTED.

    Electing it would announce a term below one a follower may already have
    started after taking it over (the lifeline's end lets it, TAKEOVER_WAIT
    later), and that can never act.
    """
    clock = _Clock()
    store = ModelStore(lambda: clock.now)  # no record of earlier terms: the first holds off
    line = _EndingLine()
    lifelines = _InstantLifelines()
    lifelines.open_lifeline = lambda: line  # type: ignore[method-assign]
    holder = HolderLifeline(lifelines, "sim", now=clock)
    events: list[LeaseEvent] = []

    def renewal_outlasting_the_hold_off(fn: Callable[[], Any], timeout: float, what: str) -> Any:
        if what == "renew" and line.gone:
            holder.step()  # the lifeline's thread hears of the end while the renewal is out
            clock.now += timeout  # no reply (a partition): the hold-off ends meanwhile
            raise StoreCallTimeoutError("renew timed out")
        return fn()

    manager = LeaseManager(
        store,  # type: ignore[arg-type]
        "job",
        LeaseTiming.create(3.0),
        holder=Holder(lease_id="first", nodename="m0", hostname="h", pid=1),
        listeners=(events.append,),
        clock=clock,
        call=renewal_outlasting_the_hold_off,
        lifeline=holder,
        lifelines=LifelineMonitor(lifelines, "sim", now=clock, threaded=False),
    )
    holder.add_listeners(ended=manager._on_own_lifeline_ended)  # as LeaseManager._run does
    holder.step()
    manager.step()  # acquired, tied to the lifeline, holding off 3 s
    assert manager.state().role is Role.HOLDING
    assert manager.state().lifeline == "line-1"
    for _ in range(2):
        clock.now += 1.0
        manager.step()  # renewed
    clock.now += 1.0  # the next renewal is due as the hold-off ends
    line.gone = True  # the server dropped the lifeline (its keepalive gave up, say)
    manager.step()
    assert [event.kind for event in events] == []
    assert manager.state().role is Role.FOLLOWER


class _Lines(_Lifelines):
    """A new lifeline (a new key) at each opening; each ends once told to."""

    def __init__(self) -> None:
        self.opened: list[_EndingLine] = []

    def open_lifeline(self) -> _EndingLine:  # type: ignore[override]
        line = _EndingLine()
        line.key = f"line-{len(self.opened) + 1}"  # type: ignore[misc]
        self.opened.append(line)
        return line


def _manager_on(clock: _Clock, lifelines: _Lines, events: list[LeaseEvent]) -> LeaseManager:
    """A manager on a fresh model store (its first term holds off 3 s), stepped by the test."""
    holder = HolderLifeline(lifelines, "sim", now=clock)
    manager = LeaseManager(
        ModelStore(lambda: clock.now),  # type: ignore[arg-type]
        "job",
        LeaseTiming.create(3.0),
        holder=Holder(lease_id="first", nodename="m0", hostname="h", pid=1),
        listeners=(events.append,),
        clock=clock,
        lifeline=holder,
        lifelines=LifelineMonitor(lifelines, "sim", now=clock, threaded=False),
    )
    holder.add_listeners(ended=manager._on_own_lifeline_ended)  # as LeaseManager._run does
    holder.step()
    manager.step()  # acquired, tied to line-1, holding off 3 s
    assert manager.state().role is Role.HOLDING
    assert manager.state().lifeline == "line-1"
    return manager


def test_a_term_is_elected_only_once_its_lifeline_is_confirmed_again():
    """The hold-off ends while the lifeline's last confirmation is older than its grace (an
    answer is late): the term is not elected then, since its lifeline may have ended unheard;
    it is elected as soon as a confirmation comes back."""
    clock, lifelines, events = _Clock(), _Lines(), []
    manager = _manager_on(clock, lifelines, events)
    holder = manager._lifeline
    assert holder is not None
    for _ in range(3):
        clock.now += 1.0
        manager.step()  # renewed; the lifeline's thread is late: no confirmation meanwhile
    assert events == [], "elected while its lifeline's last confirmation is 3 s old"
    assert manager.state().role is Role.HOLDING
    assert manager.current_token() is None
    holder.step()  # the late answer is in, and the next confirmation comes back
    manager.step()
    assert [event.kind for event in events] == [EventKind.ELECTED]
    assert manager.current_token() is not None


def test_a_lifeline_whose_end_was_overwritten_by_a_later_ones_still_ends_its_term():
    """line-1 ends, line-2 opens and ends, all before the manager looks: the news of line-1
    was overwritten, yet its term ends (a key is never reopened), and is not kept forever."""
    clock, lifelines, events = _Clock(), _Lines(), []
    manager = _manager_on(clock, lifelines, events)
    holder = manager._lifeline
    assert holder is not None
    for _ in range(3):
        clock.now += 1.0
        holder.step()
        manager.step()
    assert [event.kind for event in events] == [EventKind.ELECTED]
    lifelines.opened[0].gone = True
    holder.step()  # line-1 ended
    holder.step()  # line-2 opened
    lifelines.opened[1].gone = True
    holder.step()  # line-2 ended: the manager hears of line-2 only
    manager.step()
    assert [event.kind for event in events] == [EventKind.ELECTED, EventKind.LOST]
    assert events[-1].reason is LossReason.LIFELINE_ENDED


class _ShortLine(_InstantLine):
    """A lifeline confirmed once, then gone (a proxy in between reconnected, say)."""

    def __init__(self, key: str) -> None:
        self.key = key  # type: ignore[misc]
        self.confirmed = False

    def confirm(self, timeout: float) -> None:
        if self.confirmed:
            raise LifelineEndedError("connection closed")
        self.confirmed = True


class _ShortLines(_Lifelines):
    def __init__(self) -> None:
        self.opened = 0

    def open_lifeline(self) -> _ShortLine:  # type: ignore[override]
        self.opened += 1
        return _ShortLine(f"line-{self.opened}")


def test_lifelines_that_keep_ending_after_one_confirmation_never_keep_a_worker_from_leading():
    """Every lifeline ends at its second confirmation. Awaiting each one's successor (up to
    REOPEN_WAIT) let the manager acquire only in the 50 ms a lifeline lived, each term tied
    to it and lost with it: on a store whose terms hold off, it never led at all. It must
    settle on a term (without a lifeline) as it did before the wait existed."""
    clock = _Clock()
    store = ModelStore(lambda: clock.now)  # no record of earlier terms: every term holds off
    lifelines = _ShortLines()
    holder = HolderLifeline(lifelines, "sim", now=clock)
    events: list[LeaseEvent] = []
    manager = LeaseManager(
        store,  # type: ignore[arg-type]
        "job",
        LeaseTiming.create(3.0),
        holder=Holder(lease_id="first", nodename="m0", hostname="h", pid=1),
        listeners=(events.append,),
        clock=clock,
        lifeline=holder,
        lifelines=LifelineMonitor(lifelines, "sim", now=clock, threaded=False),
    )
    woken: list[str] = []

    def ended(key: str) -> None:  # as LeaseManager._run adds it, and the wake it sets
        manager._on_own_lifeline_ended(key)
        woken.append(key)

    holder.add_listeners(ended=ended)
    # The two threads on one virtual clock: the lifeline's and the manager's.
    end = clock.now + 20.0
    holder_at, manager_at = clock.now, clock.now + 0.001
    while clock.now < end:
        if holder_at <= manager_at:
            clock.now = holder_at
            holder_at = clock.now + holder.step()
            if woken:
                woken.clear()
                manager_at = clock.now
        else:
            clock.now = manager_at
            manager_at = clock.now + max(manager.step(), 0.001)
    elected = [e for e in events if e.kind is EventKind.ELECTED]
    assert manager.is_leader(), f"not leading after 20 s; {len(elected)} terms elected"
    assert len(elected) == 1
    assert manager.state().lifeline == "", "tied to one of these lifelines, it would end"
