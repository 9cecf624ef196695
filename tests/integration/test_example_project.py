"""example_project on a real redis-server with two real prefork ``celery worker`` processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from example_project.proj import app
from example_project.proj.tasks import aggregate, compact, record_event, report
from harness.servers import RedisServer

ROOT = Path(__file__).resolve().parents[2]
APP = "example_project.proj"
# Unique db numbers, so nothing shares a database by accident.
BROKER_DB, LEADER_DB, RESULT_DB, DATA_DB = 3, 4, 5, 6
TIMEOUT = 30


class ExampleWorker:
    """One ``celery -A example_project.proj worker`` process, logging to a file."""

    def __init__(self, env: dict[str, str], nodename: str, logdir: Path) -> None:
        self.nodename = nodename
        self.log = logdir / f"{nodename.split('@', maxsplit=1)[0]}.log"
        args = [
            *(sys.executable, "-m", "celery", "-A", APP, "worker", "-n", nodename),
            *("-P", "prefork", "-c", "2", "-l", "info"),
            *("--without-gossip", "--without-mingle", "--without-heartbeat"),
        ]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                args, cwd=ROOT, env=env, stdout=log, stderr=log, start_new_session=True
            )

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_ready(self, timeout: float = TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while "ready." not in self.text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{self.nodename} not ready:\n{self.text()[-3000:]}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


class Example:
    """The servers, workers and clients of one run of the example project."""

    def __init__(self, tmp: Path) -> None:
        self.server = RedisServer(tmp).start()
        base = f"redis://127.0.0.1:{self.server.port}"
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "PROJ_BROKER_URL": f"{base}/{BROKER_DB}",
            "PROJ_LEADER_URL": f"{base}/{LEADER_DB}",
            "PROJ_RESULT_URL": f"{base}/{RESULT_DB}",
            "PROJ_DATA_URL": f"{base}/{DATA_DB}",
            "PROJ_LEADER_TTL": "4",
        }
        # This process sends with the example's own app, pointed at the same servers.
        app.conf.update(
            broker_url=self.env["PROJ_BROKER_URL"],
            result_backend=self.env["PROJ_RESULT_URL"],
            leader_backend_url=self.env["PROJ_LEADER_URL"],
        )
        self.data = self.server.client(db=DATA_DB)
        host = f"ex{uuid.uuid4().hex[:8]}"
        self.workers = [ExampleWorker(self.env, f"w{i}@{host}", tmp) for i in (1, 2)]
        for worker in self.workers:
            worker.wait_ready()

    def celery(self, *args: str) -> tuple[int, object]:
        """Run ``celery -A example_project.proj <args>``; its exit code and JSON output."""
        proc = subprocess.run(
            [sys.executable, "-m", "celery", "-A", APP, *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
        assert proc.stdout.strip(), f"celery {' '.join(args)}: {proc.stderr[-2000:]}"
        return proc.returncode, json.loads(proc.stdout)

    def record(self, events: list[tuple[str, int]]) -> list[int]:
        results = [record_event.delay(kind, amount) for kind, amount in events]
        return [result.get(timeout=TIMEOUT) for result in results]

    def close(self) -> None:
        for worker in self.workers:
            if worker.proc.poll() is None:
                worker.proc.send_signal(signal.SIGTERM)
        for worker in self.workers:
            worker.stop()
        self.data.close()
        app.close()
        self.server.stop()


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory):
    run = Example(tmp_path_factory.mktemp("example"))
    yield run
    run.close()


@pytest.fixture
def fresh(example: Example) -> Example:
    example.data.flushdb()  # events, archive, totals and fence keys of earlier tests
    return example


def test_aggregate_totals_recorded_events_fenced_with_the_leader_token(fresh):
    """Events recorded by record_event are totalled by aggregate and fenced with its token."""
    seqs = fresh.record([("click", 1), ("sale", 250), ("click", 2), ("sale", 100), ("refund", -5)])
    assert sorted(seqs) == [1, 2, 3, 4, 5]

    result = aggregate.delay().get(timeout=TIMEOUT)

    assert result["totals"] == {"click": 3, "sale": 350, "refund": -5}
    assert result["events"] == 5
    assert result["written"] is True
    token = result["token"]
    assert isinstance(token, int) and token > 0
    stored = json.loads(fresh.data.get("proj:totals"))
    assert stored["totals"] == result["totals"]
    assert stored["token"] == token
    assert int(fresh.data.get("celery-leader:fence:totals")) == token
    assert report.delay().get(timeout=TIMEOUT)["totals"] == result["totals"]


def test_aggregate_runs_on_the_worker_leader_status_names(fresh):
    """Every aggregate ran on the worker `leader status --json` and `inspect leader` name."""
    runs = [r.get(timeout=TIMEOUT) for r in [aggregate.delay() for _ in range(4)]]

    code, status = fresh.celery("leader", "status", "--json")
    assert code == 0, status
    leader = status["leader"]
    assert Counter(run["worker"] for run in runs) == {leader["nodename"]: 4}
    assert {run["token"] for run in runs} == {leader["token"]}
    assert leader["nodename"] in {worker.nodename for worker in fresh.workers}

    code, views = fresh.celery("inspect", "leader", "--json", "--timeout", "3")
    assert code == 0, views
    roles = {node: view["role"] for node, view in views.items()}
    followers = {w.nodename for w in fresh.workers} - {leader["nodename"]}
    assert roles == {leader["nodename"]: "leader", **dict.fromkeys(followers, "follower")}
    assert views[leader["nodename"]]["token"] == leader["token"]


def test_compact_trims_the_events_in_batches_and_keeps_the_totals(fresh):
    """compact trims the list to `keep` in batches, returns, and the totals stay the same."""
    fresh.record([("click" if i % 3 else "sale", i) for i in range(1, 41)])
    before = aggregate.delay().get(timeout=TIMEOUT)

    result = compact.delay(keep=5, batch=7).get(timeout=TIMEOUT)

    assert result["stale"] is False
    assert (result["removed"], result["remaining"], result["batches"]) == (35, 5, 5)
    remaining = [json.loads(raw) for raw in fresh.data.lrange("proj:events", 0, -1)]
    assert [event["seq"] for event in remaining] == [36, 37, 38, 39, 40]
    archive = json.loads(fresh.data.get("proj:archive"))
    assert (archive["upto"], archive["count"]) == (35, 35)
    assert int(fresh.data.get("celery-leader:fence:events")) == result["token"]
    after = aggregate.delay().get(timeout=TIMEOUT)
    assert after["totals"] == before["totals"] == {"click": 547, "sale": 273}
    assert after["events"] == 40


def test_compact_under_a_stale_token_folds_nothing(fresh):
    """Once a newer term was admitted on the events fence, compact writes and removes nothing."""
    fresh.record([("click", i) for i in range(1, 21)])
    fresh.data.set("celery-leader:fence:events", str(1 << 62))  # a term from far ahead

    result = compact.delay(keep=5, batch=7).get(timeout=TIMEOUT)

    assert result["stale"] is True
    assert (result["removed"], result["remaining"], result["batches"]) == (0, 20, 0)
    assert fresh.data.get("proj:archive") is None
    assert int(fresh.data.get("celery-leader:fence:events")) == 1 << 62
