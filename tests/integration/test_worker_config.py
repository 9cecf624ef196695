"""Worker start-up with bad settings, a lease store that is down or refuses us, signals, ETA."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from harness.cluster import ROOT
from harness.servers import RedisServer, free_port


def runs(rows, kind="start"):
    return [r for r in rows if r["kind"] == kind]


def beat_command(tmp_path, *extra: str) -> list[str]:
    """``celery beat`` of leaderapp, with a schedule file of this test's own."""
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "tests.integration.leaderapp",
        "beat",
        "-l",
        "info",
        *extra,
        "-s",
        str(tmp_path / "schedule"),
    ]


@pytest.mark.parametrize(
    ("env", "fragments"),
    [
        ({"LEADER_TTL": "0"}, ["leader_lease_ttl=0 is not allowed", "> 0"]),
        ({"LEADER_TTL": "2", "LEADER_RENEW": "1.5"}, ["leader_renew_interval=1.5", "< ttl/2 (1)"]),
        (
            {"LEADER_STORE": "mongodb://u:hunter2@h/db"},
            ["leader_backend_url", "'mongodb'", "redis://"],
        ),
        ({"LEADER_STORE": "memory://"}, ["memory://", "not allowed in a celery worker process"]),
        ({"CONCURRENCY": "1025"}, ["prefork pool of 1025 processes", "at most 1024"]),
    ],
)
def test_bad_settings_stop_the_worker_with_one_clear_line(cluster_for, env, fragments):
    """A bad setting: the worker exits at start with one line naming key, value and range."""
    cluster = cluster_for("redis")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.integration.leaderapp",
            "worker",
            "-l",
            "info",
            *(["--concurrency", env["CONCURRENCY"]] if "CONCURRENCY" in env else []),
        ],
        cwd=ROOT,
        env={**cluster.env, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "Traceback" not in output
    errors = [line for line in output.splitlines() if line.startswith("Error: celery-leader:")]
    assert len(errors) == 1, output[-2000:]
    for fragment in fragments:
        assert fragment in errors[0]
    assert "hunter2" not in output
    if "mongodb" in env.get("LEADER_STORE", ""):
        assert "memory://" not in errors[0], "the hint does not offer the test-only store"


@pytest.mark.parametrize(
    ("env", "fragments"),
    [
        ({"LEADER_TTL": "0"}, ["leader_lease_ttl=0 is not allowed", "> 0"]),
        ({"LEADER_BEAT_MISSED": "twice"}, ["leader_beat_missed_default='twice'", "once, skip"]),
        (
            {"LEADER_BEAT_WRAPPED": "no.such:Scheduler"},
            ["leader_beat_scheduler='no.such:Scheduler' cannot be loaded"],
        ),
    ],
)
def test_bad_settings_stop_beat_with_one_clear_line(cluster_for, tmp_path, env, fragments):
    """celery beat with a bad setting exits at start with one line, as the worker does."""
    cluster = cluster_for("redis")
    proc = subprocess.run(
        beat_command(tmp_path),
        cwd=ROOT,
        env={**cluster.env, "LEADER_BEAT_EVERY": "1", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "Traceback" not in output, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("Error: celery-leader:")]
    assert len(errors) == 1, output[-2000:]
    for fragment in fragments:
        assert fragment in errors[0]


@pytest.mark.parametrize(
    ("scheduler", "refused"),
    [("celery.beat:PersistentScheduler", True), ("leader", False)],
)
def test_beat_not_under_the_leader_scheduler_is_refused(cluster_for, tmp_path, scheduler, refused):
    """celery beat -S <another scheduler> with leader settings stops at start with one line."""
    cluster = cluster_for("redis")
    beat = subprocess.Popen(
        beat_command(tmp_path, "-S", scheduler),
        cwd=ROOT,
        env={**cluster.env, "LEADER_BEAT_EVERY": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        beat.wait(6)
    except subprocess.TimeoutExpired:
        pass
    finally:
        if beat.poll() is None:
            beat.send_signal(signal.SIGTERM)
        output, _ = beat.communicate(timeout=30)
    errors = [line for line in output.splitlines() if line.startswith("Error: celery-leader:")]
    if refused:
        assert beat.returncode != 0, output[-2000:]
        assert "Traceback" not in output, output[-3000:]
        assert len(errors) == 1, output[-2000:]
        assert errors[0].startswith(
            "Error: celery-leader: this beat runs celery.beat:PersistentScheduler directly"
        )
        assert "-S leader" in errors[0]
    else:
        assert "beat: Starting..." in output, output[-2000:]
        assert errors == [], output[-2000:]


def leader_errors(worker):
    return [
        line for line in worker.text().splitlines() if "ERROR" in line and "celery-leader" in line
    ]


@pytest.mark.slow
def test_store_down_worker_serves_and_leads_once_store_is_back(cluster_for, tmp_path):
    """Store unreachable: ordinary tasks run, one masked error; it leads once the store is up."""
    cluster = cluster_for("redis")
    port = free_port()
    cluster.env["LEADER_STORE"] = f"redis://:storepass1@127.0.0.1:{port}/0"
    (worker,) = cluster.start(1)
    for i in range(5):
        cluster.send("plain_record", i)
    rows = cluster.wait_history(lambda r: len(runs(r, "plain")) >= 5, 15)
    assert len(runs(rows, "plain")) == 5
    cluster.send("leader_record", 1)
    time.sleep(1.5)
    assert runs(cluster.history()) == [], "no leader work without a lease"
    errors = leader_errors(worker)
    assert len(errors) == 1, errors
    assert "***" in errors[0] and f":{port}" in errors[0]
    assert "storepass1" not in worker.text()
    store = RedisServer(tmp_path, port=port, extra=["--requirepass", "storepass1"]).start()
    try:
        rows = cluster.wait_history(lambda r: len(runs(r)) >= 1, 2 * 3 + 5)
        assert [x["worker"] for x in runs(rows)] == [worker.nodename]
        assert "reachable again" in worker.text()
    finally:
        worker.stop()
        store.stop()


@pytest.mark.parametrize(
    ("userinfo", "says"),
    [
        ("", "the server needs a password and leader_backend_url gives none"),
        (":wrongpass7@", "the server refused the password in leader_backend_url"),
    ],
    ids=["no-password", "wrong-password"],
)
def test_store_password_missing_or_wrong_is_one_clear_masked_error(
    cluster_for, tmp_path, userinfo, says
):
    """A store that wants a password: ordinary tasks run; the worker and a beat each log one
    line that says what is wrong and names leader_backend_url; no secret is shown."""
    cluster = cluster_for("redis")
    store = RedisServer(tmp_path, extra=["--requirepass", "rightpass"]).start()
    try:
        cluster.env["LEADER_STORE"] = f"redis://{userinfo}127.0.0.1:{store.port}/0"
        cluster.env["LEADER_BEAT_EVERY"] = "1"  # a led beat
        (worker,) = cluster.start(1)
        beat = cluster.start_beat()
        cluster.send("plain_record", 1)
        rows = cluster.wait_history(lambda r: len(runs(r, "plain")) >= 1, 15)
        assert len(runs(rows, "plain")) == 1
        deadline = time.monotonic() + 15
        while not leader_errors(beat):
            assert time.monotonic() < deadline, beat.text()[-3000:]
            time.sleep(0.1)
        time.sleep(1.0)
        for process in (worker, beat):
            errors = leader_errors(process)
            assert len(errors) == 1, errors
            assert says in errors[0], errors[0]
            assert "HELLO" not in errors[0] and "username-password" not in errors[0]
            assert "wrongpass7" not in process.text() and "rightpass" not in process.text()
    finally:
        store.stop()


def test_signals_are_sent_on_election_and_release(cluster_for):
    """leader_elected on election and leader_released on warm shutdown, with the token."""
    cluster = cluster_for("redis")
    (worker,) = cluster.start(1)
    cluster.leader_worker()
    rows = cluster.wait_history(lambda r: runs(r, "signal-elected"), 5)
    elected = runs(rows, "signal-elected")
    assert elected[0]["worker"] == worker.nodename and elected[0]["name"] == cluster.name
    worker.proc.send_signal(signal.SIGTERM)
    worker.proc.wait(20)
    rows = cluster.wait_history(lambda r: runs(r, "signal-released"), 5)
    released = runs(rows, "signal-released")
    assert released and released[0]["token"] == elected[0]["token"]


def test_lost_signal_carries_the_reason(cluster_for):
    """Store paused past the ttl: leader_lost with reason store-unreachable."""
    cluster = cluster_for("redis")
    cluster.start(1)
    cluster.leader_worker()
    cluster.store.pause()
    try:
        rows = cluster.wait_history(lambda r: runs(r, "signal-lost"), 2 + 2)
    finally:
        cluster.store.resume()
    lost = runs(rows, "signal-lost")
    assert lost and lost[0]["reason"] == "store-unreachable"


@pytest.mark.compat
def test_eta_leader_message_is_handed_back_on_step_down(cluster_for):
    """A leader message waiting for its ETA goes back to the broker and runs on the next leader."""
    cluster = cluster_for("redis")
    cluster.start(2)
    old = cluster.leader_worker()
    cluster.send("leader_record", 42, countdown=4)
    deadline = time.monotonic() + 5
    while "received" not in old.text() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc = cluster.celery("leader", "step-down")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = cluster.wait_history(lambda r: len(runs(r)) >= 1, 10)
    time.sleep(0.5)
    rows = cluster.history()
    assert [(x["worker"] != old.nodename, x["i"]) for x in runs(rows)] == [(True, 42)]
