"""Which slot a beat takeover would catch up on, and whether it is young enough to send.

A beat that takes a term over counts each entry from the last send of any
earlier leader. When slots passed meanwhile (nobody led, or beat was down),
Celery's schedulers send one message for all of them at the next tick. The
missed policy (``leader_beat_missed`` per entry, ``leader_beat_missed_default``)
decides whether that one message goes out:

* ``"once"``: always (no window);
* ``"skip"``: never (a window of 0);
* a number of seconds: only when the latest missed slot is at most that old.

Judged on the *latest* missed slot: it is the one a catch-up send stands in
for, and an entry whose last slot passed moments ago is worth sending even
if earlier ones are hours old.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from celery_leader.beat.occurrence import slot_after
from celery_leader.beat.state import schedule_time

#: The most slots walked through to find the latest missed one (a 1 s entry down for 3 h).
MAX_STEPS = 10_000


def latest_missed_slot(entry: Any, last_sent: float, now: float) -> float | None:
    """The latest slot of *entry* after *last_sent* and not after *now* (unix times), or None.

    Intervals are computed; other schedules are walked slot by slot from
    *last_sent* (at most :data:`MAX_STEPS`; past that, *now* stands for the
    latest slot: it is at least that young).
    """
    schedule = entry.schedule
    run_every = getattr(schedule, "run_every", None)
    if isinstance(run_every, dt.timedelta) and not hasattr(schedule, "remaining_delta"):
        period = run_every.total_seconds()
        if period <= 0:
            return None
        slots = int((now - last_sent) // period)
        return last_sent + slots * period if slots >= 1 else None
    latest: float | None = None
    cursor = last_sent
    for _ in range(MAX_STEPS):
        following = _slot_after(entry, cursor)
        if following is None or following > now or following <= cursor:
            return latest
        latest = cursor = following
    return now


def _slot_after(entry: Any, moment: float) -> float | None:
    """The first slot of *entry* after a run at *moment*, by its schedule; None when it has none."""
    slot = slot_after(entry.schedule, schedule_time(entry, moment))
    return None if slot is None else slot.timestamp()


def catch_up(entry: Any, last_sent: float, window: float, now: float) -> bool:
    """True when a takeover should send *entry*'s missed slot: at most *window* seconds old."""
    latest = latest_missed_slot(entry, last_sent, now)
    return latest is not None and now - latest <= window
