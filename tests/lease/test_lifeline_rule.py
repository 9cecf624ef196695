"""The lifeline rule as pure logic (celery_leader.lease.lifeline), on a virtual clock.

A fake store stands in for the server (pure logic: which keys it keeps, in
which session); the real stores are tested in tests/stores. What is shown:

* a holder's validity is its last *sent* confirmation plus GRACE, and lapses
  by itself when confirmations stop coming back;
* a confirmation that times out ends the lifeline (a late answer must never
  count for a later confirmation), and the next one has a new key;
* a follower counts a lifeline as ended only when one session saw it kept
  and then gone; a new session (a restart, a failover) proves nothing.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from celery_leader.exceptions import StoreCallTimeoutError
from celery_leader.lease.lifeline import (
    CONFIRM_EVERY,
    GRACE,
    KILL_ALLOWANCE,
    REOPEN_AFTER,
    REOPEN_WAIT,
    STEADY_FOR,
    TAKEOVER_WAIT,
    HolderLifeline,
    LifelineMonitor,
)
from celery_leader.stores.base import LifelineEndedError, LifelineReading


@dataclass
class Clock:
    t: float = 100.0

    def __call__(self) -> float:
        return self.t


@dataclass
class FakeLifeline:
    server: FakeServer
    key: str
    answer_after: float = 0.0

    def confirm(self, timeout: float) -> None:
        if self.key not in self.server.kept:
            raise LifelineEndedError("closed")
        if self.answer_after > timeout:
            self.server.clock.t += timeout
            raise StoreCallTimeoutError("no answer")
        self.server.clock.t += self.answer_after

    def fileno(self) -> int:
        return -1

    def close(self) -> None:
        self.server.kept.discard(self.key)


@dataclass
class FakeServer:
    clock: Clock
    kept: set[str] = field(default_factory=set)
    session: str = "s1"
    opened: list[FakeLifeline] = field(default_factory=list)

    def open_lifeline(self) -> FakeLifeline:
        lifeline = FakeLifeline(self, f"k{len(self.opened)}")
        self.kept.add(lifeline.key)
        self.opened.append(lifeline)
        return lifeline

    def read_lifelines(self, keys: Collection[str]) -> LifelineReading:
        return LifelineReading(self.session, frozenset(k for k in keys if k in self.kept))

    def take_over(self, *args: object) -> object:  # the Lifelines protocol's third part
        raise NotImplementedError


def test_validity_counts_from_the_sending_and_lapses_by_itself():
    clock = Clock()
    server = FakeServer(clock)
    holder = HolderLifeline(server, "fake", now=clock)  # type: ignore[arg-type]
    assert holder.step() == CONFIRM_EVERY
    key = holder.key()
    assert key == "k0"
    sent = clock.t
    server.opened[0].answer_after = 0.1  # the answer takes a while: validity counts from sending
    clock.t = sent
    holder.step()
    assert holder.valid_until(key) == sent + GRACE
    clock.t = sent + GRACE + 0.001  # no confirmation since: lapsed, and no key to tie a term to
    assert holder.key() == ""
    assert holder.valid_until(key) == sent + GRACE
    assert holder.valid_until("other") == 0.0


def test_a_confirmation_that_times_out_ends_the_lifeline_and_the_next_has_a_new_key():
    clock = Clock()
    server = FakeServer(clock)
    ended: list[str] = []
    holder = HolderLifeline(server, "fake", now=clock)  # type: ignore[arg-type]
    holder.add_listeners(ended=ended.append)
    holder.step()
    server.opened[0].answer_after = GRACE + 1
    assert holder.step() == REOPEN_AFTER
    assert ended == ["k0"]
    assert holder.valid_until("k0") == 0.0
    holder.step()
    assert holder.key() == "k1"


def test_a_new_lifeline_is_awaited_only_after_a_confirmed_one_ended_and_not_past_a_failed_open():
    clock = Clock()
    server = FakeServer(clock)
    holder = HolderLifeline(server, "fake", now=clock)  # type: ignore[arg-type]
    assert holder.reopening_in() == 0.0, "before the first lifeline: the start waits for it"
    holder.step()
    assert holder.reopening_in() == 0.0, "confirmed now: nothing to wait for"
    server.kept.clear()  # the server restarted: the lifeline ended
    ended_at = clock.t
    assert holder.step() == REOPEN_AFTER
    assert holder.reopening_in() == REOPEN_WAIT
    clock.t = ended_at + REOPEN_AFTER
    holder.step()  # opened and confirmed again
    assert holder.key() == "k1" and holder.reopening_in() == 0.0
    clock.t += STEADY_FOR
    holder.step()
    server.kept.clear()
    holder.step()
    clock.t += REOPEN_WAIT + 0.01
    assert holder.reopening_in() == 0.0, "awaited for REOPEN_WAIT at most"

    # A store that refuses new lifelines: no wait once an open failed.
    def refuse() -> FakeLifeline:
        raise LifelineEndedError("refused")

    holder2 = HolderLifeline(server, "fake", now=clock)  # type: ignore[arg-type]
    holder2.step()
    server.kept.clear()
    holder2.step()
    assert holder2.reopening_in() > 0
    server.open_lifeline = refuse  # type: ignore[method-assign]
    holder2.step()
    assert holder2.reopening_in() == 0.0, "an open failed: competing goes on without a lifeline"


def test_a_lifeline_that_ends_before_its_first_confirmation_is_not_awaited_again():
    """A lifeline ending at its first confirmation every time (a pooler moving sessions) must
    never hold an election back: only a confirmed lifeline's end starts the wait."""
    clock = Clock()
    server = FakeServer(clock)
    holder = HolderLifeline(server, "fake", now=clock)  # type: ignore[arg-type]
    real_open = server.open_lifeline

    def open_dead() -> FakeLifeline:
        lifeline = real_open()
        server.kept.discard(lifeline.key)  # gone before its first confirmation
        return lifeline

    server.open_lifeline = open_dead  # type: ignore[method-assign]
    for _ in range(3):
        holder.step()
        assert holder.reopening_in() == 0.0
        clock.t += REOPEN_AFTER


def test_lifelines_that_keep_ending_young_are_awaited_twice_in_a_row_at_most():
    """Each lifeline ends at its second confirmation (a proxy that reconnects by itself, a
    store that keeps dropping the connection): awaiting every end kept a process from any
    term longer than a lifeline (tied to it) and, when its terms hold off, from leading at
    all. After two young ends in a row it competes without waiting; a steady lifeline's end
    is awaited again."""
    clock = Clock()
    server = FakeServer(clock)
    holder = HolderLifeline(server, "fake", now=clock)  # type: ignore[arg-type]
    waits = []
    for _ in range(4):
        holder.step()  # opened, confirmed once
        assert holder.key()
        clock.t += CONFIRM_EVERY
        server.kept.clear()  # dropped: its next confirmation fails
        assert holder.step() == REOPEN_AFTER
        waits.append(holder.reopening_in())
        clock.t += REOPEN_AFTER
    assert waits == [REOPEN_WAIT, 0.0, 0.0, 0.0]
    holder.step()  # a lifeline that stays
    assert holder.reopening_in() == 0.0
    clock.t += STEADY_FOR
    holder.step()
    server.kept.clear()
    holder.step()
    assert holder.reopening_in() == REOPEN_WAIT, "a steady lifeline's end is awaited again"
    clock.t += REOPEN_AFTER
    holder.step()  # the next one ends young: still awaited, the one before was steady
    clock.t += CONFIRM_EVERY
    server.kept.clear()
    holder.step()
    assert holder.reopening_in() == REOPEN_WAIT
    clock.t += REOPEN_AFTER
    holder.step()
    clock.t += CONFIRM_EVERY
    server.kept.clear()
    holder.step()
    assert holder.reopening_in() == 0.0


def test_a_follower_sees_an_end_only_within_one_session():
    clock = Clock()
    server = FakeServer(clock)
    server.kept.add("dead")
    monitor = LifelineMonitor(server, "fake", now=clock, threaded=False)  # type: ignore[arg-type]
    woken: list[str] = []
    monitor.follow("dead", lambda: woken.append("dead"))
    monitor.step()
    assert monitor.ended_at("dead") is None
    server.session = "s2"  # the server restarted: its readings are a new session
    server.kept.clear()
    monitor.step()
    assert monitor.ended_at("dead") is None, "gone in a new session proves nothing"
    server.kept.add("dead")
    monitor.step()  # seen kept in s2
    server.kept.clear()
    clock.t = 200.0
    monitor.step()
    assert monitor.ended_at("dead") == 200.0
    assert woken == ["dead"]


def test_the_follower_waits_out_the_holders_grace_and_the_kill():
    assert TAKEOVER_WAIT >= GRACE + KILL_ALLOWANCE
    from celery_leader.term_end.watchdog import WATCH_INTERVAL

    assert KILL_ALLOWANCE >= 2 * WATCH_INTERVAL
