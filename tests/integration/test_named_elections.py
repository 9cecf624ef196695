"""Named elections on real workers: each election runs on its own holder, with its own tokens.

The app is ``tests.integration.electionsapp``: leaderapp's tasks (the default
election) plus ``billing_record`` (election "billing") and ``reports_record``
(election "reports"). Balancing comes later; here which worker leads what is
set with ``leader_elections_exclude``.
"""

from __future__ import annotations

import json
import signal
import time

import pytest
import redis

from celery_leader.stores import open_store

APP = "tests.integration.electionsapp"
BILLING = f"{APP}.billing_record"
REPORTS = f"{APP}.reports_record"


def starts(rows, election=None):
    return [r for r in rows if r["kind"] == "start" and r.get("election") == election]


def celery(cluster, *args):
    return cluster.celery(*args, app=APP)


def holder(cluster, lease, timeout=15.0, after=0):
    """(nodename, token) of the holder of *lease* once it leads with a token above *after*."""
    store = open_store(cluster.env["LEADER_STORE"], timeout=2)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            record = store.read(lease)
            if record is not None and record.hold_off <= 0 and record.token > after:
                return record.nodename, record.token
            time.sleep(0.05)
    finally:
        store.close()
    raise AssertionError(f"nobody leads {lease}")


def route_by_name(cluster):
    """The client sends by name: ``leader_tasks`` maps each task to its election."""
    cluster.client.conf.leader_tasks = {
        "tests.integration.leaderapp.*": "",
        BILLING: "billing",
        REPORTS: "reports",
    }


@pytest.mark.slow
def test_each_election_runs_on_its_own_holder_with_its_own_tokens(cluster_for):
    """w1 cannot lead billing: it leads the default election, w2 billing; nothing crosses."""
    cluster = cluster_for("redis")
    route_by_name(cluster)
    (w1,) = cluster.start(1, app=APP, env={"LEADER_EXCLUDE": "billing,reports"})
    assert holder(cluster, cluster.name)[0] == w1.nodename
    (w2,) = cluster.start(1, app=APP)
    billing_holder, billing_token = holder(cluster, f"{cluster.name}.billing")
    assert billing_holder == w2.nodename, "w1 excludes billing: only w2 can lead it"
    for i in range(20):
        cluster.send("leader_record", i)
        cluster.client.send_task(BILLING, args=(i,))
    rows = cluster.wait_history(
        lambda r: len(starts(r)) >= 20 and len(starts(r, "billing")) >= 20, 60
    )
    default_runs, billing_runs = starts(rows), starts(rows, "billing")
    assert sorted(r["i"] for r in default_runs) == list(range(20))
    assert sorted(r["i"] for r in billing_runs) == list(range(20)), "each ran once"
    assert {r["worker"] for r in default_runs} == {w1.nodename}
    assert {r["worker"] for r in billing_runs} == {w2.nodename}
    assert {r["token"] for r in billing_runs} == {billing_token}
    assert not any(r["lost"] for r in billing_runs), "lease_lost() reads billing's own term"
    consuming = f"Started consuming from {cluster.name}.billing.leader"
    assert consuming in w2.text() and consuming not in w1.text()

    # status: one row per election, and the JSON "elections" map
    proc = celery(cluster, "leader", "status", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    status = json.loads(proc.stdout)
    assert status["leader"]["nodename"] == w1.nodename, "v0.1 keys: the default election"
    assert status["elections"][cluster.name]["nodename"] == w1.nodename
    assert status["elections"]["billing"]["nodename"] == w2.nodename
    assert status["elections"]["billing"]["token"] == billing_token
    assert status["elections"]["reports"]["nodename"] == w2.nodename
    proc = celery(cluster, "leader", "status", "--election", "billing", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["leader"]["nodename"] == w2.nodename
    human = celery(cluster, "leader", "status").stdout
    assert "ELECTION" in human and "billing" in human and w2.nodename in human
    bad = celery(cluster, "leader", "status", "--election", "no such")
    assert bad.returncode == 2 and "--election='no such' is not allowed" in bad.stderr

    # inspect: each worker's elections
    proc = celery(cluster, "inspect", "leader", "--json", "--timeout", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    views = json.loads(proc.stdout)
    assert views[w2.nodename]["elections"]["billing"]["role"] == "leader"
    assert views[w1.nodename]["elections"][cluster.name]["role"] == "leader"
    assert "billing" not in views[w1.nodename]["elections"], "w1 excludes billing"


@pytest.mark.slow
def test_a_message_in_another_elections_queue_is_republished_to_its_own(cluster_for):
    """A billing message put in the default leader queue runs once, on billing's holder."""
    cluster = cluster_for("redis")
    (w1,) = cluster.start(1, app=APP, env={"LEADER_EXCLUDE": "billing"})
    holder(cluster, cluster.name)
    (w2,) = cluster.start(1, app=APP, env={"LEADER_EXCLUDE": "reports"})
    billing_holder, billing_token = holder(cluster, f"{cluster.name}.billing")
    assert billing_holder == w2.nodename
    for i in range(5):
        cluster.client.send_task(BILLING, args=(i,), queue=f"{cluster.name}.leader")
    rows = cluster.wait_history(lambda r: len(starts(r, "billing")) >= 5, 30)
    billing_runs = starts(rows, "billing")
    assert sorted(r["i"] for r in billing_runs) == list(range(5)), "each ran once"
    assert {r["worker"] for r in billing_runs} == {w2.nodename}
    assert {r["token"] for r in billing_runs} == {billing_token}
    assert "re-routed to" in w1.text()


@pytest.mark.slow
def test_a_named_election_fails_over_and_steps_down_on_its_own(cluster_for):
    """Kill billing's holder: billing moves with a greater token, the default election stays."""
    cluster = cluster_for("redis")
    route_by_name(cluster)
    (w1,) = cluster.start(1, app=APP, env={"LEADER_EXCLUDE": "billing"})
    default_holder, default_token = holder(cluster, cluster.name)
    assert default_holder == w1.nodename
    w2, w3 = cluster.start(2, app=APP, env={"LEADER_EXCLUDE": ""})
    first, first_token = holder(cluster, f"{cluster.name}.billing")
    victim = w2 if first == w2.nodename else w3
    survivor = w3 if victim is w2 else w2
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait()
    second, second_token = holder(cluster, f"{cluster.name}.billing", timeout=20, after=first_token)
    assert second == survivor.nodename and second_token > first_token
    assert holder(cluster, cluster.name) == (w1.nodename, default_token), "default untouched"
    for i in range(5):
        cluster.client.send_task(BILLING, args=(i,))
    rows = cluster.wait_history(lambda r: len(starts(r, "billing")) >= 5, 30)
    assert {r["token"] for r in starts(rows, "billing")} == {second_token}

    proc = celery(cluster, "leader", "step-down", "--election", "billing")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{survivor.nodename} stepped down (token {second_token})" in proc.stdout
    assert holder(cluster, cluster.name) == (w1.nodename, default_token), "default untouched"
    third, _ = holder(cluster, f"{cluster.name}.billing", timeout=20, after=second_token)
    assert third == survivor.nodename, "the only worker left that can lead billing"


SIX = ("", "billing", "reports", "audit", "export", "sync")


def holders(cluster, elections=None) -> dict[str, tuple[str, int] | None]:
    """Election -> (holder, token) for *elections* (the six by default), from the store."""
    store = open_store(cluster.env["LEADER_STORE"], timeout=2)
    try:
        found = {}
        for election in SIX if elections is None else elections:
            record = store.read(f"{cluster.name}.{election}" if election else cluster.name)
            found[election] = None if record is None else (record.nodename, record.token)
        return found
    finally:
        store.close()


def wait_spread(cluster, workers, per_worker, timeout, elections=None):
    """Wait until every election is held and each of *workers* holds *per_worker*; the view."""
    deadline = time.monotonic() + timeout
    seen = holders(cluster, elections)
    while time.monotonic() < deadline:
        seen = holders(cluster, elections)
        counts = {w.nodename: 0 for w in workers}
        for held in seen.values():
            if held is not None and held[0] in counts:
                counts[held[0]] += 1
        if all(held is not None for held in seen.values()) and set(counts.values()) == {per_worker}:
            return seen
        time.sleep(0.1)
    raise AssertionError(f"not spread {per_worker} each within {timeout} s: {seen}")


@pytest.mark.slow
def test_six_elections_spread_over_three_workers_through_a_kill_and_a_restart(cluster_for):
    """2/2/2; kill one: 3/3 within ttl + a little; a new one: 2/2/2 again by handover."""
    cluster = cluster_for("redis")
    route_by_name(cluster)
    env = {"LEADER_ELECTIONS": "audit,export,sync"}
    workers = cluster.start(3, app=APP, env=env)
    first = wait_spread(cluster, workers, 2, 30)
    tokens = {e: [held[1]] for e, held in first.items() if held is not None}

    victim = workers[0]
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait()
    killed_at = time.monotonic()
    second = wait_spread(cluster, workers[1:], 3, 15)
    took = time.monotonic() - killed_at
    ttl = float(cluster.env["LEADER_TTL"])
    assert took < ttl + 4, f"the dead worker's elections moved after {took:.1f} s"

    (joined,) = cluster.start(1, app=APP, env=env)
    for i in range(10):
        cluster.client.send_task(BILLING, args=(i,))
        cluster.client.send_task(REPORTS, args=(i,))
    third = wait_spread(cluster, [*workers[1:], joined], 2, 40)
    for view in (second, third):
        for election, held in view.items():
            if held is not None and held[1] != tokens[election][-1]:
                tokens[election].append(held[1])
    for election, seen in tokens.items():
        assert seen == sorted(seen) and len(set(seen)) == len(seen), (election, seen)

    rows = cluster.wait_history(
        lambda r: len(starts(r, "billing")) >= 10 and len(starts(r, "reports")) >= 10, 30
    )
    for election in ("billing", "reports"):
        runs = sorted(starts(rows, election), key=lambda r: r["at"])
        assert sorted(r["i"] for r in runs) == list(range(10)), f"{election}: each ran once"
        assert [r["token"] for r in runs] == sorted(r["token"] for r in runs), (
            f"{election}: a run of an older term started after a newer one"
        )
    assert "handing election" in "".join(w.text() for w in workers[1:])


@pytest.mark.slow
def test_a_leader_message_of_a_task_the_worker_does_not_know_is_kept(cluster_for):
    """Celery drops an unregistered task's message; from a leader queue it goes back instead."""
    cluster = cluster_for("redis")
    (worker,) = cluster.start(1, app=APP, env={"LEADER_ELECTIONS": "ghost"})
    holder(cluster, f"{cluster.name}.ghost")
    queue = f"{cluster.name}.ghost.leader"
    cluster.client.send_task("tests.no_such_task", queue=queue)
    deadline = time.monotonic() + 15
    while "does not know the task" not in worker.text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "does not know the task" in worker.text()
    worker.proc.send_signal(signal.SIGTERM)
    worker.stop()
    broker = redis.Redis(host="127.0.0.1", port=cluster.data.port, db=0)
    assert broker.llen(queue) == 1, "the message is still in its leader queue"
    assert "NotRegistered" not in worker.text()


@pytest.mark.slow
def test_store_round_trips_stay_flat_with_ten_elections(cluster_for):
    """Two workers lead 5 of 10 elections each and follow the other 5: about 2 round trips
    per worker per renew interval (the benchmark measures it; here a generous bound that
    one call per lease per interval, 10 or more, would break)."""
    from harness.monitor import round_trips

    cluster = cluster_for("redis")
    extra = [f"x{i}" for i in range(7)]
    workers = cluster.start(2, app=APP, env={"LEADER_ELECTIONS": ",".join(extra)})
    ten = ["", "billing", "reports", *extra]
    wait_spread(cluster, workers, 5, 60, elections=ten)
    time.sleep(2.0)  # past the hand-overs of the spread
    window = 8.0
    commands = round_trips(cluster.store.port, window)
    renew_interval = float(cluster.env["LEADER_TTL"]) / 3
    per_worker = sum(commands.values()) / 2 / (window / renew_interval)
    assert 0.5 < per_worker < 3.0, (per_worker, commands)


@pytest.mark.slow
def test_a_beat_entry_runs_a_named_elections_task_on_that_elections_holder(cluster_for):
    """Beat is one election of its own; its entry for billing_record runs where billing leads."""
    cluster = cluster_for("redis")
    cluster.env["LEADER_BEAT_EVERY"] = "1"
    workers = cluster.start(2, app=APP, env={"LEADER_EXCLUDE": "billing"})
    workers += cluster.start(1, app=APP)  # the only one that may lead billing
    billing_holder, billing_token = holder(cluster, f"{cluster.name}.billing")
    assert billing_holder == workers[2].nodename
    cluster.start_beat(app=APP)
    rows = cluster.wait_history(lambda r: len(starts(r, "billing")) >= 3, 30)
    runs = starts(rows, "billing")
    assert {r["worker"] for r in runs} == {workers[2].nodename}
    assert {r["token"] for r in runs} == {billing_token}
    ticks = [r for r in rows if r["kind"] == "beat"]
    assert ticks, "the default election's entry runs too"
