"""Every beat-sent run knows its occurrence: the entry and the slot it was due."""

from __future__ import annotations

import itertools
from datetime import datetime

import pytest


@pytest.mark.slow
def test_beat_sent_runs_carry_their_occurrence_and_other_runs_none(cluster_for):
    """A 1 s entry: each run reads self.request.leader_occurrence "tick@<slot>", slots one
    period apart and no later than the send; a leader-only task sent by a client reads None."""
    cluster = cluster_for("redis")
    cluster.env["LEADER_BEAT_EVERY"] = "1"
    cluster.start(1)
    cluster.leader_worker()
    cluster.start_beat()
    rows = cluster.wait_history(lambda r: len([x for x in r if x["kind"] == "beat"]) >= 5, 30)
    cluster.send("leader_record", 7)
    rows = cluster.wait_history(lambda r: any(x["kind"] == "start" for x in r), 10)
    sends = sorted((r for r in rows if r["kind"] == "beat"), key=lambda r: r["wall"])
    occurrences = [r["occurrence"] for r in sends]
    assert len(set(occurrences)) == len(occurrences), occurrences
    slots = []
    for row, occurrence in zip(sends, occurrences, strict=True):
        entry, _, slot = occurrence.partition("@")
        assert entry == "tick" and slot.endswith("Z"), occurrence
        moment = datetime.fromisoformat(slot.replace("Z", "+00:00")).timestamp()
        assert row["wall"] - 3 < moment <= row["wall"] + 0.5, (occurrence, row["wall"])
        slots.append(moment)
    gaps = [later - earlier for earlier, later in itertools.pairwise(slots)]
    assert all(abs(gap - 1.0) < 0.1 for gap in gaps), gaps
    run = next(r for r in rows if r["kind"] == "start")
    assert run["occurrence"] is None
