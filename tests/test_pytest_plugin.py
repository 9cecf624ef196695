"""celery-leader's pytest fixtures, used as a project uses them: examples/testing's own suite."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "testing"


def run_pytest(
    cwd: Path, *args: str, pytest_celery: bool = False
) -> subprocess.CompletedProcess[str]:
    """pytest in its own process, in *cwd*, as a project runs its suite.

    pytest-celery (in the test extra) registers its plugin, named ``celery``,
    in every pytest run; unless *pytest_celery*, it is switched off, so that
    the project runs as most projects do: with Celery's own plugin only
    (tests/test_pytest_celery.py runs beside it).
    """
    plugins = () if pytest_celery else ("-p", "no:celery")
    return subprocess.run(
        [sys.executable, "-m", "pytest", *plugins, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_example_suite_passes_with_the_installed_plugin():
    """The plugin loads through its pytest11 entry point; eager, lost and worker fixtures work."""
    proc = run_pytest(EXAMPLE, "-q")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert re.search(r"^4 passed", out, flags=re.MULTILINE), out[-2000:]


def test_the_fixtures_are_listed_for_users():
    """`pytest --fixtures` shows the leader_* fixtures with their docstrings."""
    proc = run_pytest(EXAMPLE, "--fixtures", "-q")
    for name in ("leader_lease", "lost_leader_lease", "leader_worker", "leader_lease_token"):
        assert re.search(rf"^{name}\b", proc.stdout, flags=re.MULTILINE), proc.stdout[-3000:]


LEFTOVERS_SUITE = """
import pytest
from celery import Celery

from celery_leader import LeaderElection, leader_only
from celery_leader.tasks.runtime import shared_lease
from celery_leader.worker.coordinator import current_coordinator

pytest_plugins = ("celery.contrib.pytest",)
app = Celery("leftovers", broker="memory://", backend="cache+memory://")
app.conf.leader_backend_url = "redis://example.invalid:6379/0"  # the project's own store


@leader_only
@app.task(bind=True)
def token(self):
    return self.request.leader_token


@pytest.fixture
def celery_app():
    return app


@pytest.fixture(scope="session")
def celery_includes():
    return ["celery.contrib.testing.tasks"]


def test_1_leads(leader_worker):
    assert token.delay().get(timeout=10) > 0


def test_2_nothing_left_behind():
    assert current_coordinator() is None
    assert shared_lease() is None
    assert app.conf.leader_backend_url == "redis://example.invalid:6379/0"
    assert LeaderElection not in app.steps["worker"]
"""


def test_leader_worker_leaves_the_app_and_the_process_as_they_were(tmp_path):
    """After leader_worker: no coordinator or lease left, the app's store and steps restored."""
    (tmp_path / "test_leftovers.py").write_text(LEFTOVERS_SUITE)
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
    proc = run_pytest(tmp_path, "-q")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert re.search(r"^2 passed", out, flags=re.MULTILINE), out[-2000:]
