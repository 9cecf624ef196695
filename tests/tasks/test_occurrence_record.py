"""The record of completed occurrences: parsing headers, retention and caps, the stored form."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from celery_leader.tasks.occurrence_record import (
    DAY_MS,
    MANUAL,
    MAX_ENTRIES,
    MAX_OTHER,
    MAX_SLOTS,
    OTHER,
    SLOT,
    Occurrence,
    OccurrenceRecord,
    parse_occurrence,
    slot_ms,
)

#: The fixed clock of these tests: 2026-11-25T09:30:00.000Z.
T0 = datetime(2026, 11, 25, 9, 30, tzinfo=timezone.utc)
T0_MS = int(T0.timestamp() * 1000)
MINUTE, HOUR, WEEK = 60_000, 3_600_000, 7 * DAY_MS


def slot(moment_ms: int) -> str:
    """*moment_ms* as beat writes a slot."""
    moment = datetime.fromtimestamp(moment_ms / 1000, timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment_ms % 1000:03d}Z"


def header(entry: str, moment_ms: int) -> str:
    return f"{entry}@{slot(moment_ms)}"


def test_a_beat_header_is_read_as_an_entry_and_a_slot_in_milliseconds():
    assert parse_occurrence("tick@2026-11-25T09:30:00.250Z") == Occurrence(
        SLOT, "tick", T0_MS + 250
    )
    manual = parse_occurrence("tick@manual:2026-11-25T09:30:00.000Z")
    assert manual == Occurrence(MANUAL, "tick", T0_MS)


def test_an_entry_name_with_at_signs_is_split_at_the_last_one():
    found = parse_occurrence("billing@eu@2026-11-25T09:30:00.000Z")
    assert found == Occurrence(SLOT, "billing@eu", T0_MS)
    found = parse_occurrence("a@manual@manual:2026-11-25T09:30:00.000Z")
    assert found == Occurrence(MANUAL, "a@manual", T0_MS)


@pytest.mark.parametrize(
    "text",
    [
        "tick@2026-11-25T09:30:00Z",  # no milliseconds: not beat's form
        "tick@2026-11-25T09:30:00.000+00:00",
        "tick@2026-02-30T09:30:00.000Z",  # the shape of a date, not a date
        "tick@manual:yesterday",
        "@2026-11-25T09:30:00.000Z",  # no entry
        "no slot at all",
    ],
)
def test_any_other_header_is_kept_whole(text):
    assert parse_occurrence(text) == Occurrence(OTHER, text, None)


def test_only_beats_own_slot_form_is_a_time():
    assert slot_ms("2026-11-25T09:30:00.000Z") == T0_MS
    for text in ("2026-11-25T09:30:00Z", "2026-11-25 09:30:00.000Z", "2026-13-01T00:00:00.000Z"):
        assert slot_ms(text) is None


def test_the_slot_form_round_trips_exactly():
    for offset in (0, 1, 999, 86_399_999, 400 * DAY_MS + 7):
        assert slot_ms(slot(T0_MS + offset)) == T0_MS + offset


def test_completed_occurrences_are_found_by_their_exact_header():
    record = OccurrenceRecord()
    record.add(header("tick", T0_MS), T0_MS)
    record.add(f"tick@manual:{slot(T0_MS)}", T0_MS)
    record.add("x@whatever", T0_MS)
    assert header("tick", T0_MS) in record
    assert f"tick@manual:{slot(T0_MS)}" in record
    assert "x@whatever" in record
    # The same time under another entry, the next slot, a manual run of another time.
    assert header("tock", T0_MS) not in record
    assert header("tick", T0_MS + 1) not in record
    assert f"tick@manual:{slot(T0_MS + 1)}" not in record
    assert f"tock@manual:{slot(T0_MS)}" not in record
    assert "x@whatever2" not in record


def test_a_scheduled_slot_and_a_manual_run_of_the_same_time_are_different_occurrences():
    record = OccurrenceRecord()
    record.add(header("tick", T0_MS), T0_MS)
    assert f"tick@manual:{slot(T0_MS)}" not in record


def test_stored_form_is_compact_json_with_sorted_deltas_and_the_writing_token():
    record = OccurrenceRecord()
    for moment in (T0_MS + 2 * MINUTE, T0_MS, T0_MS + MINUTE):
        record.add(header("tick", moment), T0_MS + 2 * MINUTE)
    record.add(f"tick@manual:{slot(T0_MS)}", T0_MS)
    record.add("free-form", T0_MS + 5)
    text = record.dumps(token=42)
    document = json.loads(text)
    assert document["token"] == 42 and document["v"] == 1
    assert document["slots"] == {"tick": [T0_MS, MINUTE, MINUTE]}
    assert document["manual"] == {"tick": [T0_MS]}
    assert document["other"] == {"free-form": T0_MS + 5}
    assert " " not in text
    assert OccurrenceRecord.loads(text) == record


@pytest.mark.parametrize(
    "text", ["[]", "{}", '{"v": 2}', '{"v": 1, "slots": []}', "not json", '{"v": 1}']
)
def test_a_value_that_is_no_record_is_refused(text):
    with pytest.raises(ValueError):  # noqa: PT011 - any ValueError: json's or the record's
        OccurrenceRecord.loads(text)


def test_a_minutely_entry_is_remembered_for_24_hours():
    record = OccurrenceRecord()
    now = T0_MS + 2 * DAY_MS
    for moment in range(T0_MS, now + 1, MINUTE):
        record.add(header("tick", moment), moment)
    record.prune(now)
    assert header("tick", now - DAY_MS) in record
    assert header("tick", now - DAY_MS - MINUTE) not in record
    assert len(record) == DAY_MS // MINUTE + 1


def test_an_entry_rarer_than_12_hours_is_remembered_for_two_periods():
    record = OccurrenceRecord()
    slots = [T0_MS + i * 20 * HOUR for i in range(6)]  # every 20 h: two periods are 40 h
    for moment in slots:
        record.add(header("report", moment), moment)
    record.prune(slots[-1])
    assert [header("report", s) in record for s in slots] == [False] * 3 + [True] * 3


def test_a_weekly_entry_keeps_its_slots_for_two_weeks_and_learns_its_period_from_two():
    record = OccurrenceRecord()
    record.add(header("weekly", T0_MS), T0_MS)
    record.prune(T0_MS + 6 * DAY_MS)  # alone: its period is unknown, the newest two are kept
    assert header("weekly", T0_MS) in record
    record.add(header("weekly", T0_MS + WEEK), T0_MS + WEEK)
    record.prune(T0_MS + WEEK + 6 * DAY_MS)
    assert header("weekly", T0_MS) in record  # 13 days old: within two periods
    record.add(header("weekly", T0_MS + 2 * WEEK), T0_MS + 2 * WEEK)
    record.prune(T0_MS + 2 * WEEK + HOUR)
    assert header("weekly", T0_MS) not in record
    assert header("weekly", T0_MS + WEEK) in record


def test_an_entry_that_stopped_for_two_periods_is_forgotten_whole():
    record = OccurrenceRecord()
    for i in range(3):
        record.add(header("gone", T0_MS + i * HOUR), T0_MS)
    record.prune(T0_MS + 2 * HOUR + DAY_MS - 1)
    assert header("gone", T0_MS + 2 * HOUR) in record
    record.prune(T0_MS + 2 * HOUR + DAY_MS + 1)
    assert len(record) == 0


def test_an_entry_is_capped_at_its_newest_2048_slots():
    record = OccurrenceRecord()
    now = T0_MS + 5000 * 1000
    for i in range(5000):  # every second: 2048 slots are about 34 minutes
        record.add(header("fast", T0_MS + i * 1000), now)
    record.prune(now)
    assert len(record) == MAX_SLOTS
    assert header("fast", T0_MS + 4999 * 1000) in record
    assert header("fast", T0_MS + (5000 - MAX_SLOTS) * 1000) in record
    assert header("fast", T0_MS + (5000 - MAX_SLOTS - 1) * 1000) not in record
    # The cap is also kept while runs complete, before any prune of the caller's.
    assert len(record) <= MAX_SLOTS + 256


def test_manual_runs_last_their_entrys_horizon_and_other_headers_24_hours_from_completion():
    record = OccurrenceRecord()
    for i in range(3):
        record.add(header("daily2", T0_MS + i * 2 * DAY_MS), T0_MS)  # every 2 days: 4 days
    record.add(f"daily2@manual:{slot(T0_MS)}", T0_MS)
    record.add(f"solo@manual:{slot(T0_MS)}", T0_MS)
    record.add("free", T0_MS + HOUR)
    record.prune(T0_MS + 3 * DAY_MS)
    assert f"daily2@manual:{slot(T0_MS)}" in record
    assert f"solo@manual:{slot(T0_MS)}" not in record
    assert "free" not in record  # completed more than 24 h ago
    record.add("free", T0_MS + 3 * DAY_MS - HOUR)
    record.prune(T0_MS + 3 * DAY_MS)
    assert "free" in record


def test_other_headers_and_entries_are_capped():
    record = OccurrenceRecord()
    for i in range(MAX_OTHER + 10):
        record.add(f"free-{i}", T0_MS + i)
    for i in range(MAX_ENTRIES + 10):
        record.add(header(f"entry-{i}", T0_MS + i), T0_MS)
    record.prune(T0_MS + MAX_ENTRIES + 10)
    assert "free-0" not in record and f"free-{MAX_OTHER + 9}" in record
    assert header("entry-0", T0_MS) not in record
    assert header(f"entry-{MAX_ENTRIES + 9}", T0_MS + MAX_ENTRIES + 9) in record
    assert len(record) == MAX_OTHER + MAX_ENTRIES


def test_merge_is_a_union_and_covers_tells_what_one_side_lacks():
    mine, stored = OccurrenceRecord(), OccurrenceRecord()
    mine.add(header("tick", T0_MS), T0_MS)
    stored.add(header("tick", T0_MS + MINUTE), T0_MS)
    stored.add("free", T0_MS)
    assert not stored.covers(mine) and not mine.covers(stored)
    mine.merge(stored)
    assert mine.covers(stored) and not stored.covers(mine)
    assert all(h in mine for h in (header("tick", T0_MS), header("tick", T0_MS + MINUTE), "free"))
    assert OccurrenceRecord().covers(OccurrenceRecord())


def test_a_year_of_a_minutely_entry_stays_small():
    """What one task writes to the store: 24 h of a 1-minute entry, a few kilobytes."""
    record = OccurrenceRecord()
    start = T0_MS - int(timedelta(days=365).total_seconds() * 1000)
    for moment in range(start, T0_MS + 1, 10 * MINUTE):
        record.add(header("tick", moment), moment)
    record.prune(T0_MS)
    assert len(record.dumps(token=1)) < 2000


def test_retention_counts_from_the_slot_not_from_the_completion():
    """A documented limit: a run of a slot three days old, completing now, is not kept past
    the next prune (unless it is among its entry's newest two slots)."""
    record = OccurrenceRecord()
    now = T0_MS + 3 * DAY_MS
    for i in range(1, 4):
        record.add(header("tick", now - i * MINUTE), now)
    record.add(header("tick", T0_MS), now)
    assert header("tick", T0_MS) in record
    record.prune(now)
    assert header("tick", T0_MS) not in record
    assert header("tick", now - MINUTE) in record
