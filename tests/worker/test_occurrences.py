"""One election's occurrences: the gate's verdicts (pure), and their record in a real Redis."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import pytest

from celery_leader.stores import open_store
from celery_leader.stores.base import Holder
from celery_leader.tasks.occurrence_record import OccurrenceRecord
from celery_leader.worker.occurrence_sync import OccurrenceSync
from celery_leader.worker.occurrences import (
    COMPLETED_ALREADY,
    RUNNING,
    STATE_PREFIX,
    Occurrences,
    occurrence_of,
)
from celery_leader.worker.redelivery import COMPLETED, FAILED, SUPERSEDED

SLOT = "tick@2026-11-25T09:30:00.000Z"
NEXT = "tick@2026-11-25T09:31:00.000Z"
NOW_MS = 1_795_599_000_000  # the slot's own time


class Req:
    """Stands for a Celery request: its task's name, its id and its message's headers."""

    def __init__(self, task_id, occurrence=SLOT, task="proj.tick"):
        self.task = SimpleNamespace(name=task)
        self.id = task_id
        self._request_dict = {"id": task_id, "leader_occurrence": occurrence}


def test_the_header_is_read_from_the_message_and_only_a_nonempty_string_counts():
    assert occurrence_of(Req("a")) == SLOT
    for value in (None, "", 7):
        assert occurrence_of(Req("a", occurrence=value)) is None


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
    assert occurrences.settle(run, COMPLETED) == "proj.tick"
    assert occurrences.settle(run, COMPLETED) is None  # reported twice: once counts
    assert occurrences.verdict(Req("b"), SLOT) == COMPLETED_ALREADY
    assert occurrences.verdict(Req("a"), SLOT) == COMPLETED_ALREADY  # after a failover, too


def test_a_message_never_claimed_settles_nothing():
    """One skipped at the gate, or kept back by the overlap policy, is no run of its own."""
    occurrences = Occurrences(clock_ms=lambda: NOW_MS)
    run, skipped = Req("a"), Req("b")
    occurrences.claim(run, SLOT)
    assert occurrences.settle(skipped, COMPLETED) is None
    assert occurrences.verdict(Req("c"), SLOT) == RUNNING


def test_absorb_merges_stored_records_and_says_which_the_store_lacks():
    mine, theirs = Occurrences(clock_ms=lambda: NOW_MS), Occurrences(clock_ms=lambda: NOW_MS)
    for occurrences, occurrence, task in ((mine, SLOT, "proj.a"), (theirs, NEXT, "proj.b")):
        run = Req("x", occurrence, task=task)
        occurrences.claim(run, occurrence)
        occurrences.settle(run, COMPLETED)
    stored = {
        STATE_PREFIX + "proj.b": theirs.snapshot("proj.b", token=3),
        STATE_PREFIX + "proj.c": "garbage",
        "unrelated": "{}",
    }
    behind, unreadable = mine.absorb(stored)
    assert behind == ["proj.a"]
    assert unreadable == [STATE_PREFIX + "proj.c"]
    assert mine.verdict(Req("y", NEXT, task="proj.b"), NEXT) == COMPLETED_ALREADY
    assert mine.verdict(Req("y", SLOT, task="proj.a"), SLOT) == COMPLETED_ALREADY


# -- the record in a real store ------------------------------------------------


def wait_for(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


class Leader:
    """One worker's side of an election "e" on a real store: its occurrences and their sync."""

    def __init__(self, url, *, leading=True, timeout=0.5):
        self.store = open_store(url, timeout=timeout)
        self.holder = Holder.for_this_process("w")
        self.occurrences = Occurrences(clock_ms=lambda: NOW_MS)
        self.ready: list[int] = []
        self.sync = OccurrenceSync(
            self.occurrences,
            self.store,
            "e",
            timeout=timeout,
            retry_every=0.2,
            leading=lambda token: leading,
            on_ready=self.ready.append,
        )

    def elect(self):
        result = self.store.acquire("e", self.holder, ttl=60)
        assert result.acquired
        self.token = result.token
        self.sync.begin_term(self.token, self.holder.lease_id)
        return self.token

    def complete(self, occurrence, task_id="a", task="proj.tick"):
        run = Req(task_id, occurrence, task=task)
        self.occurrences.claim(run, occurrence)
        grown = self.occurrences.settle(run, COMPLETED)
        assert grown is not None
        self.sync.completed(grown)

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


def test_a_completion_is_written_and_the_next_leader_reads_it_before_it_admits(leaders):
    first = leaders()
    token = first.elect()
    assert wait_for(lambda: first.sync.ready(token))
    assert first.ready == [token]
    first.complete(SLOT)
    assert first.sync.flush(token, 2.0)
    stored = OccurrenceRecord.loads(first.store.get_state("e")[STATE_PREFIX + "proj.tick"])
    assert SLOT in stored
    assert first.store.release("e", first.holder.lease_id)

    second = leaders()
    assert not second.sync.ready(None)
    token2 = second.elect()
    assert wait_for(lambda: second.sync.ready(token2))
    assert second.occurrences.verdict(Req("b"), SLOT) == COMPLETED_ALREADY
    assert second.occurrences.verdict(Req("c", NEXT), NEXT) is None


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
        assert wait_for(lambda: leader.sync.ready(token), 3.0)
        assert time.monotonic() - started < 1.5
        assert "could not read the completed occurrences" in caplog.text
        assert leader.occurrences.verdict(Req("b", NEXT), NEXT) is None  # not read yet
    finally:
        redis_server.resume()
    assert wait_for(lambda: leader.occurrences.verdict(Req("b", NEXT), NEXT) is not None)
    assert wait_for(lambda: STATE_PREFIX + "proj.mine" in leader.store.get_state("e"))
    assert STATE_PREFIX + "proj.tick" in leader.store.get_state("e")
    assert leader.ready == [token]
