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
  of Celery's own plugin (``celery.contrib.pytest``: enable it with
  ``pytest_plugins = ("celery.contrib.pytest",)``): it runs the app that
  ``celery_app`` returns (override it to return your app), imports
  ``celery_includes`` and passes ``celery_worker_pool`` and
  ``celery_worker_parameters`` as Celery's ``celery_worker`` does, runs the
  election on the in-memory lease store (``memory://``, one per test) and
  returns once the worker leads. It needs no ping task, and on the
  in-memory broker its teardown takes well under a second. It stops the
  test with one line saying what to add when Celery's fixtures are
  missing, when the app has no result backend, or when the app has no
  leader-only task (Celery's empty test app, ``celery_app`` not
  overridden). Use it instead of ``celery_worker``, not beside it: two
  workers in one process share kombu's hub and break.

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

ERR_NO_CELERY_PLUGIN = (
    "leader_worker needs Celery's pytest fixtures: add "
    'pytest_plugins = ("celery.contrib.pytest",) to your conftest.py'
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
