"""LoopLiveness: one record of a process's loop, for the lease thread and the health probe."""

from __future__ import annotations

import pytest

from celery_leader.elections.liveness import CONNECTING, PUBLISHING, LoopLiveness


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def test_a_loop_turns_while_it_ticks_within_its_window():
    """age() counts from the last tick; turning() holds below the window only."""
    clock = Clock()
    loop = LoopLiveness(2.0, clock=clock)
    assert loop.age() == 0.0 and loop.turning()
    clock.now += 1.5
    assert loop.age() == 1.5 and loop.turning()
    clock.now += 0.5
    assert not loop.turning()
    loop.tick()
    assert loop.age() == 0.0 and loop.turning()


def test_the_window_is_only_ever_widened():
    """A blocking loop widens it; a narrower value later does not narrow it."""
    loop = LoopLiveness(2.0, clock=Clock())
    loop.widen(3.0)
    loop.widen(1.0)
    assert loop.window == 3.0


def test_started_and_stopping_are_never_reset():
    """start() once; stopping is set by the process and stays."""
    loop = LoopLiveness(1.0, clock=Clock())
    assert (loop.started, loop.stopping) == (False, False)
    loop.start()
    loop.stopping = True
    loop.tick()
    assert (loop.started, loop.stopping) == (True, True)


def test_waits_on_the_broker_are_kept_by_reason_with_their_start():
    """Each reason begins and ends on its own; waiting_on_broker while any lasts."""
    clock = Clock()
    loop = LoopLiveness(1.0, clock=clock)
    assert not loop.waiting_on_broker
    loop.wait_begins(CONNECTING)
    clock.now += 1
    with loop.waiting(PUBLISHING):
        assert loop.waiting_since(PUBLISHING) == 51.0
        assert loop.waiting_since(CONNECTING) == 50.0
    assert loop.waiting_since(PUBLISHING) is None
    assert loop.waiting_on_broker
    loop.wait_ends(CONNECTING)
    loop.wait_ends(CONNECTING)  # ending one that is over does nothing
    assert not loop.waiting_on_broker


def test_a_wait_ends_when_its_block_raises():
    """The with-block form ends the wait on the way out, also on an error."""
    loop = LoopLiveness(1.0, clock=Clock())
    with pytest.raises(OSError, match="broker gone"), loop.waiting(CONNECTING):
        raise OSError("broker gone")
    assert not loop.waiting_on_broker
