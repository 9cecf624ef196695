"""``@leader_only(overlap=...)`` on real workers: one run per key, and no lock left behind."""

from __future__ import annotations

import itertools
import json
import signal
import time

import pytest


def runs(rows, kind="start"):
    return [r for r in rows if r["kind"] == kind]


def assert_one_run_at_a_time(rows, key=lambda r: r["tag"] if "account" not in r else r["account"]):
    """Per key: each run started after the one before it ended (or its term ended).

    A run is its message's run in one term: a message stopped at its term's end runs
    again under the same task id in a later one.
    """
    ends = {(r["task_id"], r["token"]): r["at"] for r in runs(rows, "end")}
    by_key: dict[object, list[dict]] = {}
    for row in sorted(runs(rows), key=lambda r: r["at"]):
        by_key.setdefault(key(row), []).append(row)
    for found in by_key.values():
        for before, after in itertools.pairwise(found):
            ended = ends.get((before["task_id"], before["token"]))
            if ended is not None:
                assert ended <= after["at"], f"{after} started while {before} ran"
            else:  # stopped with its term: the next run is a later term's
                assert after["token"] > before["token"], f"{after} beside the killed {before}"


def state_of(cluster, task_id: str) -> tuple[str, object]:
    raw = cluster.history_client.get(f"celery-task-meta-{task_id}")
    if raw is None:
        return "PENDING", None
    meta = json.loads(raw)
    return meta["status"], meta["result"]


def wait_log(worker, text: str, timeout: float = 15) -> bool:
    """True once *text* appears in *worker*'s log (within *timeout*)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in worker.text():
            return True
        time.sleep(0.1)
    return text in worker.text()


def wait_state(cluster, task_id: str, wanted: set[str], timeout: float = 15) -> tuple[str, object]:
    """The task's stored state once it is one of *wanted*, or as it is after *timeout*.

    A run's rows are written before it returns and its result after: a test that saw the
    run's end row must wait for the result.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = state_of(cluster, task_id)
        if found[0] in wanted:
            return found
        time.sleep(0.05)
    return state_of(cluster, task_id)


@pytest.fixture
def overlap_cluster(cluster_for):
    cluster = cluster_for("redis")
    cluster.env["LEADER_RESULTS"] = cluster.env["LEADER_HISTORY"]
    return cluster


@pytest.mark.slow
def test_skip_acknowledges_an_overlapping_message_and_says_so(overlap_cluster):
    """overlap="skip": messages sent while the run goes on are acknowledged without running,
    their state SKIPPED with the reason and key; the next one after it runs."""
    cluster = overlap_cluster
    cluster.start(1, extra=["-c", "3"])
    cluster.leader_worker()
    first = cluster.send("overlap_skip", 2.0, "job")
    cluster.wait_history(runs, 10)
    skipped = [cluster.send("overlap_skip", 0.1, "job") for _ in range(2)]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if all(state_of(cluster, r.id)[0] == "SKIPPED" for r in skipped):
            break
        time.sleep(0.1)
    for result in skipped:
        state, info = state_of(cluster, result.id)
        assert (state, info) == ("SKIPPED", {"reason": "overlap", "key": f"{TASK}.overlap_skip"})
    # The run settles in the worker's main process once the child hands its result back,
    # a moment after its end row and its result: a message sent within that moment is
    # (rightly) skipped too. Sent well after it, the next one runs.
    deadline = time.monotonic() + 10
    while state_of(cluster, first.id)[0] != "SUCCESS" and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(2.0)
    after = cluster.send("overlap_skip", 0.1, "job")
    rows = cluster.wait_history(lambda r: len(runs(r, "end")) >= 2, 10)
    assert [r["task_id"] for r in runs(rows)] == [first.id, after.id]
    assert state_of(cluster, first.id)[0] == "SUCCESS"
    assert_one_run_at_a_time(rows)


TASK = "tests.integration.leaderapp"


@pytest.mark.slow
def test_buffer_one_runs_one_waiting_message_after_the_run_and_skips_the_rest(overlap_cluster):
    """overlap="buffer_one": the first message sent meanwhile waits and runs right after the
    run; a third is skipped. With -c 3 none of them ran beside another."""
    cluster = overlap_cluster
    cluster.start(1, extra=["-c", "3"])
    cluster.leader_worker()
    first = cluster.send("overlap_buffer", 1.5, "job")
    cluster.wait_history(runs, 10)
    waiting = cluster.send("overlap_buffer", 0.5, "job")
    time.sleep(0.3)
    skipped = cluster.send("overlap_buffer", 0.1, "job")
    rows = cluster.wait_history(lambda r: len(runs(r, "end")) >= 2, 15)
    assert [r["task_id"] for r in runs(rows)] == [first.id, waiting.id]
    assert wait_state(cluster, skipped.id, {"SKIPPED"})[0] == "SKIPPED"
    gap = runs(rows)[1]["at"] - runs(rows, "end")[0]["at"]
    assert 0 <= gap < 1.0, f"the waiting message started {gap:.2f} s after the run ended"
    assert_one_run_at_a_time(rows)


@pytest.mark.slow
def test_overlap_key_arguments_make_one_singleton_per_account(overlap_cluster):
    """overlap_key=["account_id"]: account 1 and account 2 run side by side; a second
    message for account 1 (given by keyword this time) is skipped while the first runs."""
    cluster = overlap_cluster
    cluster.start(1, extra=["-c", "3"])
    cluster.leader_worker()
    one = cluster.send("overlap_account", 1, 1.5, "a")
    two = cluster.send("overlap_account", 2, 1.5, "b")
    cluster.wait_history(lambda r: len(runs(r)) >= 2, 10)
    again = cluster.send("overlap_account", kwargs={"account_id": 1, "seconds": 0.1, "tag": "c"})
    rows = cluster.wait_history(lambda r: len(runs(r, "end")) >= 2, 10)
    time.sleep(0.5)
    rows = cluster.history()
    assert {r["task_id"] for r in runs(rows)} == {one.id, two.id}
    starts = {r["account"]: r["at"] for r in runs(rows)}
    ends = {r["account"]: r["at"] for r in runs(rows, "end")}
    assert starts[2] < ends[1] and starts[1] < ends[2], "the two accounts ran side by side"
    state, info = state_of(cluster, again.id)
    assert state == "SKIPPED" and info["key"] == f"{TASK}.overlap_account[1]"


def start_long(cluster):
    """Send a 6 s run of the key and wait for it to start.

    A run settles in the leader's main process a moment after its end row (the child
    hands its result back): a message arriving in that moment is rightly skipped for
    it, and under load the moment grows. Such a message is sent again.
    """
    for _ in range(3):
        result = cluster.send("overlap_skip", 6, "job")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            found = [x["at"] for x in runs(cluster.history()) if x["task_id"] == result.id]
            if found:
                return result, found[0]
            if state_of(cluster, result.id)[0] == "SKIPPED":
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"{result.id} never started")
    raise AssertionError("three runs of the key in a row were skipped")


@pytest.mark.slow
def test_no_stale_lock_after_a_sigkill_a_step_down_or_a_store_restart(overlap_cluster):
    """A run in progress when its leader is SIGKILLed, steps down, or loses its store: the
    key's next run starts as soon as the next leader may act (nothing was left to expire),
    and no two runs of the key ever overlap."""
    cluster = overlap_cluster
    ttl = float(cluster.env["LEADER_TTL"])
    cluster.start(3)
    leader = cluster.leader_worker()

    def settle() -> None:  # every run of the key ended, so the next segment starts clean
        cluster.wait_history(
            lambda r: {x["task_id"] for x in runs(r, "end")} >= {x["task_id"] for x in runs(r)},
            20,
        )

    # SIGKILL: on the next leader a run of the key starts at once: the new message, or
    # the killed run's message if the broker gave it back first (visibility timeout 4 s;
    # the other one is then skipped).
    long, _ = start_long(cluster)
    killed_at = time.monotonic()
    leader.signal(signal.SIGKILL)
    leader.proc.wait(10)
    leader = cluster.leader_worker(timeout=ttl + 15)
    asked = time.monotonic()
    cluster.send("overlap_skip", 0.5, "job")
    rows = cluster.wait_history(lambda r: any(x["at"] > asked for x in runs(r)), 10)
    first_after = min((x["at"] for x in runs(rows) if x["at"] > asked), default=None)
    assert first_after is not None, "no run of the key on the next leader"
    assert first_after - asked < 3, "the next leader waited for a stale lock"
    # The killed run's message comes back once the broker's visibility timeout passed: when
    # the new message ran first, it runs then (6 s). Let it, before the next segment, or
    # that one's message is (rightly) skipped for it. (Skipped itself, it never shows.)
    killed = long.id
    cluster.wait_history(
        lambda r: any(x["task_id"] == killed and x["at"] > killed_at for x in runs(r)), 15
    )
    settle()

    # Step-down: the run is stopped and its message handed back; the next leader runs it.
    long, first = start_long(cluster)
    asked = time.monotonic()
    proc = cluster.celery("leader", "step-down")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = cluster.wait_history(
        lambda r: len([x for x in runs(r) if x["task_id"] == long.id]) >= 2, ttl + 10
    )
    again = [x["at"] for x in runs(rows) if x["task_id"] == long.id][1]
    assert again > first and again - asked < ttl + 5
    duplicate = cluster.send("overlap_skip", 0.1, "job")  # the new leader's own run goes on
    deadline = time.monotonic() + 10
    while state_of(cluster, duplicate.id)[0] != "SKIPPED" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert state_of(cluster, duplicate.id)[0] == "SKIPPED"
    settle()

    # The lease store restarted empty: the holder loses its term; after the hold-off the
    # next leader runs the stopped run's message.
    long, first = start_long(cluster)
    lost_at = time.monotonic()
    cluster.store.restart_empty()
    rows = cluster.wait_history(
        lambda r: len([x for x in runs(r) if x["task_id"] == long.id]) >= 2, 3 * ttl + 15
    )
    again = [x["at"] for x in runs(rows) if x["task_id"] == long.id][1]
    assert again - lost_at < 3 * ttl + 10
    settle()
    assert_one_run_at_a_time(cluster.history())


@pytest.mark.slow
def test_a_beat_entry_every_second_of_a_longer_task_never_overlaps(overlap_cluster):
    """A 1 s beat entry whose task runs 2.5 s under overlap="skip": runs never overlap, also
    over a SIGKILL of the leader in a run (the next leader runs the next slot at once)."""
    cluster = overlap_cluster
    cluster.env["LEADER_BEAT_EVERY"] = "1"
    cluster.env["LEADER_BEAT_TASK"] = f"{TASK}.overlap_skip"
    cluster.env["LEADER_BEAT_ARGS"] = json.dumps([2.5, "beat"])
    ttl = float(cluster.env["LEADER_TTL"])
    cluster.start(2, extra=["-c", "3"])
    leader = cluster.leader_worker()
    cluster.start_beat()
    # The third run in progress (two ended before it): the kill lands in a run.
    cluster.wait_history(lambda r: len(runs(r)) >= 3 and len(runs(r, "end")) == 2, 25)
    killed_at = time.monotonic()
    leader.signal(signal.SIGKILL)
    leader.proc.wait(10)
    rows = cluster.wait_history(
        lambda r: any(x["kind"] == "start" and x["at"] > killed_at for x in r), ttl + 15
    )
    resumed = min(x["at"] for x in runs(rows) if x["at"] > killed_at)
    assert resumed - killed_at < ttl + 4, "the next leader waited for a stale lock"
    time.sleep(6)
    rows = cluster.history()
    assert len(runs(rows)) >= 4
    assert_one_run_at_a_time(rows)


@pytest.mark.slow
def test_a_run_celery_terminates_holds_its_key_until_its_process_ends(overlap_cluster):
    """revoke(terminate=True) of a run that ignores SIGTERM: Celery acknowledges its message
    at once, but the run goes on, so the message waiting for its key (buffer_one) starts
    only once the run ended, never beside it."""
    cluster = overlap_cluster
    cluster.start(1, extra=["-c", "3"])
    leader = cluster.leader_worker()
    stubborn = cluster.send("overlap_stubborn", 2.5, "job")
    cluster.wait_history(runs, 10)
    waiting = cluster.send("overlap_stubborn", 0.1, "job")
    time.sleep(0.3)  # the second message reached the gate and waits for the key
    cluster.client.control.revoke(stubborn.id, terminate=True)
    # Logged only for a run still going when the revoke arrived (one that ended is not).
    assert wait_log(leader, f"Terminating {stubborn.id}"), "Celery terminated the run"
    rows = cluster.wait_history(lambda r: len(runs(r, "end")) >= 2, 15)
    assert [r["task_id"] for r in runs(rows)] == [stubborn.id, waiting.id]
    assert_one_run_at_a_time(rows)
    assert wait_state(cluster, waiting.id, {"SUCCESS"})[0] == "SUCCESS"


@pytest.mark.slow
def test_what_a_run_sends_of_its_own_key_is_never_skipped(overlap_cluster):
    """overlap="skip": a run's own retry (countdown 0) and the next step of its chain reach
    the leader while the run is not yet settled there: they wait for it and run, never
    skipped (skipping them would lose them)."""
    from celery import chain

    cluster = overlap_cluster
    cluster.start(1, extra=["-c", "3"])
    cluster.leader_worker()
    retried = cluster.send("overlap_retry", "r")
    steps = chain(
        cluster.client.signature(f"{TASK}.overlap_skip", args=(0.3, "c1"), immutable=True),
        cluster.client.signature(f"{TASK}.overlap_skip", args=(0.3, "c2"), immutable=True),
    ).apply_async()
    rows = cluster.wait_history(
        lambda r: {x.get("tag") for x in runs(r, "end")} >= {"r", "c1", "c2"}, 20
    )
    assert [x["retries"] for x in runs(rows) if x.get("tag") == "r"] == [0, 1]
    assert wait_state(cluster, retried.id, {"SUCCESS"})[0] == "SUCCESS"
    assert wait_state(cluster, steps.id, {"SUCCESS"})[0] == "SUCCESS"
    assert_one_run_at_a_time([x for x in rows if x.get("tag") != "r"])
