"""A plain ``pip install celery-leader`` runs the Quickstart on a Redis broker.

The built wheel goes into a fresh virtualenv with no extras and nothing else,
so a dependency that only the test environment happens to bring (kombu's
Redis transport needs ``packaging``) cannot hide.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

APP = textwrap.dedent(
    """
    import os
    from pathlib import Path

    from celery import Celery
    from celery_leader import LeaderElection, leader_only

    app = Celery("proj", broker=os.environ["BROKER"])
    app.conf.leader_backend_url = os.environ["BROKER"]
    app.conf.leader_lease_ttl = 3.0
    app.steps["worker"].add(LeaderElection)


    @leader_only
    @app.task(bind=True)
    def aggregate(self, day):
        Path(os.environ["OUT"]).write_text(f"{day} {self.request.leader_token}")
    """
)


def run(venv: Path, *args: str, **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(venv / "bin" / "python"), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        **kwargs,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "pins",
    [
        pytest.param((), id="newest"),
        # Celery 5.3's own redis extra lacks what a newer kombu's Redis transport
        # imports: pip picks the newest kombu that Celery 5.3.0 allows.
        pytest.param(("celery==5.3.0",), id="celery-floor"),
    ],
)
def test_plain_install_runs_the_quickstart_on_redis(tmp_path, redis_server, pins):
    """Wheel, fresh venv, no extras: a worker leads and runs a leader task sent through Redis."""
    wheels = tmp_path / "wheels"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(ROOT), "-w", str(wheels)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = wheels.glob("celery_leader-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    installed = run(
        venv, "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel), *pins
    )
    assert installed.returncode == 0, installed.stderr[-2000:]

    project = tmp_path / "proj"
    project.mkdir()
    (project / "proj.py").write_text(APP)
    out = tmp_path / "out.txt"
    env = {"BROKER": redis_server.url, "OUT": str(out), "PATH": f"{venv / 'bin'}:/usr/bin:/bin"}
    log = (tmp_path / "worker.log").open("w")
    worker = subprocess.Popen(
        [str(venv / "bin" / "celery"), "-A", "proj", "worker", "--pool", "solo", "-l", "INFO"],
        cwd=project,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        sent = run(
            venv, "-c", "import proj; proj.aggregate.delay('2026-11-24')", cwd=project, env=env
        )
        assert sent.returncode == 0, sent.stderr[-2000:]
        deadline = time.monotonic() + 60
        while not out.exists() and time.monotonic() < deadline and worker.poll() is None:
            time.sleep(0.2)
        worker_log = (tmp_path / "worker.log").read_text()
        assert out.exists(), worker_log[-3000:]
        day, token = out.read_text().split()
        assert day == "2026-11-24" and int(token) > 0
        status = subprocess.run(
            [str(venv / "bin" / "celery"), "-A", "proj", "leader", "status", "--json"],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert status.returncode == 0, status.stderr[-2000:]
        assert json.loads(status.stdout)["leader"]["token"] == int(token)
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        log.close()
