"""Leader messages a worker holds for their ETA, on every supported Celery release.

A message with an ETA (or countdown) is held in the consumer's timer until
its time comes; it is in neither ``reserved_requests`` nor the pool. When a
term ends, those of leader tasks must go back to the broker, or the old
leader would run them after it lost the lease.

Celery 5.7 lists them in ``celery.worker.state.scheduled_requests`` and keeps
the timer entry on the request (``_eta_timer_entry``). Earlier releases keep
them only as timer entries whose first argument is the request. Both are read
here, so the hand-back needs no name an older release lacks.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from celery.worker import state as worker_state


class HeldForEta(NamedTuple):
    """A request waiting in the timer, and the timer entry that would run it."""

    request: Any
    entry: Any


def _from_state() -> list[HeldForEta]:
    """Celery 5.7+: requests in ``scheduled_requests`` with their timer entry."""
    held = []
    for request in list(getattr(worker_state, "scheduled_requests", ())):
        entry = getattr(request, "_eta_timer_entry", None)
        held.append(HeldForEta(request, entry))
    return held


def _from_timer(timer: Any) -> list[HeldForEta]:
    """Any release: timer entries whose first argument is a task request."""
    held = []
    # ``queue`` copies the timer's heap (one C-level list copy under the GIL).
    for event in list(getattr(timer, "queue", ()) or ()):
        entry = getattr(event, "entry", event)
        args = getattr(entry, "args", None) or ()
        if getattr(entry, "canceled", False) or not args:
            continue
        request = args[0]
        if hasattr(request, "task") and hasattr(request, "hand_back"):
            held.append(HeldForEta(request, entry))
    return held


def held_for_eta(consumer: Any) -> list[HeldForEta]:
    """Every request the consumer's timer holds for its ETA, each once.

    Assumes it runs on the consumer's loop thread (the only thread that adds
    entries); the timer thread of non-event-loop pools may fire an entry
    meanwhile, and then the request is dispatched as usual, not handed back.
    """
    found: dict[int, HeldForEta] = {}
    timer = getattr(consumer, "timer", None) if consumer is not None else None
    for item in [*_from_state(), *(_from_timer(timer) if timer is not None else [])]:
        known = found.get(id(item.request))
        if known is None or known.entry is None:
            found[id(item.request)] = item
    return list(found.values())
