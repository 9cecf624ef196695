"""Which slot a beat takeover would catch up on, and whether it is young enough to send.

A beat that takes a term over counts each entry from the last send of any
earlier leader. When slots passed meanwhile (nobody led, or beat was down),
Celery's schedulers send one message for all of them at the next tick. The
missed policy (``leader_beat_missed`` per entry, ``leader_beat_missed_default``)
decides whether that one message goes out:

* ``"once"``: always (no window);
* ``"skip"``: never (a window of 0);
* a number of seconds: only when the latest missed slot is at most that old.

Judged on the *latest* missed slot (is there one within the window?): it
is the one a catch-up send stands in for, and an entry whose last slot
passed moments ago is worth sending even if earlier ones are hours old.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

from celery_leader.beat.occurrence import slot_after
from celery_leader.beat.state import schedule_time


def catch_up(entry: Any, last_sent: float, window: float, now: float) -> bool:
    """True when a takeover should send *entry*'s missed slot: one fell due within *window* s.

    A slot of the entry lies after its last send (*last_sent*) and in the
    last *window* seconds before *now* (unix times): the first slot after
    ``max(last_sent, now - window)`` is not later than *now*. A window of
    0 (``"skip"``) never sends; an infinite one (``"once"``) sends whenever
    a slot was missed.
    """
    if window <= 0:
        return False
    schedule = entry.schedule
    run_every = getattr(schedule, "run_every", None)
    if isinstance(run_every, dt.timedelta) and not hasattr(schedule, "remaining_delta"):
        # An interval's slots are counted from the last send, not from the clock.
        period = run_every.total_seconds()
        if period <= 0 or now - last_sent < period:
            return False
        latest = last_sent + ((now - last_sent) // period) * period
        return now - latest <= window
    # Crontabs (and other calendars): their slots are fixed times of day.
    cursor = last_sent if math.isinf(window) else max(last_sent, now - window)
    following = slot_after(schedule, schedule_time(entry, cursor))
    return following is not None and following.timestamp() <= now
