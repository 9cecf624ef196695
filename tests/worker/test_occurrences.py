"""One election's occurrences: the gate's verdicts (pure), and their record in a real Redis."""

from __future__ import annotations

import json
import logging
import threading
import time
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest

from celery_leader.stores import open_store
from celery_leader.stores.base import Holder
from celery_leader.tasks.occurrence_record import DAY_MS, LONE_MS, MAX_ENTRIES, OccurrenceRecord
from celery_leader.worker.occurrence_sync import OccurrenceSync
from celery_leader.worker.occurrences import (
    COMPLETED_ALREADY,
    REDELIVERED,
    RUNNING,
    STATE_PREFIX,
    Occurrences,
    occurrence_of,
    parse_state_key,
    result_ready,
    state_key,
)
from celery_leader.worker.redelivery import COMPLETED, FAILED, SUPERSEDED

SLOT = "tick@2026-11-25T09:30:00.000Z"
NEXT = "tick@2026-11-25T09:31:00.000Z"
NOW_MS = 1_795_599_000_000  # the slot's own time
TICK = ("proj.tick", "tick")  # the shard of SLOT and NEXT


class Req:
    """Stands for a Celery request: its task's name, its id and its message's headers."""

    def __init__(self, task_id, occurrence=SLOT, task="proj.tick", token=None):
        self.task = SimpleNamespace(name=task)
        self.id = task_id
        self.leader_token = token
        self._request_dict = {"id": task_id, "leader_occurrence": occurrence}


class Clock:
    """Epoch milliseconds that a test moves on."""

    def __init__(self, now=NOW_MS):
        self.now = now

    def __call__(self):
        return self.now


def completed(occurrences, occurrence, task_id="x", task="proj.tick"):
    run = Req(task_id, occurrence, task=task)
    occurrences.claim(run, occurrence)
    return occurrences.settle(run, COMPLETED)


def test_the_header_is_read_from_the_message_and_only_a_nonempty_string_counts():
    assert occurrence_of(Req("a")) == SLOT
    for value in (None, "", 7, ["tick", SLOT], {"slot": SLOT}):
        assert occurrence_of(Req("a", occurrence=value)) is None

    class Odd(str):
        __slots__ = ()

        def __eq__(self, other):
            return True

        __hash__ = str.__hash__

    found = occurrence_of(Req("a", occurrence=Odd(SLOT)))
    assert type(found) is str and found == SLOT


@pytest.mark.parametrize(
    ("task", "entry"),
    [
        ("proj.tick", "tick"),
        ("proj.tick", None),  # the task's other headers
        ("a@b", "c:d"),
        ("a:b", "c@d"),
        ('we"ird', "[x]"),
        ("proj.tick", ""),
        ("unicode-\u00e9", "nightly \u2603 \ud800"),  # a lone surrogate, too
        ("occurrences:x", '","'),
    ],
)
def test_state_keys_are_json_one_per_task_and_entry_and_read_back_exactly(task, entry):
    key = state_key((task, entry))
    assert key.startswith(STATE_PREFIX)
    assert key.isascii()
    assert parse_state_key(key) == (task, entry)


def test_state_keys_of_different_shards_differ_and_only_our_spelling_is_read():
    shards = [("a@b", "c"), ("a", "b@c"), ("a:b", "c"), ("a", "b:c"), ("a", None), ("a", "")]
    assert len({state_key(s) for s in shards}) == len(shards)
    for key in (
        "occurrences:proj.tick",  # the per-task form of the first, never released, version
        'occurrences:["a", "b"]',  # another spelling of a shard's key
        'occurrences:["a",1]',
        'occurrences:["a","b","c"]',
        "occurrences:[]",
        "occurrences:" + "[" * 100_000,
        "other:x",
    ):
        assert parse_state_key(key) is None


def test_another_message_of_a_running_occurrence_is_skipped_its_own_retry_is_not():
    occurrences = Occurrences(clock_ms=lambda: NOW_MS)
    run = Req("a")
    assert occurrences.verdict(run, SLOT) is None
    occurrences.claim(run, SLOT)
    assert occurrences.verdict(Req("b"), SLOT) == RUNNING
    assert occurrences.verdict(run, SLOT) is None  # the run itself, through the gate again
    assert occurrences.verdict(Req("a"), SLOT) is None  # its retry: the same task id
    assert occurrences.verdict(Req("c", NEXT), NEXT) is None  # the next slot
    other_task = Req("d", task="proj.other")
    assert occurrences.verdict(other_task, SLOT) is None  # the same header, another task


@pytest.mark.parametrize("outcome", [FAILED, SUPERSEDED])
def test_a_run_that_did_not_complete_leaves_nothing_behind(outcome):
    occurrences = Occurrences(clock_ms=lambda: NOW_MS)
    run = Req("a")
    occurrences.claim(run, SLOT)
    assert occurrences.settle(run, outcome) is None
    assert occurrences.verdict(Req("b"), SLOT) is None
    assert occurrences.running() == 0


def test_a_completed_run_is_remembered_once_and_skips_every_later_message():
    occurrences = Occurrences(clock_ms=lambda: NOW_MS)
    run = Req("a")
    occurrences.claim(run, SLOT)
    assert occurrences.settle(run, COMPLETED) == TICK
    assert occurrences.settle(run, COMPLETED) is None  # reported twice: once counts
    assert occurrences.verdict(Req("b"), SLOT) == COMPLETED_ALREADY
    assert completed(occurrences, "free-form") == ("proj.tick", None)
    assert occurrences.verdict(Req("c", "free-form"), "free-form") == COMPLETED_ALREADY


def test_the_completing_runs_own_message_again_is_a_redelivery_not_a_skip():
    """Its acknowledgement was lost (RabbitMQ delivers it again with a new delivery tag, which
    the redelivery record does not know): storing SKIPPED over its SUCCESS would leave
    result.get() waiting for ever."""
    occurrences = Occurrences(clock_ms=lambda: NOW_MS)
    completed(occurrences, SLOT, task_id="a")
    completed(occurrences, "free-form", task_id="f")
    assert occurrences.verdict(Req("a"), SLOT) == REDELIVERED
    assert occurrences.verdict(Req("f", "free-form"), "free-form") == REDELIVERED
    assert occurrences.verdict(Req("b"), SLOT) == COMPLETED_ALREADY


def test_a_message_never_claimed_settles_nothing():
    """One skipped at the gate, or kept back by the overlap policy, is no run of its own."""
    occurrences = Occurrences(clock_ms=lambda: NOW_MS)
    run, skipped = Req("a"), Req("b")
    occurrences.claim(run, SLOT)
    assert occurrences.settle(skipped, COMPLETED) is None
    assert occurrences.verdict(Req("c"), SLOT) == RUNNING


def test_absorb_merges_stored_shards_and_says_which_the_store_lacks():
    mine, theirs = Occurrences(clock_ms=lambda: NOW_MS), Occurrences(clock_ms=lambda: NOW_MS)
    completed(mine, SLOT, task="proj.a")
    completed(theirs, NEXT, task="proj.b", task_id="theirs")
    stored = {
        state_key(("proj.b", "tick")): theirs.snapshot(("proj.b", "tick"), token=3),
        state_key(("proj.c", "tick")): "garbage",
        state_key(("proj.c", "huge")): '{"v":2,"slots":[1e999]}',  # int() overflows
        state_key(("proj.c", "deep")): "[" * 100_000 + "]" * 100_000,  # RecursionError
        "occurrences:proj.d": '{"v":1,"slots":{},"manual":{},"other":{}}',  # the unreleased v1
        "unrelated": "{}",
    }
    behind, unreadable = mine.absorb(stored)
    assert behind == [("proj.a", "tick")]
    assert set(unreadable) == set(stored) - {"unrelated", state_key(("proj.b", "tick"))}
    assert mine.verdict(Req("y", NEXT, task="proj.b"), NEXT) == COMPLETED_ALREADY
    assert mine.verdict(Req("theirs", NEXT, task="proj.b"), NEXT) == REDELIVERED
    assert mine.verdict(Req("y", SLOT, task="proj.a"), SLOT) == COMPLETED_ALREADY


def test_absorb_writes_empty_a_stored_shard_that_is_all_forgotten_by_now():
    """A stopped entry's stored shard: nothing of it is merged, and it is written empty."""
    clock = Clock()
    earlier = Occurrences(clock_ms=clock)
    completed(earlier, SLOT)
    stored = {state_key(TICK): earlier.snapshot(TICK, token=1)}
    clock.now += LONE_MS + DAY_MS
    later = Occurrences(clock_ms=clock)
    behind, unreadable = later.absorb(stored)
    assert (behind, unreadable) == ([TICK], [])
    assert later.verdict(Req("b"), SLOT) is None
    assert json.loads(later.snapshot(TICK, token=2)) == {"v": 2, "token": 2}


def test_a_snapshot_is_pruned_on_a_copy_and_memory_forgets_the_same():
    clock = Clock()
    occurrences = Occurrences(clock_ms=clock)
    completed(occurrences, SLOT)
    completed(occurrences, "free-form")
    clock.now += 2 * DAY_MS
    document = json.loads(occurrences.snapshot(("proj.tick", None), token=5))
    assert document == {"v": 2, "token": 5}  # other headers: 24 h
    assert occurrences.verdict(Req("b", "free-form"), "free-form") is None
    assert "slots" in json.loads(occurrences.snapshot(TICK, token=5))  # a lone slot: 32 days


def at(entry, moment_ms):
    """The header of *entry*'s slot at *moment_ms*, as beat writes it."""
    moment = datetime.fromtimestamp(moment_ms / 1000, timezone.utc)
    return f"{entry}@{moment.strftime('%Y-%m-%dT%H:%M:%S.')}{moment_ms % 1000:03d}Z"


def test_a_sweep_forgets_stopped_entries_and_caps_a_task_at_max_entries():
    """Entries whose newest completion is oldest go first; lone slots go after 32 days."""
    clock = Clock()
    occurrences = Occurrences(clock_ms=clock)
    for i in range(MAX_ENTRIES + 3):
        clock.now = NOW_MS + i * 1000
        completed(occurrences, at(f"e{i}", clock.now))
    completed(occurrences, SLOT, task="proj.other")
    assert sorted(occurrences.sweep()) == sorted(("proj.tick", f"e{i}") for i in range(3))
    assert occurrences.verdict(Req("b"), at("e0", NOW_MS)) is None
    assert occurrences.verdict(Req("b"), at("e3", NOW_MS + 3000)) == COMPLETED_ALREADY
    clock.now += LONE_MS + DAY_MS  # every lone slot is forgotten now: not kept for ever
    assert len(occurrences.sweep()) == MAX_ENTRIES + 1
    assert occurrences.sweep() == []


def test_unsettled_counts_the_terms_runs_not_those_gone_nor_other_terms():
    occurrences = Occurrences(clock_ms=lambda: NOW_MS)
    mine, killed, older = Req("a", token=7), Req("b", NEXT, token=7), Req("c", "x", token=6)
    for run in (mine, killed, older):
        occurrences.claim(run, run._request_dict["leader_occurrence"])
    assert occurrences.unsettled(7) == 2
    assert occurrences.unsettled(7, gone=lambda run: run is killed) == 1
    occurrences.settle(mine, COMPLETED)
    assert occurrences.unsettled(7, gone=lambda run: run is killed) == 0


# -- the gate's verdicts at the coordinator --------------------------------------


class Backend:
    """Stands for a result backend: the states it holds, and what was written."""

    def __init__(self, states=None):
        self.states = dict(states or {})
        self.written = []

    def get_state(self, task_id):
        return self.states.get(task_id, "PENDING")

    def store_result(self, task_id, result, state):
        self.written.append((task_id, state))


class GateReq(Req):
    """A request at the gate: acknowledged or not."""

    def __init__(self, task_id, backend, occurrence=SLOT):
        super().__init__(task_id, occurrence)
        self.task = SimpleNamespace(name="proj.tick", backend=backend, ignore_result=False)
        self.leader_election = None
        self.acked = False

    def humaninfo(self):
        return f"proj.tick[{self.id}]"

    def acknowledge(self):
        self.acked = True


@pytest.fixture
def coordinator():
    from celery_leader.settings import load_settings
    from celery_leader.worker.coordinator import Coordinator

    settings = load_settings({"leader_backend_url": "memory://occurrences"}, "t")
    store = open_store("memory://occurrences", timeout=1)
    made = Coordinator(settings, store, nodename="n@h", pool_kind="threads")
    yield made
    made.default.occurrence_sync.close()
    store.close()


def test_the_gate_acknowledges_a_completed_runs_own_message_without_touching_its_result(
    coordinator,
):
    backend = Backend({"a": "SUCCESS", "old": "SUCCESS"})
    completed(coordinator.default.occurrences, SLOT, task_id="a")
    again = GateReq("a", backend)
    assert coordinator.gate.admit_occurrence(again) is False
    assert again.acked and backend.written == []

    # Another message of the occurrence: SKIPPED, as before.
    other = GateReq("b", backend)
    assert coordinator.gate.admit_occurrence(other) is False
    assert other.acked and backend.written == [("b", "SKIPPED")]

    # A run whose id the record does not keep (an older item read from the store): its
    # result is ready in the backend, and is never overwritten.
    older = GateReq("old", backend)
    assert coordinator.gate.admit_occurrence(older) is False
    assert older.acked and backend.written == [("b", "SKIPPED")]

    fresh = GateReq("c", backend, occurrence=NEXT)
    assert coordinator.gate.admit_occurrence(fresh) is True
    assert not fresh.acked


def test_while_the_record_is_read_the_gate_says_so_and_inspect_shows_the_wait(
    coordinator, monkeypatch
):
    from celery_leader.lease import Role

    election = coordinator.default
    monkeypatch.setattr(election.manager, "current_token", lambda: 5)
    monkeypatch.setattr(election.manager, "time_left", lambda: 3.0)
    monkeypatch.setattr(
        election.manager, "state", lambda: SimpleNamespace(role=Role.LEADER, token=5)
    )
    monkeypatch.setattr(
        election.shared, "deadline_of", lambda token, now=None: 100.0 if token == 5 else None
    )
    monkeypatch.setattr(election.occurrence_sync, "ready", lambda token: False)
    monkeypatch.setattr(election.occurrence_sync, "reading_for", lambda token: 1.25)
    assert election.admit() is None
    assert election.refusal_reason() == "the term's record of completed occurrences is being read"
    assert election.describe()["reading_occurrences"] == 1.25

    monkeypatch.setattr(election.occurrence_sync, "ready", lambda token: True)
    monkeypatch.setattr(election.occurrence_sync, "reading_for", lambda token: None)
    assert election.admit() == 5
    assert "reading_occurrences" not in election.describe()
    monkeypatch.setattr(election.manager, "current_token", lambda: None)
    assert election.refusal_reason() == "this worker does not hold the lease"


def test_result_ready_reads_a_real_backend(redis_server):
    from celery import Celery

    app = Celery("t", broker="memory://", backend=redis_server.url)
    try:
        task = SimpleNamespace(backend=app.backend, ignore_result=False)
        app.backend.store_result("done", 1, "SUCCESS")
        app.backend.store_result("started", None, "STARTED")
        app.backend.store_result("skipped", {"reason": "occurrence"}, "SKIPPED")
        assert result_ready(task, "done")
        for task_id in ("started", "skipped", "never"):
            assert not result_ready(task, task_id)
        assert not result_ready(SimpleNamespace(backend=app.backend, ignore_result=True), "done")
        rpc = Celery("t", broker="memory://", backend="rpc://")
        assert not result_ready(SimpleNamespace(backend=rpc.backend, ignore_result=False), "done")
        assert not result_ready(SimpleNamespace(backend=None, ignore_result=False), "done")
    finally:
        app.backend.client.close()


# -- the record in a real store ------------------------------------------------


def wait_for(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


class Recording:
    """The store the sync is given: the real one, its writes recorded, slowed or failed."""

    def __init__(self, store):
        self.store = store
        self.url = store.url
        self.writes = []
        self.write_delay = 0.0
        self.fail_writes = 0
        self.writing = threading.Event()

    def get_state(self, name):
        return self.store.get_state(name)

    def set_state(self, name, lease_id, key, value):
        self.writing.set()
        time.sleep(self.write_delay)
        if self.fail_writes:
            self.fail_writes -= 1
            raise ConnectionError("the store is down")
        self.writes.append((key, len(value)))
        return self.store.set_state(name, lease_id, key, value)

    def written(self, shard):
        return [size for key, size in self.writes if key == state_key(shard)]


class Leader:
    """One worker's side of an election "e" on a real store: its occurrences and their sync."""

    def __init__(self, url, *, leading=True, timeout=0.5, retry_every=0.2, sweep_every=600.0):
        self.store = open_store(url, timeout=timeout)
        self.recording = Recording(self.store)
        self.holder = Holder.for_this_process("w")
        self.clock = Clock()
        self.occurrences = Occurrences(clock_ms=self.clock)
        self.ready: list[int] = []
        self.sync = OccurrenceSync(
            self.occurrences,
            self.recording,
            "e",
            timeout=timeout,
            retry_every=retry_every,
            leading=lambda token: leading,
            on_ready=self.ready.append,
            sweep_every=sweep_every,
        )

    def elect(self):
        result = self.store.acquire("e", self.holder, ttl=60)
        assert result.acquired
        self.token = result.token
        self.sync.begin_term(self.token, self.holder.lease_id)
        return self.token

    def complete(self, occurrence, task_id="a", task="proj.tick"):
        grown = completed(self.occurrences, occurrence, task_id=task_id, task=task)
        assert grown is not None
        self.sync.completed(grown)

    def stored(self, shard=TICK):
        value = self.store.get_state("e").get(state_key(shard))
        return None if value is None else OccurrenceRecord.loads(value)

    def close(self):
        self.sync.close()
        self.store.close()


@pytest.fixture
def leaders(redis_server):
    made = []

    def make(**options):
        leader = Leader(redis_server.url, **options)
        made.append(leader)
        return leader

    yield make
    for leader in made:
        leader.close()


def slot_of(minute, entry="tick"):
    return f"{entry}@2026-11-25T{9 + minute // 60:02d}:{minute % 60:02d}:00.000Z"


def test_a_completion_is_written_and_the_next_leader_reads_it_before_it_admits(leaders):
    first = leaders()
    token = first.elect()
    assert wait_for(lambda: first.sync.ready(token))
    assert first.ready == [token]
    first.complete(SLOT)
    assert first.sync.flush(token, 2.0)
    assert SLOT in first.stored()
    assert first.store.release("e", first.holder.lease_id)

    second = leaders()
    assert not second.sync.ready(None)
    token2 = second.elect()
    assert wait_for(lambda: second.sync.ready(token2))
    assert second.occurrences.verdict(Req("b"), SLOT) == COMPLETED_ALREADY
    assert second.occurrences.verdict(Req("a"), SLOT) == REDELIVERED  # its id was stored
    assert second.occurrences.verdict(Req("c", NEXT), NEXT) is None


def test_writes_of_one_shard_are_coalesced_to_one_per_renew_interval(leaders):
    """Ten completions of one entry within half a second: one write at once, the rest in
    one write a renew interval later (a write per completion before)."""
    leader = leaders(retry_every=1.5)
    token = leader.elect()
    assert wait_for(lambda: leader.sync.ready(token))
    for minute in range(10):
        leader.complete(slot_of(minute), task_id=f"run-{minute}")
        time.sleep(0.05)
    time.sleep(0.3)
    assert len(leader.recording.written(TICK)) == 1
    assert wait_for(lambda: len(leader.stored() or ()) == 10, 3.0)
    assert len(leader.recording.written(TICK)) == 2


def test_a_completion_rewrites_its_own_entrys_shard_only(leaders):
    """Fifty busy entries: a completion of one writes that entry's key, a few hundred bytes,
    not the task's whole record."""
    leader = leaders()
    token = leader.elect()
    assert wait_for(lambda: leader.sync.ready(token))
    for entry in range(50):
        for minute in range(60):
            grown = completed(leader.occurrences, slot_of(minute, f"e{entry}"))
        leader.sync.completed(grown)
    assert leader.sync.flush(token, 3.0)
    leader.recording.writes.clear()
    leader.complete(slot_of(61, "e7"), task_id="late")
    assert leader.sync.flush(token, 2.0)
    assert [key for key, _ in leader.recording.writes] == [state_key(("proj.tick", "e7"))]
    assert leader.recording.writes[0][1] < 1000
    assert len(leader.store.get_state("e")) == 50


def test_a_malformed_stored_value_is_skipped_logged_once_and_the_term_starts(leaders, caplog):
    """A value that json reads but int() overflows on (1e999), one nested past the parser's
    depth: each is skipped with one warning, the rest is read, and the term starts."""
    earlier = leaders()
    token = earlier.elect()
    assert wait_for(lambda: earlier.sync.ready(token))
    earlier.complete(SLOT)
    assert earlier.sync.flush(token, 2.0)
    lease = earlier.holder.lease_id
    huge, deep = state_key(("proj.tick", "huge")), state_key(("proj.tick", "deep"))
    assert earlier.store.set_state("e", lease, huge, '{"v":2,"slots":[1e999]}')
    assert earlier.store.set_state("e", lease, deep, "[" * 100_000 + "]" * 100_000)
    assert earlier.store.release("e", lease)

    leader = leaders()
    token = leader.elect()
    assert wait_for(lambda: leader.sync.ready(token), 2.0)
    assert leader.occurrences.verdict(Req("b"), SLOT) == COMPLETED_ALREADY
    warnings = [r for r in caplog.records if "hold no occurrence record" in r.getMessage()]
    assert len(warnings) == 1 and huge in warnings[0].getMessage()
    assert leader.store.release("e", leader.holder.lease_id)
    token = leader.elect()  # another term reads the same keys: not logged again
    assert wait_for(lambda: leader.sync.ready(token), 2.0)
    time.sleep(0.1)
    assert len([r for r in caplog.records if "hold no occurrence record" in r.getMessage()]) == 1


def test_an_error_while_merging_what_was_read_leaves_the_term_ready_and_is_retried(leaders, caplog):
    leader = leaders()
    real = leader.occurrences.absorb
    calls = []

    def absorb(state):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("surprise")
        return real(state)

    leader.occurrences.absorb = absorb
    token = leader.elect()
    assert wait_for(lambda: leader.sync.ready(token), 2.0)
    assert "could not read the completed occurrences" in caplog.text
    assert "surprise" in caplog.text
    leader.complete(SLOT)
    assert wait_for(lambda: leader.stored() is not None, 3.0)  # read again, then written
    assert len(calls) == 2


def test_a_new_terms_read_goes_before_the_last_terms_writes(leaders):
    """The sync thread is writing twelve shards, each write slow, when a new term begins: the
    write job stops at its next shard, and the new term is ready in about one write, not
    twelve."""
    leader = leaders(timeout=2.0)
    token = leader.elect()
    assert wait_for(lambda: leader.sync.ready(token))
    leader.recording.write_delay = 0.25
    for entry in range(12):
        leader.complete(slot_of(0, f"e{entry}"))
    assert leader.recording.writing.wait(2.0)
    assert leader.store.release("e", leader.holder.lease_id)
    started = time.monotonic()
    token2 = leader.elect()
    assert token2 != token
    assert wait_for(lambda: leader.sync.ready(token2), 5.0)
    assert time.monotonic() - started < 1.0  # twelve writes would take 3 s
    leader.recording.write_delay = 0.0
    # The new term found in the read what the old one left unwritten, and writes it.
    assert wait_for(lambda: len(leader.store.get_state("e")) == 12, 5.0)


def test_flush_tries_a_failed_write_again_at_once(leaders):
    """The retry interval (a renew interval) is longer than the flush's wait: the flush makes
    the write go now."""
    leader = leaders(retry_every=30.0)
    token = leader.elect()
    assert wait_for(lambda: leader.sync.ready(token))
    leader.recording.fail_writes = 1
    leader.complete(SLOT)
    assert wait_for(lambda: leader.recording.fail_writes == 0)
    started = time.monotonic()
    assert leader.sync.flush(token, 2.0)
    assert time.monotonic() - started < 1.0
    assert SLOT in leader.stored()


def test_flush_waits_for_the_terms_live_runs_only(leaders):
    """A run of the term that may still complete is waited for; one whose process is gone,
    or any after a loss (a stuck loop settles nothing), is not."""
    leader = leaders()
    token = leader.elect()
    assert wait_for(lambda: leader.sync.ready(token))
    stuck = Req("stuck", token=token)
    leader.occurrences.claim(stuck, SLOT)
    leader.occurrences.claim(Req("old", NEXT, token=token - 1), NEXT)  # an older term's
    assert not leader.sync.flush(token, 0.3)
    started = time.monotonic()
    assert leader.sync.flush(token, 2.0, gone=lambda run: run is stuck)
    assert leader.sync.flush(token, 2.0, settle_runs=False)
    assert time.monotonic() - started < 0.5

    # One that completes meanwhile is waited for, and written.
    threading.Timer(
        0.2, lambda: leader.sync.completed(leader.occurrences.settle(stuck, COMPLETED))
    ).start()
    assert leader.sync.flush(token, 2.0)
    assert SLOT in leader.stored()


def test_a_sweep_forgets_a_stopped_entry_in_memory_and_in_the_store(leaders):
    leader = leaders(sweep_every=0.2)
    token = leader.elect()
    assert wait_for(lambda: leader.sync.ready(token))
    leader.complete(SLOT)
    assert leader.sync.flush(token, 2.0)
    assert SLOT in leader.stored()
    leader.clock.now += LONE_MS + DAY_MS
    assert wait_for(lambda: len(leader.stored()) == 0, 3.0)
    assert leader.occurrences.verdict(Req("b"), SLOT) is None


def test_a_write_after_the_lease_is_gone_is_refused_and_dropped(leaders, caplog):
    leader = leaders()
    token = leader.elect()
    assert wait_for(lambda: leader.sync.ready(token))
    assert leader.store.release("e", leader.holder.lease_id)
    caplog.set_level(logging.DEBUG, logger="celery_leader")
    leader.complete(SLOT)
    assert leader.sync.flush(token, 2.0)
    assert leader.store.get_state("e") == {}
    assert "the lease of term" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_an_unreadable_store_lets_the_term_start_and_is_read_and_written_later(
    leaders, redis_server, caplog
):
    """The read hangs (server paused): the term is ready within the store timeout, with a
    warning; nothing is written meanwhile; once the server answers, the record is merged
    and this worker's completion written."""
    earlier = leaders()
    token = earlier.elect()
    assert wait_for(lambda: earlier.sync.ready(token))
    earlier.complete(NEXT, task="proj.tick")
    assert earlier.sync.flush(token, 2.0)
    assert earlier.store.release("e", earlier.holder.lease_id)

    leader = leaders(timeout=0.3)
    acquired = leader.store.acquire("e", leader.holder, ttl=60)
    assert acquired.acquired
    token = acquired.token
    leader.complete(SLOT, task="proj.mine")  # remembered from an earlier term of this worker
    redis_server.pause()
    try:
        started = time.monotonic()
        leader.sync.begin_term(token, leader.holder.lease_id)
        assert leader.sync.reading_for(token) is not None  # what `inspect leader` shows
        assert wait_for(lambda: leader.sync.ready(token), 3.0)
        assert leader.sync.reading_for(token) is None
        assert time.monotonic() - started < 1.5
        assert "could not read the completed occurrences" in caplog.text
        assert leader.occurrences.verdict(Req("b", NEXT), NEXT) is None  # not read yet
    finally:
        redis_server.resume()
    assert wait_for(lambda: leader.occurrences.verdict(Req("b", NEXT), NEXT) is not None)
    assert wait_for(lambda: state_key(("proj.mine", "tick")) in leader.store.get_state("e"))
    assert state_key(TICK) in leader.store.get_state("e")
    assert leader.ready == [token]


def test_the_gate_profile_is_kept_per_task_object_and_refuses_bad_options_after_admission(
    coordinator,
):
    """Two tasks of one class with their own options get their own profile; a value not
    allowed is not cached as a verdict: it is refused where the gate refused it before."""
    from celery_leader.exceptions import ConfigurationError

    class Job:
        leader_election = None

    plain, skipping, broken = Job(), Job(), Job()
    skipping.leader_overlap = "skip"
    skipping.leader_on_loss = "cancel"
    broken.leader_overlap = "bogus"
    broken.leader_on_loss = "bogus"

    first = coordinator.gate_profile(plain)
    assert (first.overlap, first.on_loss, first.election) == (False, "cancel", coordinator.default)
    assert coordinator.gate_profile(plain) is first  # worked out once
    second = coordinator.gate_profile(skipping)
    assert (second.overlap, second.on_loss) == (True, "cancel")
    third = coordinator.gate_profile(broken)
    assert third.overlap is True and third.on_loss is None
    with pytest.raises(ConfigurationError, match="on_loss='bogus'"):
        coordinator.policy_for(broken)
