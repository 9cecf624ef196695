"""An occurrence that completed, or runs, is not run again: real workers, a real Redis.

Messages carry the header ``leader_occurrence`` as beat's would; here a client
sets it (``headers=...``), as anyone may: the leader compares the header, not
who sent it.
"""

from __future__ import annotations

import signal
import time
from datetime import datetime, timedelta, timezone

import pytest

from celery_leader.beat.occurrence import format_slot
from celery_leader.stores import open_store
from celery_leader.tasks.occurrence_record import OccurrenceRecord
from celery_leader.worker.occurrences import state_key
from harness.servers import free_port
from tests.integration.test_metrics_worker import sample, scrape
from tests.integration.test_overlap import runs, state_of, wait_log, wait_state

TASK = "tests.integration.leaderapp"
# Slots of now: the record forgets slots older than 24 h (two periods here) on its own.
_MINUTE = datetime.now(timezone.utc).replace(second=0, microsecond=0)
SLOT = f"nightly@{format_slot(_MINUTE)}"
NEXT = f"nightly@{format_slot(_MINUTE + timedelta(minutes=1))}"
SKIPPED_FOR = {"reason": "occurrence", "occurrence": SLOT}
SKIPS = "celery_leader_tasks_skipped_total"


def of(occurrence: str) -> dict:
    return {"headers": {"leader_occurrence": occurrence}}


def leader_queue(cluster) -> dict:
    """Send options for leaderapp tasks the test client does not route (not in LEADER_TASKS)."""
    return {"queue": f"{cluster.name}.leader"}


def ran(cluster, task_id: str) -> int:
    return len([r for r in runs(cluster.history()) if r["task_id"] == task_id])


@pytest.fixture
def dedupe_cluster(cluster_for):
    cluster = cluster_for("redis")
    cluster.env["LEADER_RESULTS"] = cluster.env["LEADER_HISTORY"]
    return cluster


@pytest.mark.slow
def test_a_completed_occurrence_is_skipped_and_other_messages_run(dedupe_cluster):
    """The first message of an occurrence runs; one sent after it completed is SKIPPED
    (reason occurrence) and never runs; the next slot, and messages without the header,
    run as before."""
    cluster = dedupe_cluster
    port = free_port()
    cluster.env["LEADER_METRICS_PORT"] = str(port)
    cluster.start(1)
    cluster.leader_worker()
    first = cluster.send("leader_record", 1, **of(SLOT))
    assert wait_state(cluster, first.id, {"SUCCESS"})[0] == "SUCCESS"
    second = cluster.send("leader_record", 2, **of(SLOT))
    assert wait_state(cluster, second.id, {"SKIPPED"}) == ("SKIPPED", SKIPPED_FOR)
    following = cluster.send("leader_record", 3, **of(NEXT))
    plain = [cluster.send("leader_record", 4 + i) for i in range(2)]
    for result in (following, *plain):
        assert wait_state(cluster, result.id, {"SUCCESS"})[0] == "SUCCESS"
    rows = cluster.history()
    assert sorted(r["i"] for r in runs(rows)) == [1, 3, 4, 5]
    assert ran(cluster, second.id) == 0
    assert [r["occurrence"] for r in runs(rows) if r["i"] >= 4] == [None, None]
    log = cluster.workers[0].text()
    assert f"skipped: occurrence {SLOT} completed already" in log
    labels = {"election": cluster.name, "task": f"{TASK}.leader_record"}
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # counted on the worker's signal thread
        counted = sample(scrape(port), SKIPS, **labels, reason="occurrence")
        if counted == 1.0:
            break
        time.sleep(0.1)
    assert counted == 1.0


@pytest.mark.slow
def test_a_running_occurrence_skips_its_duplicate_for_the_occurrence_not_the_overlap(
    dedupe_cluster,
):
    """overlap="skip" task: a duplicate of the running occurrence is skipped for its
    occurrence; a message of another occurrence sent meanwhile is skipped for the overlap."""
    cluster = dedupe_cluster
    cluster.start(1, extra=["-c", "3"])
    cluster.leader_worker()
    first = cluster.send("overlap_skip", 2.0, "job", **of(SLOT))
    cluster.wait_history(lambda r: len(runs(r)) >= 1, 10)
    duplicate = cluster.send("overlap_skip", 0.1, "job", **of(SLOT))
    other = cluster.send("overlap_skip", 0.1, "job", **of(NEXT))
    assert wait_state(cluster, duplicate.id, {"SKIPPED"}) == ("SKIPPED", SKIPPED_FOR)
    state, info = wait_state(cluster, other.id, {"SKIPPED"})
    assert state == "SKIPPED" and info["reason"] == "overlap"
    assert state_of(cluster, first.id)[0] == "PENDING"  # still running
    assert wait_state(cluster, first.id, {"SUCCESS"})[0] == "SUCCESS"
    assert [r["task_id"] for r in runs(cluster.history())] == [first.id]


@pytest.mark.slow
def test_a_run_that_raised_does_not_count_and_early_ack_tasks_are_deduplicated_too(
    dedupe_cluster,
):
    """A first run that raised: the next message of its occurrence runs (and completes it;
    a third is skipped). A task acknowledged as it starts (acks_late=False) counts when its
    run returns, not when it starts: a duplicate meanwhile is skipped for running, one
    after a raise runs."""
    cluster = dedupe_cluster
    cluster.start(1, extra=["-c", "3"])
    cluster.leader_worker()
    queue = leader_queue(cluster)
    failed = cluster.send("occurrence_flaky", 0.1, "f", **of(SLOT), **queue)
    assert wait_state(cluster, failed.id, {"FAILURE"})[0] == "FAILURE"
    again = cluster.send("occurrence_flaky", 0.1, "f", **of(SLOT), **queue)
    assert wait_state(cluster, again.id, {"SUCCESS"})[0] == "SUCCESS"
    third = cluster.send("occurrence_flaky", 0.1, "f", **of(SLOT), **queue)
    assert wait_state(cluster, third.id, {"SKIPPED"}) == ("SKIPPED", SKIPPED_FOR)

    slow = cluster.send("occurrence_early_ack", 2.0, "slow", **of(SLOT), **queue)
    cluster.wait_history(lambda r: any(x["task_id"] == slow.id for x in runs(r)), 10)
    meanwhile = cluster.send("occurrence_early_ack", 0.1, "slow", **of(SLOT), **queue)
    assert wait_state(cluster, meanwhile.id, {"SKIPPED"}) == ("SKIPPED", SKIPPED_FOR)
    assert wait_state(cluster, slow.id, {"SUCCESS"})[0] == "SUCCESS"
    after = cluster.send("occurrence_early_ack", 0.1, "slow", **of(SLOT), **queue)
    assert wait_state(cluster, after.id, {"SKIPPED"}) == ("SKIPPED", SKIPPED_FOR)

    raised = cluster.send("occurrence_early_ack", 0.1, "fail", **of(NEXT), **queue)
    assert wait_state(cluster, raised.id, {"FAILURE"})[0] == "FAILURE"
    rerun = cluster.send("occurrence_early_ack", 0.1, "fail", **of(NEXT), **queue)
    assert wait_state(cluster, rerun.id, {"SUCCESS"})[0] == "SUCCESS"
    for skipped in (third, meanwhile, after):
        assert ran(cluster, skipped.id) == 0


@pytest.mark.slow
def test_the_completed_runs_own_message_again_keeps_its_result(dedupe_cluster):
    """The same message again after its run completed (its acknowledgement was lost, and
    RabbitMQ delivers it with a new delivery tag, which the redelivery record does not
    know): here sent again under the same task id. It is acknowledged without running and
    its SUCCESS stays: a SKIPPED over it would leave result.get() waiting for ever. Another
    message of the occurrence is still SKIPPED."""
    cluster = dedupe_cluster
    cluster.start(1)
    leader = cluster.leader_worker()
    first = cluster.send("leader_record", 1, task_id="the-run", **of(SLOT))
    assert wait_state(cluster, first.id, {"SUCCESS"})[0] == "SUCCESS"
    cluster.send("leader_record", 1, task_id="the-run", **of(SLOT))
    assert wait_log(leader, f"the-run] was delivered again after its run of occurrence {SLOT}")
    assert state_of(cluster, "the-run") == ("SUCCESS", 1)
    other = cluster.send("leader_record", 2, **of(SLOT))
    assert wait_state(cluster, other.id, {"SKIPPED"}) == ("SKIPPED", SKIPPED_FOR)
    assert ran(cluster, "the-run") == 1
    assert ran(cluster, other.id) == 0


def stored_record(cluster, task: str, entry: str = "nightly") -> OccurrenceRecord | None:
    """The stored shard of *task*'s *entry*: one lease-state key per task and entry."""
    store = open_store(cluster.env["LEADER_STORE"], timeout=2)
    try:
        value = store.get_state(cluster.name).get(state_key((f"{TASK}.{task}", entry)))
    finally:
        store.close()
    return OccurrenceRecord.loads(value) if value is not None else None


@pytest.mark.slow
def test_the_next_leader_skips_what_the_last_one_completed(dedupe_cluster):
    """Completed on leader A, which is stopped at once (SIGTERM): leader B reads the record
    before it consumes, and skips the occurrence. Completed on B, whose write is in the
    store, and B is SIGKILLed: leader C skips it too."""
    cluster = dedupe_cluster
    cluster.start(2)
    first_leader = cluster.leader_worker()
    done = cluster.send("leader_record", 1, **of(SLOT))
    assert wait_state(cluster, done.id, {"SUCCESS"})[0] == "SUCCESS"
    first_leader.stop()
    assert first_leader.proc.returncode == 0

    second_leader = cluster.leader_worker(timeout=15)
    assert second_leader is not first_leader
    duplicate = cluster.send("leader_record", 2, **of(SLOT))
    assert wait_state(cluster, duplicate.id, {"SKIPPED"}) == ("SKIPPED", SKIPPED_FOR)
    assert f"skipped: occurrence {SLOT} completed already" in second_leader.text()
    # The first run's own message again (its task id: an acknowledgement lost as the first
    # leader stopped): acknowledged without running, its SUCCESS kept (the id was stored).
    cluster.send("leader_record", 1, task_id=done.id, **of(SLOT))
    assert wait_log(second_leader, f"after its run of occurrence {SLOT} completed")
    assert state_of(cluster, done.id)[0] == "SUCCESS"

    done = cluster.send("leader_record", 3, **of(NEXT))
    assert wait_state(cluster, done.id, {"SUCCESS"})[0] == "SUCCESS"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        record = stored_record(cluster, "leader_record")
        if record is not None and NEXT in record:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the completion on the second leader never reached the store")
    assert SLOT in record  # what the first leader wrote was kept
    second_leader.signal(signal.SIGKILL)
    second_leader.proc.wait(10)
    cluster.start(1)
    third_leader = cluster.leader_worker(timeout=20)
    duplicate = cluster.send("leader_record", 4, **of(NEXT))
    assert wait_state(cluster, duplicate.id, {"SKIPPED"}) == (
        "SKIPPED",
        {"reason": "occurrence", "occurrence": NEXT},
    )
    assert f"skipped: occurrence {NEXT} completed already" in third_leader.text()
    assert sorted(r["i"] for r in runs(cluster.history())) == [1, 3]
