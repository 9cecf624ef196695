"""celery-leader's pytest fixtures, used as a project uses them: examples/testing's own suite,
and small projects written as a new user writes them, each run by pytest in its own process."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

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


#: A project's app module, as a new user has it: its own broker URL (replaced in conftest.py
#: by the suites that need it), its own tasks, the LeaderElection step.
USER_APP = """
from celery import Celery

from celery_leader import LeaderElection, leader_only

app = Celery("shop", broker="memory://"{backend})
app.steps["worker"].add(LeaderElection)


@leader_only
@app.task(bind=True)
def settle(self, day):
    return {{"day": day, "token": self.request.leader_token}}
"""

USER_TEST = """
from shop import settle


def test_settle_runs_on_a_worker_that_leads(leader_worker):
    assert settle.delay("2026-11-25").get(timeout=10)["token"] > 0
"""

CELERY_PLUGIN_LINE = 'pytest_plugins = ("celery.contrib.pytest",)\n'

#: celery_app returning the project's app (celery-leader's plugin enables Celery's).
USER_CONFTEST_OVERRIDE_ALONE = """
import pytest
from shop import app


@pytest.fixture
def celery_app():
    return app
"""
#: The same, with the pytest_plugins line that projects wrote before.
USER_CONFTEST_OVERRIDE = CELERY_PLUGIN_LINE + USER_CONFTEST_OVERRIDE_ALONE


def user_project(tmp_path: Path, conftest: str, *, backend: bool) -> Path:
    """A project as a new user writes it: shop.py, conftest.py, one leader_worker test."""
    (tmp_path / "shop.py").write_text(
        USER_APP.format(backend=', backend="cache+memory://"' if backend else "")
    )
    (tmp_path / "conftest.py").write_text(conftest)
    (tmp_path / "test_shop.py").write_text(USER_TEST)
    return tmp_path


def test_leader_worker_needs_no_ping_task_and_no_celery_includes(tmp_path):
    """The user's own app with a result backend is enough: leader_worker does not need
    Celery's ping task, so the project lists no celery_includes."""
    project = user_project(tmp_path, USER_CONFTEST_OVERRIDE, backend=True)
    proc = run_pytest(project, "-q", "-p", "no:cacheprovider")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert re.search(r"^1 passed", out, flags=re.MULTILINE), out[-2000:]


def one_line_error(tmp_path: Path, *args: str) -> str:
    """Run the project, whose one test must error in leader_worker's setup; its output."""
    proc = run_pytest(tmp_path, "-q", "-p", "no:cacheprovider", *args)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]
    assert re.search(r"^1 error", out, flags=re.MULTILINE), out[-4000:]
    return out


def test_leader_worker_with_celerys_plugin_kept_out_says_so(tmp_path):
    """Celery's plugin blocked on the command line: one line says leader_worker needs it,
    instead of pytest's 'fixture not found' and its list of every fixture."""
    project = user_project(tmp_path, USER_CONFTEST_OVERRIDE_ALONE, backend=True)
    out = one_line_error(project, "-p", "no:celery.contrib.pytest")
    assert re.search(
        r"^leader_worker needs Celery's pytest fixtures \(the plugin celery\.contrib\.pytest, "
        r"which celery-leader enables\), but this run keeps them out: drop "
        r"-p no:celery\.contrib\.pytest$",
        out,
        flags=re.MULTILINE,
    ), out[-4000:]
    assert "fixture 'celery_includes' not found" not in out, out[-4000:]


def test_celerys_plugin_is_enabled_without_a_pytest_plugins_line(tmp_path):
    """No pytest_plugins line: celery-leader's plugin enables Celery's, marked for assertion
    rewriting first (a rewrite warning is an error here), and `pytest --fixtures` lists it."""
    project = user_project(tmp_path, USER_CONFTEST_OVERRIDE_ALONE, backend=True)
    strict = ("-p", "no:cacheprovider", "-W", "error::pytest.PytestAssertRewriteWarning")
    proc = run_pytest(project, "-q", *strict)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert re.search(r"^1 passed in [0-9.]+s$", out, flags=re.MULTILINE), out[-2000:]
    listed = run_pytest(project, "--fixtures", *strict)
    assert listed.returncode == 0, (listed.stdout + listed.stderr)[-4000:]
    assert re.search(r"fixtures defined from celery\.contrib\.pytest", listed.stdout)


@pytest.mark.parametrize("how", ["conftest-line", "command-line"])
def test_celerys_plugin_enabled_by_the_project_too_is_registered_once(tmp_path, how):
    """A conftest.py that keeps its pytest_plugins line, or `-p celery.contrib.pytest`: the
    plugin is registered once (no rewrite warning, one celery_app in `pytest --fixtures`)."""
    line = CELERY_PLUGIN_LINE if how == "conftest-line" else ""
    project = user_project(tmp_path, line + USER_CONFTEST_OVERRIDE_ALONE, backend=True)
    args = ["-p", "celery.contrib.pytest"] if how == "command-line" else []
    strict = ("-p", "no:cacheprovider", "-W", "error::pytest.PytestAssertRewriteWarning", *args)
    proc = run_pytest(project, "-q", *strict)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert re.search(r"^1 passed in [0-9.]+s$", out, flags=re.MULTILINE), out[-2000:]
    listed = run_pytest(project, "--fixtures", "-v", *strict)
    assert listed.returncode == 0, (listed.stdout + listed.stderr)[-4000:]
    # -v names each fixture's file: Celery's celery_app once, the project's once.
    celery_apps = re.findall(r"^celery_app\b", listed.stdout, flags=re.MULTILINE)
    assert len(celery_apps) == 2, listed.stdout[-4000:]


def test_leader_worker_on_celerys_empty_test_app_says_to_return_yours(tmp_path):
    """Celery's plugin enabled, celery_app not overridden: its empty test app has none of
    the project's tasks (they would go to the project's broker and wait there); one line
    says to return the project's app from celery_app."""
    out = one_line_error(user_project(tmp_path, CELERY_PLUGIN_LINE, backend=True))
    assert re.search(
        r"^leader_worker: the app of the celery_app fixture \('celery\.tests'\) has no "
        r"leader-only task: define a celery_app fixture in your conftest\.py that returns "
        r"your app$",
        out,
        flags=re.MULTILINE,
    ), out[-4000:]


def test_leader_worker_on_an_app_without_result_backend_says_what_to_set(tmp_path):
    """The project's app has no result backend: no test could wait for a result; one line
    gives the settings to add, instead of NotImplementedError from the test's .get()."""
    out = one_line_error(user_project(tmp_path, USER_CONFTEST_OVERRIDE, backend=False))
    assert re.search(
        r"^leader_worker: the app 'shop' has no result backend: add "
        + re.escape('app.conf.update(broker_url="memory://", result_backend="cache+memory://")')
        + r" to your conftest\.py, before any test uses the app$",
        out,
        flags=re.MULTILINE,
    ), out[-4000:]
    assert "NotImplementedError" not in out, out[-4000:]


def test_a_leader_worker_test_tears_down_in_well_under_a_second():
    """Stopping the worker does not wait out the blocking loop's 2 s turns (twice) or the
    in-memory broker's 1 s polls: the example's worker test tears down in under 1 s."""
    proc = run_pytest(EXAMPLE, "-q", "--durations=0", "--durations-min=0", "-vv")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    found = re.search(
        r"^([0-9.]+)s teardown +test_shop\.py::test_settle_runs_on_a_worker_that_leads$",
        out,
        flags=re.MULTILINE,
    )
    assert found, out[-3000:]
    assert float(found.group(1)) < 1.0, out[-3000:]
