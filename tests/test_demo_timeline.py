"""The demo's timeline: lines in the order of their events' own times, never going back."""

from __future__ import annotations

from celery_leader.demo.timeline import Timeline


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_lines_learnt_late_print_in_the_order_of_their_stamps():
    """A line added after a later one prints before it, once held back long enough."""
    printed: list[str] = []
    clock = FakeClock(100.0)
    timeline = Timeline(printed.append, 100.0, hold_back=1.0, now=clock)
    clock.now = 102.0
    timeline.say("seen now")
    timeline.add(101.5, "happened before")
    timeline.add(102.0, "same stamp, added later")
    timeline.flush()
    assert printed == [], "nothing is printed before it was held back"
    clock.now = 102.6
    timeline.flush()
    assert printed == ["[  1.50s] happened before"]
    timeline.flush(everything=True)
    assert printed == [
        "[  1.50s] happened before",
        "[  2.00s] seen now",
        "[  2.00s] same stamp, added later",
    ]


def test_a_line_learnt_after_its_time_was_printed_past_keeps_the_order():
    """An event learnt of more than the hold-back after it happened is stamped with the time
    printed up to, not earlier: the stamps never decrease."""
    printed: list[str] = []
    clock = FakeClock(0.0)
    timeline = Timeline(printed.append, 0.0, hold_back=1.0, now=clock)
    timeline.add(2.0, "first")
    clock.now = 5.0
    timeline.flush()  # printed up to 4.0
    timeline.add(3.0, "learnt late")
    timeline.flush(everything=True)
    assert printed == ["[  2.00s] first", "[  4.00s] learnt late"]
