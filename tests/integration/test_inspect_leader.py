"""``celery inspect leader`` on real workers, one of them without the LeaderElection step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cluster import ROOT, Worker

# An app that imports celery_leader and has its settings but never adds the step:
# the shape of a worker someone forgot to wire up, or one left out on purpose.
STEPLESS_APP = """\
import os

from celery import Celery

import celery_leader  # registers `inspect leader` and nothing else

app = Celery("stepless", broker=os.environ["LEADER_BROKER"])
app.conf.leader_name = os.environ["LEADER_NAME"]
app.conf.leader_backend_url = os.environ["LEADER_STORE"]
app.conf.worker_hijack_root_logger = False
"""


class SteplessWorker(Worker):
    """A ``celery worker`` of the step-less app, on the cluster's broker."""

    def __init__(
        self, env: dict[str, str], nodename: str, logdir: Path, source: str = STEPLESS_APP
    ) -> None:
        self.nodename = nodename
        logdir.mkdir(parents=True, exist_ok=True)
        self.log = logdir / "stepless.log"
        (logdir / "stepless.py").write_text(source)
        env = {**env, "PYTHONPATH": os.pathsep.join([str(logdir), env["PYTHONPATH"]])}
        args = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "stepless",
            "worker",
            "-n",
            nodename,
            "-P",
            "solo",
            "-l",
            "info",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                args, cwd=ROOT, env=env, stdout=log, stderr=log, start_new_session=True
            )


@pytest.mark.compat
def test_worker_without_the_step_answers_disabled(cluster_for, tmp_path):
    """inspect leader: the step-less worker answers role "disabled", nulls; the other leads."""
    cluster = cluster_for("redis")
    stepless = SteplessWorker(cluster.env, f"stepless@{cluster.name}", tmp_path)
    cluster.workers.append(stepless)  # stopped with the cluster
    stepless.wait_ready()
    (with_step,) = cluster.start(1)
    assert cluster.leader_worker() is with_step
    proc = cluster.celery("inspect", "leader", "--json", "--timeout", "3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    views = json.loads(proc.stdout)
    assert set(views) == {stepless.nodename, with_step.nodename}
    assert views[stepless.nodename] == {
        "role": "disabled",
        "name": None,
        "token": None,
        "expires_in": None,
    }
    assert views[with_step.nodename]["role"] == "leader"
    assert views[with_step.nodename]["name"] == cluster.name
    assert "Traceback" not in stepless.text()
    code, status = cluster.leader_status()
    assert code == 0
    assert status is not None
    assert status["leader"]["nodename"] == with_step.nodename


STEPLESS_WITH_TASK = (
    STEPLESS_APP
    + """
from celery_leader import leader_only


@leader_only
@app.task
def settle():
    return "settled"
"""
)


def test_a_worker_with_leader_tasks_but_no_step_says_what_to_add(cluster_for, tmp_path):
    """One warning at start names the tasks, the queue they wait in, and the line to add."""
    cluster = cluster_for("redis")
    plain = SteplessWorker(cluster.env, f"plain@{cluster.name}", tmp_path / "plain")
    with_task = SteplessWorker(
        cluster.env, f"tasks@{cluster.name}", tmp_path / "tasks", STEPLESS_WITH_TASK
    )
    cluster.workers.extend([plain, with_task])
    plain.wait_ready()
    with_task.wait_ready()
    text = with_task.text()
    assert "imports leader-only tasks (stepless.settle) but has no LeaderElection step" in text
    assert f"wait in queue '{cluster.name}.leader'" in text
    assert 'app.steps["worker"].add(LeaderElection)' in text
    assert text.count("no LeaderElection step") == 1
    assert "LeaderElection step" not in plain.text(), "no leader-only task, nothing to say"
