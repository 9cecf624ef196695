"""Leader-only work on real worker processes: routing, exclusion, failover, handover."""

from __future__ import annotations

import json
import signal
import time

import pytest


def runs(rows, kind="start"):
    return [r for r in rows if r["kind"] == kind]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("broker", "pool"),
    [("redis", "prefork"), ("redis", "threads"), ("redis", "solo"), ("rabbitmq", "prefork")],
)
@pytest.mark.compat
def test_three_workers_one_leader_runs_all_leader_tasks(cluster_for, broker, pool):
    """3 workers: only the leader consumes its queue; 200 leader tasks run there, once each."""
    cluster = cluster_for(broker)
    cluster.start(3, pool=pool)
    leader = cluster.leader_worker()
    for i in range(200):
        cluster.send("leader_record", i)
    for i in range(20):
        cluster.send("plain_record", i)
    rows = cluster.wait_history(lambda r: len(runs(r)) >= 200 and len(runs(r, "plain")) >= 20, 60)
    starts = runs(rows)
    assert sorted(r["i"] for r in starts) == list(range(200)), "each leader task ran exactly once"
    assert {r["worker"] for r in starts} == {leader.nodename}
    assert len({r["token"] for r in starts}) == 1 and starts[0]["token"] > 0
    consuming = [
        w for w in cluster.workers if f"Started consuming from {cluster.name}.leader" in w.text()
    ]
    assert consuming == [leader]
    code, status = cluster.leader_status()
    assert code == 0
    assert status["leader"]["nodename"] == leader.nodename
    assert status["leader"]["token"] == starts[0]["token"]
    # Each worker's own view, over remote control (exit 2 on Celery 5.3 once).
    proc = cluster.celery("inspect", "leader", "--json", "--timeout", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    views = json.loads(proc.stdout)
    assert {node: view["role"] for node, view in views.items()} == {
        w.nodename: "leader" if w is leader else "follower" for w in cluster.workers
    }
    assert views[leader.nodename]["token"] == starts[0]["token"]


def stale_starts(rows):
    """Starts under a token lower than one that had already started: runs of an ended term."""
    stale, highest = [], 0
    for row in sorted(runs(rows), key=lambda r: r["at"]):
        if row["token"] < highest:
            stale.append(row)
        highest = max(highest, row["token"])
    return stale


class Stream:
    """Sends leader_record(i) every *interval* seconds from a thread."""

    def __init__(self, cluster, interval=0.02):
        import threading

        self.cluster, self.interval, self.sent = cluster, interval, 0
        self.ids: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            self.ids.append(self.cluster.send("leader_record", self.sent).id)
            self.sent += 1
            self._stop.wait(self.interval)

    def stop(self):
        self._stop.set()
        self._thread.join(5)
        return self.sent


@pytest.mark.compat
@pytest.mark.slow
def test_sigkill_leader_under_stream_fails_over_without_loss(cluster_for, broker):
    """SIGKILL the leader mid-stream: another leads within ttl + 5 s, tokens rise, nothing lost."""
    cluster = cluster_for(broker)
    cluster.start(3)
    old = cluster.leader_worker()
    stream = Stream(cluster)
    cluster.wait_history(lambda r: len(runs(r)) >= 30, 20)
    killed_at = time.monotonic()
    old.signal(signal.SIGKILL)
    rows = cluster.wait_history(
        lambda r: any(x["worker"] != old.nodename for x in runs(r)), 2 + 5 + 5
    )
    took = min(x["at"] for x in runs(rows) if x["worker"] != old.nodename) - killed_at
    time.sleep(1.0)
    sent = stream.stop()
    # Redis returns a dead worker's unacked messages after visibility_timeout (4 s here),
    # at a survivor's next restore sweep. Before kombu 5.7 the sweep cadence is fixed: a
    # timer every 10 s that scans on its first call and then every 10th (about 100 s). A
    # replacement worker, as a deployment would start, scans on its first tick.
    # The replacement's first sweep brings the dead worker's unacked messages back within
    # seconds of its start; a message the Redis transport lost (tolerated below) never
    # comes, so the wait for it is the replacement's start and sweep, not 40 s.
    if broker == "redis":
        cluster.start(1)
    wait_for = 40 if broker == "rabbitmq" else 25
    rows = cluster.wait_history(lambda r: {x["i"] for x in runs(r)} >= set(range(sent)), wait_for)
    lost = sorted(set(range(sent)) - {x["i"] for x in runs(rows)})
    assert took < 2 + 5, f"failover took {took:.2f} s"
    if broker == "rabbitmq":
        assert lost == [], f"lost: {lost}"
    else:
        # kombu's Redis transport loses a message that the killed worker had
        # popped (BRPOP) but not yet recorded as unacked: no worker ever
        # received it. That window, and only it, is tolerated here: at most
        # what the worker may reserve at once (-c 2 x prefetch multiplier 1).
        logs = "".join(w.text() for w in cluster.workers)
        assert len(lost) <= 2, f"lost: {lost}"
        assert all(stream.ids[i] not in logs for i in lost), "a received message was lost"
    old_tokens = {x["token"] for x in runs(rows) if x["worker"] == old.nodename}
    new_tokens = {x["token"] for x in runs(rows) if x["worker"] != old.nodename}
    assert min(new_tokens) > max(old_tokens)
    assert stale_starts(rows) == []


@pytest.mark.slow
def test_sigstop_leader_past_ttl_then_resume(cluster_for):
    """Frozen leader: no stale starts; on resume its run is killed, its fenced write refused."""
    cluster = cluster_for("redis")
    cluster.start(2)
    old = cluster.leader_worker()
    cluster.send("slow_terminate", 6.0, "T")
    cluster.send("fenced_writer", 2.5, "F")
    rows = cluster.wait_history(lambda r: len(runs(r)) >= 2, 10)
    old_token = runs(rows)[0]["token"]
    old.signal(signal.SIGSTOP)
    try:
        new = None
        deadline = time.monotonic() + 2 + 5
        while new is None and time.monotonic() < deadline:
            try:
                candidate = cluster.leader_worker(timeout=0.5)
                new = candidate if candidate is not old else None
            except AssertionError:
                pass
        assert new is not None, "a standby took over while the leader was frozen"
        cluster.send("fenced_writer", 0.0, "G")
        cluster.wait_history(
            lambda r: any(x["kind"] == "fenced-write" and x["tag"] == "G" for x in r), 10
        )
    finally:
        resumed_at = time.monotonic()
        old.signal(signal.SIGCONT)
    rows = cluster.wait_history(
        lambda r: any(x["kind"] == "fenced-write" and x["worker"] == old.nodename for x in r), 10
    )
    time.sleep(1.0)
    rows = cluster.history()
    old_writes = [x for x in rows if x["kind"] == "fenced-write" and x["worker"] == old.nodename]
    assert old_writes and old_writes[0]["token"] == old_token
    assert old_writes[0]["accepted"] is False, "the stale leader's write must be refused"
    new_write = next(x for x in rows if x["kind"] == "fenced-write" and x["tag"] == "G")
    assert new_write["accepted"] is True and new_write["token"] > old_token
    assert not any(
        x["kind"] == "end" and x.get("tag") == "T" and x["worker"] == old.nodename for x in rows
    ), "the terminate-policy run is killed on resume"
    assert not [x for x in runs(rows) if x["worker"] == old.nodename and x["at"] > resumed_at]
    assert stale_starts(rows) == []
    # Whoever is first after the resume ends the run: the parent's kill on loss,
    # or the watchdog, after which the parent settles the lost run.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not (
        "killing" in old.text() or "stopped at the end of its term" in old.text()
    ):
        time.sleep(0.05)
    assert "killing" in old.text() or "stopped at the end of its term" in old.text()


@pytest.mark.compat
@pytest.mark.slow
def test_lease_lost_terminate_kills_and_run_repeats(cluster_for):
    """Store paused under a long terminate-policy run: it is killed before expiry, then re-run."""
    cluster = cluster_for("redis")
    (worker,) = cluster.start(1)
    cluster.leader_worker()
    cluster.send("slow_terminate", 8.0, "K")
    rows = cluster.wait_history(lambda r: len(runs(r)) >= 1, 10)
    first_token = runs(rows)[0]["token"]
    cluster.store.pause()
    paused_at = time.monotonic()
    try:
        deadline = time.monotonic() + 2 + 2
        while "killing" not in worker.text() and time.monotonic() < deadline:
            time.sleep(0.05)
        killed_after = time.monotonic() - paused_at
        assert "killing" in worker.text()
    finally:
        cluster.store.resume()
    assert killed_after < 2.0 + 0.2, "killed before the lease could expire in the store"
    rows = cluster.wait_history(lambda r: len(runs(r)) >= 2, 15)
    assert len(runs(rows)) == 2, "the killed run went back to the broker and ran again"
    assert runs(rows)[1]["token"] > first_token
    assert not [x for x in rows if x["kind"] == "end" and x["token"] == first_token]


@pytest.mark.compat
@pytest.mark.slow
def test_lease_lost_cancel_is_seen_in_time(cluster_for):
    """threads pool, on_loss=cancel: lease_lost() turns true within renew_interval + 1 s."""
    cluster = cluster_for("redis")
    cluster.start(1, pool="threads")
    cluster.leader_worker()
    cluster.send("slow_cancel", 10.0, "C")
    cluster.wait_history(lambda r: len(runs(r)) >= 1, 10)
    cluster.store.pause()
    paused_at = time.monotonic()
    try:
        rows = cluster.wait_history(lambda r: any(x["kind"] == "saw-loss" for x in r), 2 + 2)
    finally:
        cluster.store.resume()
    saw = next(x for x in rows if x["kind"] == "saw-loss")
    # Loss is declared before the validity ends (at most one ttl after the
    # last renewal); the run must notice within renew_interval + 1 s of that.
    assert saw["at"] - paused_at < 2 + 2 / 3 + 1
    rows = cluster.wait_history(lambda r: len(runs(r)) >= 2, 15)
    assert len(runs(rows)) >= 2, "check_leadership() handed the message back; it ran again"


@pytest.mark.slow
def test_warm_shutdown_hands_over_quickly(cluster_for):
    """SIGTERM the leader: its finish-policy run completes, then another leads within 2 s."""
    cluster = cluster_for("redis")
    cluster.start(2)
    old = cluster.leader_worker()
    cluster.send("slow_finish", 1.0, "S")
    cluster.wait_history(lambda r: len(runs(r)) >= 1, 10)
    stopped_at = time.monotonic()
    old.proc.send_signal(signal.SIGTERM)
    stream = Stream(cluster, interval=0.02)
    rows = cluster.wait_history(lambda r: any(x["worker"] != old.nodename for x in runs(r)), 10)
    stream.stop()
    old.proc.wait(20)
    end = next(x for x in rows if x["kind"] == "end" and x.get("tag") == "S")
    first_new = min(x["at"] for x in runs(rows) if x["worker"] != old.nodename)
    assert end["worker"] == old.nodename
    assert first_new > end["at"], "the new leader starts only after the old one's run finished"
    assert first_new - max(stopped_at, end["at"]) < 2.0
    assert stale_starts(rows) == []
    assert "released election" in old.text()


@pytest.mark.compat
def test_follower_reroutes_a_leader_message_sent_to_it(cluster_for):
    """A leader task sent to a queue only a follower consumes is re-routed, run on the leader."""
    cluster = cluster_for("redis")
    cluster.start(1)
    leader = cluster.leader_worker()
    (follower,) = cluster.start(1, extra=["-Q", f"{cluster.name}.default,{cluster.name}.only-f"])
    cluster.send("leader_record", 7, queue=f"{cluster.name}.only-f")
    rows = cluster.wait_history(lambda r: len(runs(r)) >= 1, 10)
    time.sleep(0.5)
    rows = cluster.history()
    assert [(x["worker"], x["i"]) for x in runs(rows)] == [(leader.nodename, 7)]
    assert "re-routed" in follower.text()


@pytest.mark.compat
def test_step_down_hands_over_without_loss(cluster_for):
    """`celery leader step-down`: another worker runs leader tasks within 2 s; none lost."""

    cluster = cluster_for("redis")
    cluster.start(2)
    old = cluster.leader_worker()
    stream = Stream(cluster)
    cluster.wait_history(lambda r: len(runs(r)) >= 10, 10)
    asked_at = time.monotonic()
    proc = cluster.celery("leader", "step-down")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{old.nodename} stepped down" in proc.stdout
    rows = cluster.wait_history(lambda r: any(x["worker"] != old.nodename for x in runs(r)), 5)
    first_new = min(x["at"] for x in runs(rows) if x["worker"] != old.nodename)
    time.sleep(0.5)
    sent = stream.stop()
    rows = cluster.wait_history(lambda r: {x["i"] for x in runs(r)} >= set(range(sent)), 15)
    assert first_new - asked_at < 2.0
    assert {x["i"] for x in runs(rows)} >= set(range(sent))
    assert stale_starts(rows) == []


def test_stuck_loop_loses_leadership(cluster_for):
    """A leader whose consumer loop is blocked stops renewing; another worker leads."""
    cluster = cluster_for("redis")
    cluster.start(2)
    old = cluster.leader_worker()
    cluster.client.control.broadcast(
        "block_loop", arguments={"seconds": 6}, destination=[old.nodename], reply=False
    )
    deadline = time.monotonic() + 2 * 2 + 4
    new = None
    while time.monotonic() < deadline and new is None:
        try:
            candidate = cluster.leader_worker(timeout=0.3)
            new = candidate if candidate is not old else None
        except AssertionError:
            pass
    assert new is not None
    assert "not-live" in old.text()
    time.sleep(1.0)
    assert cluster.leader_worker() is new, "a stuck worker does not compete until its loop runs"
