"""The record of completed occurrences: parsing headers, retention and caps, the stored form."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from celery_leader.tasks.occurrence_record import (
    DAY_MS,
    LATE_MS,
    LONE_MS,
    MANUAL,
    MAX_MANUAL,
    MAX_OTHER,
    MAX_SLOTS,
    OTHER,
    SLOT,
    STORED_IDS,
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


def test_digits_of_other_scripts_are_no_slot():
    """strptime reads Arabic-Indic digits as digits: without an ASCII-only form, this header
    and beat's own would fall on one record item."""
    arabic = "\u0662\u0660\u0662\u0666"  # 2026
    assert slot_ms(f"{arabic}-11-25T09:30:00.000Z") is None
    text = f"tick@{arabic}-11-25T09:30:00.000Z"
    assert parse_occurrence(text) == Occurrence(OTHER, text, None)
    record = OccurrenceRecord()
    record.add(text, T0_MS, "a")
    assert header("tick", T0_MS) not in record


def test_the_slot_form_round_trips_exactly():
    for offset in (0, 1, 999, 86_399_999, 400 * DAY_MS + 7):
        assert slot_ms(slot(T0_MS + offset)) == T0_MS + offset


def test_completed_occurrences_are_found_by_their_exact_header():
    entry, other = OccurrenceRecord(), OccurrenceRecord()  # an entry's shard, the task's other
    entry.add(header("tick", T0_MS), T0_MS, "a")
    entry.add(f"tick@manual:{slot(T0_MS)}", T0_MS, "b")
    other.add("x@whatever", T0_MS, "c")
    assert header("tick", T0_MS) in entry
    assert f"tick@manual:{slot(T0_MS)}" in entry
    assert "x@whatever" in other
    # The next slot, a manual run of another time, another free-form header.
    assert header("tick", T0_MS + 1) not in entry
    assert f"tick@manual:{slot(T0_MS + 1)}" not in entry
    assert "x@whatever2" not in other
    assert 7 not in entry


def test_each_item_keeps_the_task_id_of_the_run_that_completed_it():
    record = OccurrenceRecord()
    record.add(header("tick", T0_MS), T0_MS, "run-1")
    record.add(f"tick@manual:{slot(T0_MS)}", T0_MS, "run-2")
    record.add("free", T0_MS, "run-3")
    assert record.completed_by(header("tick", T0_MS)) == "run-1"
    assert record.completed_by(f"tick@manual:{slot(T0_MS)}") == "run-2"
    assert record.completed_by("free") == "run-3"
    assert record.completed_by(header("tick", T0_MS + MINUTE)) is None


def test_a_scheduled_slot_and_a_manual_run_of_the_same_time_are_different_occurrences():
    record = OccurrenceRecord()
    record.add(header("tick", T0_MS), T0_MS)
    assert f"tick@manual:{slot(T0_MS)}" not in record


def test_stored_form_is_compact_json_with_sorted_deltas_late_completions_and_newest_ids():
    record = OccurrenceRecord()
    for i, moment in enumerate((T0_MS + 2 * MINUTE, T0_MS, T0_MS + MINUTE)):
        record.add(header("tick", moment), moment + 1000, f"id-{i}")
    record.add(header("tick", T0_MS - HOUR), T0_MS + MINUTE, "late")  # an hour after its slot
    record.add(f"tick@manual:{slot(T0_MS)}", T0_MS)  # no task id known
    text = record.dumps(token=42)
    document = json.loads(text)
    assert document["token"] == 42 and document["v"] == 2
    assert document["slots"] == [T0_MS - HOUR, HOUR, MINUTE, MINUTE]
    assert document["slots_late"] == [[0, HOUR + MINUTE]]
    assert document["slots_ids"] == [[0, "late"], [1, "id-1"], [2, "id-2"], [3, "id-0"]]
    assert document["manual"] == [T0_MS]
    assert "manual_ids" not in document and "manual_late" not in document
    assert " " not in text
    assert OccurrenceRecord.loads(text) == record

    other = OccurrenceRecord()
    other.add("free-form", T0_MS + 5, "run")
    other.add("anonymous", T0_MS + 6)
    document = json.loads(other.dumps(token=1))
    assert document["other"] == {"anonymous": [T0_MS + 6], "free-form": [T0_MS + 5, "run"]}
    assert OccurrenceRecord.loads(other.dumps(token=1)) == other


def test_only_the_newest_items_task_ids_are_stored():
    """All ids in memory; in the store only the newest STORED_IDS per kind: the runs a failover
    can leave unacknowledged are the last ones."""
    record = OccurrenceRecord()
    for i in range(20):
        record.add(header("tick", T0_MS + i * MINUTE), T0_MS + i * MINUTE, f"run-{i}")
    assert record.completed_by(header("tick", T0_MS)) == "run-0"
    read = OccurrenceRecord.loads(record.dumps(token=1))
    assert read.completed_by(header("tick", T0_MS)) == ""  # completed, by an unknown run
    assert read.completed_by(header("tick", T0_MS + 19 * MINUTE)) == "run-19"
    known = [i for i in range(20) if read.completed_by(header("tick", T0_MS + i * MINUTE))]
    assert known == list(range(20 - STORED_IDS, 20))
    assert read.covers(record) and record.covers(read)


@pytest.mark.parametrize(
    "text",
    [
        "[]",
        "{}",
        '{"v": 3}',
        '{"v": 2, "slots": {}}',
        "not json",
        '{"v": 1, "slots": {}, "manual": {}, "other": {}}',  # the first, never released form
        '{"v": 2, "slots": [1e999]}',  # a float that int() overflows on
        '{"v": 2, "slots": [1.5]}',
        '{"v": 2, "slots": [true]}',
        '{"v": 2, "slots": [' + "9" * 30 + "]}",
        '{"v": 2, "slots": [1], "slots_late": [[1, 5]]}',  # an index past the slots
        '{"v": 2, "slots": [1], "slots_ids": [[0, 7]]}',
        '{"v": 2, "other": {"x": [1, 2, 3]}}',
        '{"v": 2, "other": {"x": ["1"]}}',
        '{"v": 2, "other": []}',
        "[" * 100_000 + "]" * 100_000,  # deep enough to exhaust the parser (RecursionError)
        '{"v": 2, "slots": ' + "[" * 100_000 + "]" * 100_000 + "}",
    ],
)
def test_any_malformed_value_is_refused_as_a_value_error(text):
    with pytest.raises(ValueError):  # noqa: PT011 - any ValueError: json's or the record's
        OccurrenceRecord.loads(text)


def test_a_minutely_entry_is_remembered_for_24_hours():
    record = OccurrenceRecord()
    now = T0_MS + 2 * DAY_MS
    for moment in range(T0_MS, now + 1, MINUTE):
        record.add(header("tick", moment), moment)
    record.prune(now)
    assert header("tick", now - DAY_MS) in record
    # Completions close to their slot count as LATE_MS after it: kept that much longer.
    assert header("tick", now - DAY_MS - LATE_MS) in record
    assert header("tick", now - DAY_MS - LATE_MS - MINUTE) not in record
    assert len(record) == (DAY_MS + LATE_MS) // MINUTE + 1


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
    record.prune(T0_MS + 6 * DAY_MS)  # alone: its period is unknown, it is kept
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
        record.add(header("gone", T0_MS + i * HOUR), T0_MS + i * HOUR)
    newest = T0_MS + 2 * HOUR + LATE_MS  # when its newest slot counts as completed
    record.prune(newest + DAY_MS - 1)
    assert header("gone", T0_MS + 2 * HOUR) in record
    forgotten = record.prune(newest + DAY_MS + 1)
    assert len(record) == 0
    assert len(forgotten) == 2  # the oldest went at the first prune, with the newest two kept


def test_a_lone_slot_is_kept_32_days_from_its_completion_not_forever():
    """A one-off entry (one slot) is forgotten once LONE_MS passed since its run completed."""
    record = OccurrenceRecord()
    record.add(header("once", T0_MS), T0_MS + 5 * DAY_MS, "run")  # completed 5 days late
    record.prune(T0_MS + 5 * DAY_MS + LONE_MS - 1)
    assert header("once", T0_MS) in record
    record.prune(T0_MS + 5 * DAY_MS + LONE_MS + 1)
    assert len(record) == 0


def test_retention_counts_from_the_completion_of_a_late_run():
    """A catch-up run of a slot three days old, completing now, is remembered a full horizon
    from now; a slot completed on time is not kept longer for it."""
    record = OccurrenceRecord()
    now = T0_MS + 3 * DAY_MS
    for i in range(1, 4):
        record.add(header("tick", now - i * MINUTE), now - i * MINUTE)
    record.add(header("tick", T0_MS), now, "catch-up")
    record.prune(now + DAY_MS - 1)
    assert header("tick", T0_MS) in record
    assert record.completed_by(header("tick", T0_MS)) == "catch-up"
    read = OccurrenceRecord.loads(record.dumps(token=1))  # the completion time is stored
    read.prune(now + DAY_MS - 1)
    assert header("tick", T0_MS) in read
    record.add(header("tick", now + DAY_MS - MINUTE), now + DAY_MS - MINUTE)  # it goes on
    record.prune(now + DAY_MS + 1)
    assert header("tick", T0_MS) not in record


def test_manual_runs_last_their_entrys_horizon_from_completion_and_other_headers_24_hours():
    record = OccurrenceRecord()
    for i in range(3):
        record.add(header("daily2", T0_MS + i * 2 * DAY_MS), T0_MS)  # every 2 days: 4 days
    record.add(f"daily2@manual:{slot(T0_MS)}", T0_MS)
    record.prune(T0_MS + 3 * DAY_MS)
    assert f"daily2@manual:{slot(T0_MS)}" in record

    solo = OccurrenceRecord()  # an entry with no scheduled slot: 24 h from completion
    solo.add(f"solo@manual:{slot(T0_MS)}", T0_MS + 2 * DAY_MS)  # requested, run 2 days later
    solo.prune(T0_MS + 3 * DAY_MS - 1)
    assert f"solo@manual:{slot(T0_MS)}" in solo
    solo.prune(T0_MS + 3 * DAY_MS + 1)
    assert len(solo) == 0

    other = OccurrenceRecord()
    other.add("free", T0_MS + HOUR)
    other.prune(T0_MS + 3 * DAY_MS)
    assert "free" not in other  # completed more than 24 h ago
    other.add("free", T0_MS + 3 * DAY_MS - HOUR)
    other.prune(T0_MS + 3 * DAY_MS)
    assert "free" in other


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
    assert len(record) <= MAX_SLOTS + MAX_MANUAL


def test_other_headers_are_capped():
    record = OccurrenceRecord()
    for i in range(MAX_OTHER + 10):
        record.add(f"free-{i}", T0_MS + i)
    record.prune(T0_MS + MAX_OTHER + 10)
    assert "free-0" not in record and f"free-{MAX_OTHER + 9}" in record
    assert len(record) == MAX_OTHER


def test_prune_returns_what_it_forgot_and_discard_applies_that_to_the_live_record():
    """What a sync thread does: prune a copy outside the lock, then forget the same in the
    live record, except an item completed again meanwhile."""
    live = OccurrenceRecord()
    old, fresh = T0_MS - 3 * DAY_MS, T0_MS
    for moment in (old, old + MINUTE, fresh - MINUTE, fresh):
        live.add(header("tick", moment), moment, f"run-{moment}")
    copy = live.copy()
    forgotten = copy.prune(T0_MS)
    assert len(forgotten) == 2 and header("tick", old) in forgotten
    live.add(header("tick", old + MINUTE), T0_MS, "again")  # completed again meanwhile
    live.discard(forgotten)
    assert header("tick", old) not in live
    assert live.completed_by(header("tick", old + MINUTE)) == "again"
    assert len(live) == 3


def test_merge_is_a_union_that_keeps_known_task_ids_and_covers_tells_what_one_side_lacks():
    mine, stored = OccurrenceRecord(), OccurrenceRecord()
    mine.add(header("tick", T0_MS), T0_MS, "mine")
    stored.add(header("tick", T0_MS + MINUTE), T0_MS)
    stored.add(header("tick", T0_MS), T0_MS)  # read back without its id
    assert not stored.covers(mine) or not mine.covers(stored)
    mine.merge(stored)
    assert mine.covers(stored)
    assert mine.completed_by(header("tick", T0_MS)) == "mine"
    assert mine.completed_by(header("tick", T0_MS + MINUTE)) == ""
    assert OccurrenceRecord().covers(OccurrenceRecord())


def test_a_minutely_entrys_shard_stays_small():
    """What one completion of a 10-minute entry writes: 24 h of it, a couple of kilobytes."""
    record = OccurrenceRecord()
    start = T0_MS - int(timedelta(days=365).total_seconds() * 1000)
    for moment in range(start, T0_MS + 1, 10 * MINUTE):
        record.add(header("tick", moment), moment, "0f5b7f1e-5f6c-4c1e-9d34-8a7e3c1b2a90")
    record.prune(T0_MS)
    assert len(record.dumps(token=1)) < 2000
