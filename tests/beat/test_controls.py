"""The schedule controls as stored: pauses and run-now requests parse, junk is ignored."""

from __future__ import annotations

import json
import math
import time

from celery_leader.beat.controls import (
    RAN_PREFIX,
    VIEW_KEY,
    Controls,
    control_slot,
    pause_value,
    ran_records,
    ran_value,
    resume_value,
    run_value,
    view_of,
)
from celery_leader.beat.steering import Steering, last_sent


def test_pause_until_resumed_for_a_while_and_resumed() -> None:
    now = time.time()
    controls = Controls.from_state(
        {
            "pause:forever": pause_value(None, "ops"),
            "pause:brief": pause_value(now + 60, "ops"),
            "pause:over": pause_value(now - 1, "ops"),
            "pause:back": resume_value("ops"),
            "pause:junk": "{not json",
        }
    )
    assert controls.paused_until("forever", now) == math.inf
    assert controls.paused_until("brief", now) == now + 60
    assert controls.paused_until("over", now) is None
    assert controls.paused_until("back", now) is None
    assert controls.paused_until("junk", now) is None
    assert controls.paused_until("never-mentioned", now) is None


def test_run_requests_parse_and_incomplete_ones_are_ignored() -> None:
    controls = Controls.from_state(
        {
            "run:tick": run_value("abc", 10.0, 20.0, "ops"),
            "run:half": json.dumps({"id": "x"}),
        }
    )
    assert set(controls.runs) == {"tick"}
    request = controls.runs["tick"]
    assert (request.id, request.at, request.expires) == ("abc", 10.0, 20.0)


def test_beats_own_records_and_view_sit_apart_from_the_marks() -> None:
    state = {
        "tick": json.dumps({"at": 1.0, "token": 3}),
        f"{RAN_PREFIX}tick": ran_value("abc", "tick@manual:x", 5.0, 3),
        VIEW_KEY: json.dumps({"entries": []}),
    }
    assert ran_records(state) == {
        "tick": {"id": "abc", "occurrence": "tick@manual:x", "sent_at": 5.0, "token": 3}
    }
    assert view_of(state) == {"entries": []}
    assert view_of({}) is None
    assert control_slot("app.beat") == "app.beat.schedule"


def test_last_sent_keeps_the_real_send_across_paused_slots() -> None:
    assert last_sent(None) is None
    assert last_sent({"at": 5.0, "token": 1}) == 5.0
    assert last_sent({"at": 9.0, "token": 1, "skipped": "paused", "sent": 5.0}) == 5.0
    assert last_sent({"at": 9.0, "token": 1, "skipped": "paused", "sent": None}) is None


def _steering_with(state: dict[str, str]) -> Steering:
    steering = Steering("app.beat", lambda name: state, lambda lease, key, value: True)
    assert steering.take_over({}, "lease-1")
    steering.stop()
    return steering


def test_run_now_lives_its_lifetime_on_the_beats_clock_whatever_the_askers_clock() -> None:
    now = time.time()
    # The asking host's clock is 30 s behind: by the beat's clock the request "expired" 20 s
    # ago, yet it was just written, with 10 s to live: it is carried out.
    behind = _steering_with({"run:tick": run_value("a", now - 30, now - 20, "ops")})
    assert [r.id for r in behind.pending_runs()] == ["a"]
    # Written long ago (no beat led then): the command gave up on it, it is not sent.
    stale = _steering_with({"run:tick": run_value("b", now - 300, now - 290, "ops")})
    assert stale.pending_runs() == []
    # Carried out once in this term.
    behind.attempted(behind.pending_runs()[0])
    assert behind.pending_runs() == []


def test_view_echoes_the_control_it_reflects() -> None:
    steering = _steering_with({"pause:tick": pause_value(None, "ops", at=123.5)})

    class Entry:
        name, task, schedule, last_run_at = "tick", "t", "every 1 s", None

    (row,) = steering.view([Entry()], {}, lambda entry: {})
    assert row["paused"] is True and row["control_at"] == 123.5
