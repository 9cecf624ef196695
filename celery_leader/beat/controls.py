"""Schedule controls as they are kept in the lease store: pauses, run-now requests, beat's view.

Two places, so that each has one writer that the store can fence:

* **the control slot** ``"<beat election>.schedule"`` (a lease name of its
  own, like the step-down slot): ``celery leader schedule pause|resume|run``
  write here, each taking the slot's lease for the moment of its write.
  Keys ``pause:<entry>`` hold ``{"paused": bool, "until": float | null,
  "at", "by"}``; keys ``run:<entry>`` hold the last run-now request,
  ``{"id", "at", "expires", "by"}``. A pause lives here, not in a beat, so
  it holds across beat failovers and restarts.
* **beat's own state** (beside beat's lease, written only by the beat that
  holds it): the entries' send marks (keys are entry names, see
  :mod:`celery_leader.beat.election`), and under the reserved prefix
  ``celery-leader:`` the view the beat leader publishes
  (``celery-leader:view``) and, per entry, the run-now request it carried out
  last (``celery-leader:ran:<entry>``: ``{"id", "occurrence", "sent_at",
  "token"}``).

Times are unix seconds on the clock of the host that wrote them: a pause
``--for`` a duration ends by the beat host's clock, a run-now request
expires by it, so hosts whose clocks disagree by seconds shift those ends by
as much.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from celery_leader.settings import schedule_slot

#: Keys of beat's own state that are not send marks start with this.
RESERVED_PREFIX = "celery-leader:"
#: Beat's own state: the view the beat leader publishes.
VIEW_KEY = f"{RESERVED_PREFIX}view"
#: Beat's own state: the run-now request of an entry that the beat leader carried out last.
RAN_PREFIX = f"{RESERVED_PREFIX}ran:"
#: The control slot: an entry's pause.
PAUSE_PREFIX = "pause:"
#: The control slot: an entry's last run-now request.
RUN_PREFIX = "run:"


def control_slot(beat_election: str) -> str:
    """The lease name whose state holds the pauses and run-now requests of *beat_election*."""
    return schedule_slot(beat_election)


@dataclass(frozen=True)
class RunRequest:
    """One ``schedule run ENTRY``: send the entry once, now.

    *at* and *expires* are on the clock of the host that asked; the beat
    leader judges the request's life on its own clock from when it first saw
    it (``expires - at`` seconds), so clocks that disagree do not matter.
    """

    entry: str
    id: str
    at: float
    expires: float

    @property
    def lifetime(self) -> float:
        """How long the request may wait for a send, seconds."""
        return max(0.0, self.expires - self.at)


@dataclass(frozen=True)
class Controls:
    """What the control slot asks of the beat leader, as read at one moment."""

    #: Entry -> when its pause ends (unix time; ``inf`` until resumed).
    pauses: Mapping[str, float]
    #: Entry -> its last run-now request.
    runs: Mapping[str, RunRequest]
    #: Entry -> the ``at`` of its last pause or resume (echoed in the view: the
    #: command's confirmation, whatever the hosts' clocks say).
    stamps: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def empty(cls) -> Controls:
        """No pause, no request."""
        return cls({}, {})

    @classmethod
    def from_state(cls, state: Mapping[str, str]) -> Controls:
        """Parse the control slot's *state*; a value that does not parse is ignored."""
        pauses: dict[str, float] = {}
        runs: dict[str, RunRequest] = {}
        stamps: dict[str, float] = {}
        for key, raw in state.items():
            value = _json_object(raw)
            if value is None:
                continue
            if key.startswith(PAUSE_PREFIX):
                entry = key[len(PAUSE_PREFIX) :]
                at = value.get("at")
                if isinstance(at, (int, float)):
                    stamps[entry] = float(at)
                if value.get("paused") is True:
                    until = value.get("until")
                    pauses[entry] = float(until) if isinstance(until, (int, float)) else math.inf
            elif key.startswith(RUN_PREFIX):
                entry = key[len(RUN_PREFIX) :]
                try:
                    runs[entry] = RunRequest(
                        entry, str(value["id"]), float(value["at"]), float(value["expires"])
                    )
                except (KeyError, TypeError, ValueError):
                    continue
        return cls(pauses, runs, stamps)

    def paused_until(self, entry: str, now: float | None = None) -> float | None:
        """When *entry*'s pause ends (``inf``: until resumed), or None when it is not paused."""
        until = self.pauses.get(entry)
        if until is None:
            return None
        return until if until > (time.time() if now is None else now) else None


def pause_value(until: float | None, by: str, at: float | None = None) -> str:
    """The control slot's value for a pause (*until* None: until resumed), written at *at*."""
    return json.dumps(
        {"paused": True, "until": until, "at": time.time() if at is None else at, "by": by}
    )


def resume_value(by: str, at: float | None = None) -> str:
    """The control slot's value for a resumed entry, written at *at*."""
    return json.dumps(
        {"paused": False, "until": None, "at": time.time() if at is None else at, "by": by}
    )


def run_value(request_id: str, at: float, expires: float, by: str) -> str:
    """The control slot's value for a run-now request."""
    return json.dumps({"id": request_id, "at": at, "expires": expires, "by": by})


def ran_value(request_id: str, occurrence: str, sent_at: float, token: int) -> str:
    """Beat's record that it carried out the run-now request *request_id*."""
    return json.dumps(
        {"id": request_id, "occurrence": occurrence, "sent_at": sent_at, "token": token}
    )


def ran_records(state: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """Entry -> the run-now request the beat leaders carried out last, from beat's *state*."""
    records: dict[str, dict[str, Any]] = {}
    for key, raw in state.items():
        if key.startswith(RAN_PREFIX):
            value = _json_object(raw)
            if value is not None:
                records[key[len(RAN_PREFIX) :]] = value
    return records


def view_of(state: Mapping[str, str]) -> dict[str, Any] | None:
    """The view the beat leader published last, from beat's *state*; None when none was."""
    raw = state.get(VIEW_KEY)
    return _json_object(raw) if raw is not None else None


def _json_object(raw: str) -> dict[str, Any] | None:
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        return None
    return value if isinstance(value, dict) else None
