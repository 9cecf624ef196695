"""pytest fixtures for testing code that uses celery-leader (loaded automatically by pytest).

Installed as a ``pytest11`` plugin, so the fixtures are there in any
project that has celery-leader installed; their names start with
``leader_`` to stay out of other plugins' way.

* ``leader_lease``: eager runs (``task.apply()``, ``task_always_eager``)
  hold a forced lease with token ``leader_lease_token`` (1 unless you
  override that fixture). Yields :class:`celery_leader.testing.Leadership`:
  ``.token``, ``.lose()``, ``.regain()``.
* ``lost_leader_lease``: the same lease, already lost: ``lease_lost()`` is
  true and ``check_leadership()`` raises ``LeaseLost`` in eager runs.
* ``leader_worker``: a real worker in the test process that leads (see
  :func:`celery_leader.testing.start_leader_worker`), built on the fixtures
  of Celery's own plugin (``celery.contrib.pytest``, which this plugin
  enables, see below): it runs the app that ``celery_app`` returns
  (override it to return your app), imports
  ``celery_includes`` and passes ``celery_worker_pool`` and
  ``celery_worker_parameters`` as Celery's ``celery_worker`` does, runs the
  election on the in-memory lease store (``memory://``, one per test) and
  returns once the worker leads. It needs no ping task, and on the
  in-memory broker its teardown takes well under a second. It stops the
  test with one line saying what to do when Celery's fixtures are
  kept out, when the app has no result backend, or when the app has no
  leader-only task (Celery's empty test app, ``celery_app`` not
  overridden). Use it instead of ``celery_worker``, not beside it: two
  workers in one process share kombu's hub and break.

Celery's fixtures: this plugin enables ``celery.contrib.pytest`` before any
conftest.py is read, unless a plugin already brings its fixtures
(pytest-celery 1.x re-exports them), so a project writes no
``pytest_plugins`` line. It registers the module under its own name, as a
``pytest_plugins`` line would, after marking it for assertion rewriting: a
conftest.py that still has the line finds it registered and does nothing
(no second registration, no rewrite warning). ``-p no:celery.contrib.pytest``
keeps it out.

Assumptions: :func:`~celery_leader.testing.leadership` changes process-wide
state, so these fixtures are not for tests that run in parallel threads of
one process (pytest-xdist runs processes, which is fine); the in-memory store
lives in one process only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from celery_leader import testing
from celery_leader.testing import Leadership, leadership, start_leader_worker

#: How long ``leader_worker`` waits for its worker to lead, in seconds.
LEAD_TIMEOUT = testing.LEAD_TIMEOUT

#: The fixtures of Celery's plugin that ``leader_worker`` reads.
CELERY_FIXTURES = (
    "celery_app",
    "celery_includes",
    "celery_worker_pool",
    "celery_worker_parameters",
)

#: Celery's own pytest plugin, as pytest names it once registered.
CELERY_PLUGIN = "celery.contrib.pytest"
#: Plugins that bring Celery's fixtures themselves: pytest-celery 1.x re-exports them.
BRINGS_CELERY_FIXTURES = (CELERY_PLUGIN, "pytest_celery.plugin")

ERR_NO_CELERY_PLUGIN = (
    "leader_worker needs Celery's pytest fixtures (the plugin celery.contrib.pytest, which "
    "celery-leader enables), but this run keeps them out: drop -p no:celery.contrib.pytest"
)
ERR_NO_RESULT_BACKEND = (
    "leader_worker: the app {name!r} has no result backend: add "
    'app.conf.update(broker_url="memory://", result_backend="cache+memory://") '
    "to your conftest.py, before any test uses the app"
)
ERR_NO_LEADER_TASK = (
    "leader_worker: the app of the celery_app fixture ({name!r}) has no leader-only task: "
    "define a celery_app fixture in your conftest.py that returns your app"
)


def _celery_fixtures_present(pluginmanager: pytest.PytestPluginManager) -> bool:
    """True when a registered plugin brings Celery's fixtures (Celery's own, or pytest-celery)."""
    if pluginmanager.get_plugin(CELERY_PLUGIN) is not None:
        return True
    return any(
        getattr(plugin, "__name__", None) in BRINGS_CELERY_FIXTURES
        for plugin in pluginmanager.get_plugins()
    )


def enable_celery_fixtures(pluginmanager: pytest.PytestPluginManager) -> bool:
    """Register ``celery.contrib.pytest`` unless it is blocked or its fixtures are there.

    Returns True when it registered it. ``import_plugin`` marks the module
    for assertion rewriting before importing it, and registers it under the
    name a ``pytest_plugins`` line would, so such a line coming later is a
    no-op rather than a second registration (which would list every Celery
    fixture twice and stop ``pytest --fixtures``).
    """
    if pluginmanager.is_blocked(CELERY_PLUGIN) or _celery_fixtures_present(pluginmanager):
        return False
    pluginmanager.import_plugin(CELERY_PLUGIN)
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """Enable Celery's fixtures before any conftest.py is read.

    By now the plugins of the command line, the environment and the entry
    points are registered (pytest-celery's among them, when active); a
    conftest's own ``pytest_plugins`` line then finds Celery's registered.
    """
    enable_celery_fixtures(early_config.pluginmanager)


def pytest_configure(config: pytest.Config) -> None:
    """The same, when this plugin came in later (a conftest's ``pytest_plugins`` names it)."""
    enable_celery_fixtures(config.pluginmanager)


@pytest.fixture
def leader_lease_token() -> int:
    """The token of the forced lease of ``leader_lease`` (override to choose another)."""
    return 1


@pytest.fixture
def leader_lease(leader_lease_token: int) -> Iterator[Leadership]:
    """Eager runs of leader-only tasks hold a lease with ``leader_lease_token``."""
    with leadership(token=leader_lease_token) as lease:
        yield lease


@pytest.fixture
def lost_leader_lease(leader_lease: Leadership) -> Leadership:
    """Eager runs of leader-only tasks see their lease lost."""
    leader_lease.lose()
    return leader_lease


@pytest.fixture
def leader_worker(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A worker in the test process that holds the lease (see the module docstring)."""
    # Looked up here, not as arguments: a missing plugin then gets one line saying what to
    # add, not pytest's "fixture not found" with the list of every fixture.
    try:
        app, includes, pool, parameters = (request.getfixturevalue(n) for n in CELERY_FIXTURES)
    except pytest.FixtureLookupError as exc:
        if exc.argname not in CELERY_FIXTURES:
            raise
        pytest.fail(ERR_NO_CELERY_PLUGIN, pytrace=False)
    if not _has_result_backend(app):
        # Every .get() in the test would raise NotImplementedError.
        pytest.fail(ERR_NO_RESULT_BACKEND.format(name=app.main), pytrace=False)
    for module in includes:
        app.loader.import_task_module(module)
    with start_leader_worker(app, pool=pool, **parameters) as worker:
        # Checked once the worker started: it imports the app's task modules (autodiscovery).
        if not any(getattr(task, "leader_only", False) for task in app.tasks.values()):
            pytest.fail(ERR_NO_LEADER_TASK.format(name=app.main), pytrace=False)
        yield worker


def _has_result_backend(app: Any) -> bool:
    backend = app.backend_cls or app.conf.result_backend
    return bool(backend) and str(backend).strip().lower() != "disabled"
