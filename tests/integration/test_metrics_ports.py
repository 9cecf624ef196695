"""One metrics port per worker of one app: CELERY_LEADER_METRICS_PORT, --leader-metrics-port.

All workers of a deployment share one app configuration, so
``leader_metrics_port`` alone gives them all one port, which only the first
on a host can serve. The environment variable (a worker's or beat's own) and
the worker option override it for one process. The app here sets
``leader_metrics_port`` (LEADER_METRICS_PORT of leaderapp) to a port that no
process may end up serving.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest

from harness.cluster import ROOT
from harness.servers import free_port
from tests.integration.test_metrics_worker import health, sample, scrape, wait_for

#: leaderapp set up with celery_leader.install(app), which adds the worker option.
APP = "tests.integration.optionsapp"


def refused(port: int) -> bool:
    """True when nothing listens on 127.0.0.1:*port*."""
    with socket.socket() as sock:
        sock.settimeout(2)
        return sock.connect_ex(("127.0.0.1", port)) != 0


def test_two_workers_of_one_app_each_serve_their_own_port(cluster_for):
    """The variable gives one worker its port, the option another (over the variable too):
    each answers on its own, one as leader and one as follower; the app's port is not used."""
    cluster = cluster_for("redis")
    app_port, by_variable, ignored, by_option = (free_port() for _ in range(4))
    cluster.env["LEADER_METRICS_PORT"] = str(app_port)
    (first,) = cluster.start(1, app=APP, env={"CELERY_LEADER_METRICS_PORT": str(by_variable)})
    (second,) = cluster.start(
        1,
        app=APP,
        env={"CELERY_LEADER_METRICS_PORT": str(ignored)},
        extra=["--leader-metrics-port", str(by_option)],
    )
    cluster.leader_worker()
    roles = {}
    for worker, port in ((first, by_variable), (second, by_option)):
        assert f"serving /metrics and /healthz on http://127.0.0.1:{port}" in worker.text()
        code, body = wait_for(lambda p=port: health(p)[1]["status"] == "ok" and health(p), 15, "ok")
        assert code == 200, body
        roles[worker.nodename] = body["role"]
        leading = sample(scrape(port), "celery_leader_is_leader", election=cluster.name)
        assert leading == (1 if body["role"] == "leader" else 0)
    assert sorted(roles.values()) == ["follower", "leader"], roles
    assert refused(app_port), "leader_metrics_port is overridden on both workers"
    assert refused(ignored), "the option comes before the variable"


def test_beats_variable_overrides_leader_beat_metrics_port(cluster_for):
    """CELERY_LEADER_BEAT_METRICS_PORT gives a beat its own port instead of the app's."""
    cluster = cluster_for("redis")
    app_port, own = free_port(), free_port()
    cluster.env.update(
        {
            "LEADER_BEAT_EVERY": "1",
            "LEADER_BEAT_METRICS_PORT": str(app_port),
            "CELERY_LEADER_BEAT_METRICS_PORT": str(own),
        }
    )
    cluster.start_beat()
    code, body = wait_for(lambda: not refused(own) and health(own), 20, "beat serves its port")
    assert code == 200 and body["election"] == f"{cluster.name}.beat", body
    assert refused(app_port)


def refused_start(cluster, command: str, *extra: str, env: dict[str, str]) -> str:  # type: ignore[no-untyped-def]
    """``celery -A optionsapp COMMAND EXTRA``, which must exit at start; its output."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", APP, command, "-l", "info", *extra],
        cwd=ROOT,
        env={**cluster.env, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # its pool children too
        output, _ = proc.communicate()
        raise AssertionError(f"celery {command} did not stop at start:\n{output[-2000:]}") from None
    assert proc.returncode != 0, output[-2000:]
    return output


@pytest.mark.parametrize(
    ("command", "extra", "env", "named"),
    [
        (
            "worker",
            [],
            {"CELERY_LEADER_METRICS_PORT": "9o9o"},
            "environment variable CELERY_LEADER_METRICS_PORT='9o9o'",
        ),
        ("worker", ["--leader-metrics-port", "70000"], {}, "--leader-metrics-port='70000'"),
        (
            "beat",
            [],
            {"CELERY_LEADER_BEAT_METRICS_PORT": "-1"},
            "environment variable CELERY_LEADER_BEAT_METRICS_PORT='-1'",
        ),
    ],
    ids=["worker-variable", "worker-option", "beat-variable"],
)
def test_a_bad_port_stops_the_process_with_one_line_naming_where_it_came_from(
    cluster_for, tmp_path, command, extra, env, named
):
    """A port that is no port, from the variable or the option: one line names it and the
    ports allowed; no traceback."""
    cluster = cluster_for("redis")
    if command == "beat":
        env = {**env, "LEADER_BEAT_EVERY": "1"}
        extra = [*extra, "-s", str(tmp_path / "schedule")]
    output = refused_start(cluster, command, *extra, env=env)
    assert "Traceback" not in output, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("Error: celery-leader:")]
    assert errors == [
        f"Error: celery-leader: {named} is not allowed: it must be a TCP port number, 1..65535"
    ], output[-2000:]
