"""celery-leader's pytest fixtures beside pytest-celery 1.x, as the Testing page says they work.

pytest-celery (in the test extra) registers its plugin, named ``celery``, through
an entry point, so it is active in every pytest run of a project that has it
installed. Each test here runs pytest on a small generated project and first
checks that the plugin is indeed active. pytest-celery's own workers run in
Docker containers, which need a Docker engine: CI has none, so nothing here
starts them; what is checked runs without Docker (``--collect-only`` and
``--setup-plan`` show which ``celery_worker`` a test would get, without
setting anything up).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.test_pytest_plugin import run_pytest

APP = """
from celery import Celery

from celery_leader import check_leadership, leader_only, lease_lost

app = Celery("proj", broker="memory://", backend="cache+memory://")


@leader_only
@app.task(bind=True)
def settle(self):
    return {"token": self.request.leader_token, "lost": lease_lost()}


@leader_only(on_loss="cancel")
@app.task
def sweep():
    check_leadership()
    return "swept"
"""

#: In every generated suite: fails unless pytest-celery 1.x's plugin is active.
PLUGIN_ACTIVE = """
from importlib.metadata import version


def test_pytest_celery_is_active(request):
    plugin = request.config.pluginmanager.get_plugin("celery")
    assert plugin is not None and plugin.__name__ == "pytest_celery.plugin"
    assert version("pytest-celery").startswith("1.")
"""

EAGER_TESTS = """
import pytest
from proj import settle, sweep

from celery_leader import LeaseLost


def test_an_eager_run_holds_the_forced_lease(leader_lease):
    assert settle.apply().get() == {"token": leader_lease.token, "lost": False}


@pytest.mark.parametrize("leader_lease_token", [42])
def test_a_chosen_token_reaches_the_task(leader_lease):
    assert settle.apply().get()["token"] == 42


def test_a_lost_lease_is_lost(lost_leader_lease):
    assert settle.apply().get()["lost"] is True
    with pytest.raises(LeaseLost):
        sweep.apply().get()
"""

#: Celery's own plugin, as the Testing page tells users of leader_worker to enable it.
CELERY_PLUGIN_LINE = 'pytest_plugins = ("celery.contrib.pytest",)\n'

#: The Testing page's conftest.py without its pytest_plugins line: leader_worker needs no ping task.
WORKER_CONFTEST = """
import pytest
from proj import app


@pytest.fixture
def celery_app():
    return app
"""

WORKER_TESTS = """
from celery.contrib.testing.worker import TestWorkController
from proj import settle


def test_a_leader_task_runs_on_the_worker_that_leads(leader_worker):
    assert isinstance(leader_worker, TestWorkController)  # in the test process, no container
    result = settle.delay().get(timeout=10)
    assert result["token"] > 0 and result["lost"] is False
"""

CELERY_WORKER_TESTS = """
def test_celery_worker(celery_worker):
    pass


def test_celery_setup(celery_setup):
    pass
"""


def project(tmp_path: Path, conftest: str, tests: str) -> Path:
    """A project in *tmp_path*: proj.py, its conftest.py and one test module."""
    (tmp_path / "proj.py").write_text(APP)
    (tmp_path / "conftest.py").write_text(conftest)
    (tmp_path / "test_proj.py").write_text(PLUGIN_ACTIVE + tests)
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
    return tmp_path


def passed(tmp_path: Path, count: int) -> str:
    """Run the project's suite; all *count* tests pass. Returns pytest's output."""
    proc = run_pytest(tmp_path, "-q", pytest_celery=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert re.search(rf"^{count} passed", out, flags=re.MULTILINE), out[-2000:]
    return out


def test_leader_lease_and_lost_leader_lease_work_beside_pytest_celery(tmp_path):
    """The eager fixtures need no worker: pytest-celery active, no Celery plugin enabled;
    `pytest --fixtures` lists celery-leader's beside pytest-celery's."""
    passed(project(tmp_path, "", EAGER_TESTS), 4)
    proc = run_pytest(tmp_path, "--fixtures", "-q", pytest_celery=True)
    assert proc.returncode == 0, proc.stdout[-3000:]
    for name in ("leader_lease", "lost_leader_lease", "leader_worker", "celery_setup"):
        assert re.search(rf"^{name}\b", proc.stdout, flags=re.MULTILINE), proc.stdout[-3000:]


@pytest.mark.parametrize("enables_celery_plugin", [True, False], ids=["celery-plugin", "alone"])
def test_leader_worker_works_beside_pytest_celery(tmp_path, enables_celery_plugin):
    """leader_worker runs on celery.contrib.pytest's fixtures: enabled by the conftest, or
    brought by pytest-celery's plugin, which re-exports them."""
    line = CELERY_PLUGIN_LINE if enables_celery_plugin else ""
    passed(project(tmp_path, line + WORKER_CONFTEST, WORKER_TESTS), 2)


def test_celery_worker_is_pytest_celerys_unless_the_conftest_enables_celerys(tmp_path):
    """Without the Celery plugin line, celery_worker is pytest-celery's (a Docker worker,
    parametrized); with it, Celery's in-process worker, which pytest-celery's celery_setup
    then gets too, and pytest warns that celery.contrib.pytest was imported before."""
    project(tmp_path, WORKER_CONFTEST, CELERY_WORKER_TESTS)
    proc = run_pytest(tmp_path, "--collect-only", "-q", pytest_celery=True)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "test_proj.py::test_celery_worker[celery_setup_worker]" in proc.stdout, proc.stdout

    (tmp_path / "conftest.py").write_text(CELERY_PLUGIN_LINE + WORKER_CONFTEST)
    proc = run_pytest(tmp_path, "--setup-plan", "-q", pytest_celery=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert re.search(r"test_proj\.py::test_celery_worker \(", out), out[-3000:]
    # Celery's celery_worker (built on celery_app), under pytest-celery's cluster and setup.
    assert re.search(r"SETUP +F celery_worker \(fixtures used: celery_app\b", out), out[-3000:]
    assert re.search(r"celery_worker_cluster \(fixtures used: celery_worker\)", out), out[-3000:]
    assert "celery_setup_worker" not in out, out[-3000:]
    assert "Module already imported so cannot be rewritten; celery.contrib.pytest" in out
