"""Real workers and beats serve their metrics and health probe over HTTP, followers included."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from harness.servers import free_port
from tests.integration.test_named_elections import holder
from tests.integration.test_workers import runs

TTL = 2.0


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every celery_leader_* sample: {(name, sorted labels): value}."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("celery_leader_")
    }


def sample(samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def health(port: int) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def wait_for(predicate, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout} s: {what}")


def start_with_port(cluster, pool: str = "prefork", extra: list[str] | None = None):  # type: ignore[no-untyped-def]
    port = free_port()
    cluster.env["LEADER_METRICS_PORT"] = str(port)
    (worker,) = cluster.start(1, pool=pool, extra=extra)
    return worker, port


def test_leader_and_follower_export_every_series_and_the_store_error_counter(cluster_for):
    """Both export from start; a paused store moves the error counter, not leader_seen; 200."""
    cluster = cluster_for("redis")
    first, first_port = start_with_port(cluster)
    second, second_port = start_with_port(cluster)
    leader = cluster.leader_worker()
    ports = {first.nodename: first_port, second.nodename: second_port}
    leader_port = ports[leader.nodename]
    (follower_port,) = [p for n, p in ports.items() if n != leader.nodename]
    name = cluster.name
    _, status = cluster.leader_status()
    assert status is not None

    def both_saw_the_holder():  # type: ignore[no-untyped-def]
        return all(
            (sample(scrape(p), "celery_leader_leader_seen_timestamp_seconds", election=name) or 0)
            > 0
            for p in (leader_port, follower_port)
        )

    wait_for(both_saw_the_holder, 3 * TTL, "both processes saw the holder")
    on_leader, on_follower = scrape(leader_port), scrape(follower_port)
    assert sample(on_leader, "celery_leader_is_leader", election=name) == 1
    assert sample(on_leader, "celery_leader_token", election=name) == status["leader"]["token"]
    started = sample(on_leader, "celery_leader_term_started_timestamp_seconds", election=name)
    assert started is not None and abs(started - status["leader"]["acquired_at"]) < 5
    assert sample(on_follower, "celery_leader_is_leader", election=name) == 0
    assert sample(on_follower, "celery_leader_elections_total", election=name) == 0
    assert (
        sample(on_follower, "celery_leader_term_started_timestamp_seconds", election=name) is None
    )
    for reason in ("renew-rejected", "store-unreachable", "expired", "not-live"):
        assert sample(on_follower, "celery_leader_losses_total", election=name, reason=reason) == 0
    for kind in ("timeout", "unreachable", "auth", "error"):
        assert (
            sample(on_follower, "celery_leader_store_errors_total", election=name, kind=kind) == 0
        )
    assert sample(on_follower, "celery_leader_releases_total", election=name) == 0

    cluster.store.pause()
    paused_at = time.time()
    try:

        def errors_counted():  # type: ignore[no-untyped-def]
            return all(
                sum(
                    sample(scrape(p), "celery_leader_store_errors_total", election=name, kind=k)
                    or 0
                    for k in ("timeout", "unreachable", "error")
                )
                > 0
                for p in (leader_port, follower_port)
            )

        wait_for(errors_counted, 4 * TTL, "store errors counted on leader and follower")
        time.sleep(TTL)
        for port in (leader_port, follower_port):
            seen = sample(
                scrape(port), "celery_leader_leader_seen_timestamp_seconds", election=name
            )
            assert seen is not None and seen < paused_at + 0.5, "nobody was seen while paused"
            code, body = health(port)
            assert code == 200, body
            assert body["store_failures"] > 0
        after_loss = scrape(leader_port)
        assert sample(after_loss, "celery_leader_is_leader", election=name) == 0
        assert (
            sample(
                after_loss, "celery_leader_losses_total", election=name, reason="store-unreachable"
            )
            == 1
        )
    finally:
        cluster.store.resume()
    resumed_at = time.time()

    def seen_again():  # type: ignore[no-untyped-def]
        return all(
            (sample(scrape(p), "celery_leader_leader_seen_timestamp_seconds", election=name) or 0)
            > resumed_at
            for p in (leader_port, follower_port)
        )

    wait_for(seen_again, 4 * TTL, "a holder seen again after the store came back")


def test_healthz_fails_on_a_stuck_loop_and_a_dead_lease_thread(cluster_for):
    """503 while the loop is blocked past the bound, 200 after; 503 once the lease thread ends."""
    cluster = cluster_for("redis")
    cluster.env["LEADER_HEALTH_STUCK_AFTER"] = "1.5"
    worker, port = start_with_port(cluster)
    cluster.leader_worker()
    code, body = health(port)
    assert (code, body["status"], body["role"]) == (200, "ok", "leader")
    cluster.client.control.broadcast(
        "block_loop", arguments={"seconds": 5}, destination=[worker.nodename], reply=False
    )
    stuck = wait_for(lambda: health(port)[0] == 503 and health(port), 5, "503 while stuck")
    assert stuck[1]["status"] == "loop-stuck" and stuck[1]["loop_age"] > 1.5
    wait_for(lambda: health(port)[0] == 200, 10, "200 once the loop turns again")
    cluster.client.control.broadcast(
        "stop_lease_thread", destination=[worker.nodename], reply=False
    )
    dead = wait_for(lambda: health(port)[0] == 503 and health(port), 10, "503, thread gone")
    assert dead[1]["status"] == "lease-thread-dead"


def test_a_stuck_gevent_consumer_loop_is_seen_though_its_timer_runs_on(cluster_for):
    """gevent's timer is a greenlet apart from the consumer's loop: the tick goes through it."""
    cluster = cluster_for("redis")
    cluster.env["LEADER_HEALTH_STUCK_AFTER"] = "3"
    worker, port = start_with_port(cluster, pool="gevent")
    cluster.leader_worker()
    cluster.client.control.broadcast(
        "block_loop_soon", arguments={"seconds": 8}, destination=[worker.nodename], reply=False
    )
    stuck = wait_for(lambda: health(port)[0] == 503 and health(port), 8, "503 while stuck")
    assert stuck[1]["status"] == "loop-stuck"
    wait_for(lambda: "not-live" in worker.text(), 5, "the stuck worker gave the lease up")
    wait_for(lambda: health(port)[0] == 200, 15, "200 once the loop turns again")


def test_healthz_stays_200_while_the_broker_is_gone(cluster_for):
    """Celery reconnecting to a dead broker is not a stuck worker: a restart would not help."""
    cluster = cluster_for("redis")
    cluster.env["LEADER_HEALTH_STUCK_AFTER"] = "1.5"
    worker, port = start_with_port(cluster)
    cluster.leader_worker()
    cluster.data.kill()  # the broker (and the run history)
    try:
        wait_for(
            lambda: "Cannot connect" in worker.text() or "reconnect" in worker.text(),
            15,
            "the worker noticed the broker is gone",
        )
        until = time.monotonic() + 4
        while time.monotonic() < until:
            code, body = health(port)
            assert code == 200, body
            time.sleep(0.2)
        assert body["status"] in ("reconnecting", "ok"), body
    finally:
        cluster.data.start()
    wait_for(lambda: health(port)[1]["status"] == "ok", 30, "back to ok once reconnected")


def test_healthz_stays_200_while_solo_and_gevent_workers_run_a_long_task(cluster_for):
    """A long task holds a solo worker's loop by design, and keeps a gevent worker busy: 200."""
    cluster = cluster_for("redis")
    # Above the 2 s an idle gevent loop may wait between two turns.
    cluster.env["LEADER_HEALTH_STUCK_AFTER"] = "3"
    solo, solo_port = start_with_port(cluster, pool="solo")
    _, green_port = start_with_port(cluster, pool="gevent")
    for _ in range(2):  # one long task on each worker in turn, whichever leads first
        leader = cluster.leader_worker()
        port = solo_port if leader is solo else green_port
        cluster.history_client.delete("history")
        cluster.send("slow_cancel", 5.0, "long")
        wait_for(lambda: runs(cluster.history()), 10, "the long task started")
        busy_until = time.monotonic() + 4
        while time.monotonic() < busy_until:
            code, body = health(port)
            assert code == 200, body
            time.sleep(0.2)
        wait_for(
            lambda: any(r["kind"] == "end" for r in cluster.history()), 10, "the long task ended"
        )
        assert leader.nodename in {r["worker"] for r in runs(cluster.history())}
        cluster.celery("leader", "step-down")
        wait_for(lambda old=leader: cluster.leader_worker() is not old, 10, "the other one leads")


def test_worker_sends_celery_events_on_leadership_changes(cluster_for):
    """With -E, a receiver sees leader-elected, then leader-released at a step-down."""
    cluster = cluster_for("redis")
    seen: list[dict] = []
    ready = threading.Event()

    def receive() -> None:
        with cluster.client.connection_for_read() as conn:
            receiver = cluster.client.events.Receiver(
                conn, handlers={"*": seen.append}, app=cluster.client
            )
            ready.set()
            try:
                receiver.capture(limit=None, timeout=30, wakeup=False)
            except Exception:  # noqa: BLE001 - the capture ends with the test's timeout
                return

    thread = threading.Thread(target=receive, daemon=True)
    thread.start()
    assert ready.wait(10)
    time.sleep(0.5)  # the receiver's queue is bound
    (worker,) = cluster.start(1, extra=["-E"])
    cluster.leader_worker()
    elected = wait_for(
        lambda: [e for e in seen if e["type"] == "leader-elected"], 10, "leader-elected"
    )
    _, status = cluster.leader_status()
    assert status is not None
    assert elected[0]["name"] == cluster.name
    assert elected[0]["token"] == status["leader"]["token"]
    assert elected[0]["hostname"] == worker.nodename
    cluster.celery("leader", "step-down")
    released = wait_for(
        lambda: [e for e in seen if e["type"] == "leader-released"], 10, "leader-released"
    )
    assert released[0]["token"] == elected[0]["token"]


def test_embedded_beat_serves_its_own_metrics_and_health(cluster_for):
    """worker -B: the worker's port reports the workers' election, beat's port beat's."""
    cluster = cluster_for("redis")
    cluster.env["LEADER_BEAT_EVERY"] = "1"
    beat_port = free_port()
    cluster.env["LEADER_BEAT_METRICS_PORT"] = str(beat_port)
    _, worker_port = start_with_port(cluster, extra=["-B", "-s", str(cluster.tmp / "wb-schedule")])
    beat = f"{cluster.name}.beat"

    def beat_leads():  # type: ignore[no-untyped-def]
        try:
            return sample(scrape(beat_port), "celery_leader_is_leader", election=beat) == 1
        except OSError:
            return False

    wait_for(beat_leads, 20, "the embedded beat reports leading on its own port")
    on_worker = scrape(worker_port)
    assert sample(on_worker, "celery_leader_is_leader", election=cluster.name) is not None
    assert sample(on_worker, "celery_leader_is_leader", election=beat) is None
    assert sample(scrape(beat_port), "celery_leader_is_leader", election=cluster.name) is None
    code, body = health(beat_port)
    assert (code, body["status"], body["election"]) == (200, "ok", beat)


def test_healthz_reports_every_election_and_fails_when_one_lease_thread_dies(cluster_for):
    """A worker in two elections: /healthz lists both, holding off on a new store, then
    leading, both store-unreachable while the store is paused (still 200), and 503 once the
    lease thread of one of them ends (the other still leading)."""
    cluster = cluster_for("redis")
    cluster.env["LEADER_TTL"] = "6"  # the first hold-off on a new store lasts one ttl
    default, billing = cluster.name, f"{cluster.name}.billing"
    port = free_port()
    (worker,) = cluster.start(
        1,
        app="tests.integration.electionsapp",
        env={"LEADER_EXCLUDE": "reports", "CELERY_LEADER_METRICS_PORT": str(port)},
    )

    def states() -> dict[str, str]:
        code, body = health(port)
        assert code == 200, body
        return {name: view["state"] for name, view in body["elections"].items()}

    wait_for(lambda: states() == {default: "holding-off", billing: "holding-off"}, 5, "both wait")
    wait_for(lambda: states() == {default: "leading", billing: "leading"}, 15, "both lead")
    _, body = health(port)
    assert (body["election"], body["role"]) == (default, "leader"), "the default one, as before"
    assert {k: v for k, v in body["elections"][billing].items() if k != "expires_in"} == {
        "state": "leading",
        "role": "leader",
        "store_failures": 0,
        "token": holder(cluster, billing)[1],
    }

    cluster.store.pause()
    try:
        wait_for(
            lambda: states() == {default: "store-unreachable", billing: "store-unreachable"},
            10,
            "both see the store gone, and the worker stays healthy",
        )
    finally:
        cluster.store.resume()
    wait_for(lambda: states() == {default: "leading", billing: "leading"}, 20, "both lead again")

    cluster.client.control.broadcast(
        "stop_lease_thread",
        arguments={"election": "billing"},
        destination=[worker.nodename],
        reply=False,
    )
    dead = wait_for(lambda: health(port)[0] == 503 and health(port), 10, "503, billing's gone")
    assert (dead[1]["status"], dead[1]["dead"]) == ("lease-thread-dead", [billing]), dead
    assert dead[1]["elections"][billing]["state"] == "not-running", dead
    assert dead[1]["elections"][default]["state"] == "leading", dead
