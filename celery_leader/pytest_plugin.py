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
* ``leader_worker``: a real worker in the test process that leads, built
  on the fixtures of Celery's own plugin (``celery.contrib.pytest``: enable
  it with ``pytest_plugins = ("celery.contrib.pytest",)``): it takes
  ``celery_app`` (and ``celery_includes``, ``celery_worker_pool``,
  ``celery_worker_parameters``) as Celery's ``celery_worker`` does, adds the
  :class:`~celery_leader.LeaderElection` step if the app lacks it, sets the
  in-memory lease store (``memory://``, one per test), starts the worker and
  returns once it leads. Use it instead of ``celery_worker``, not beside it:
  two workers in one process share kombu's hub and break.

Assumptions: :func:`~celery_leader.testing.leadership` changes process-wide
state, so these fixtures are not for tests that run in parallel threads of
one process (pytest-xdist runs processes, which is fine); the in-memory store
lives in one process only.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from celery_leader.testing import Leadership, leadership, reset_memory_stores

#: How long ``leader_worker`` waits for its worker to lead, in seconds.
LEAD_TIMEOUT = 10.0


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
def leader_worker(
    celery_app: Any,
    celery_includes: Any,
    celery_worker_pool: Any,
    celery_worker_parameters: Any,
) -> Iterator[Any]:
    """A worker in the test process that holds the lease (see the module docstring)."""
    from celery.contrib.testing.worker import start_worker  # noqa: PLC0415 - Celery's test kit

    from celery_leader import LeaderElection  # noqa: PLC0415 - keep plugin import light
    from celery_leader.worker.coordinator import current_coordinator  # noqa: PLC0415

    added_step = LeaderElection not in celery_app.steps["worker"]
    if added_step:
        celery_app.steps["worker"].add(LeaderElection)
    previous_url = celery_app.conf.get("leader_backend_url")
    # One store per test, and nothing left from the last: no lease outlives its test.
    reset_memory_stores()
    celery_app.conf.leader_backend_url = f"memory://{uuid.uuid4().hex}"
    for module in celery_includes:
        celery_app.loader.import_task_module(module)
    coordinator = None
    try:
        with start_worker(
            celery_app, pool=celery_worker_pool, **celery_worker_parameters
        ) as worker:
            coordinator = current_coordinator()
            if coordinator is None or not coordinator.manager.wait_for_leadership(LEAD_TIMEOUT):
                raise RuntimeError(f"the test worker did not lead within {LEAD_TIMEOUT:g} s")
            yield worker
    finally:
        # The app and the process as they were: the next test starts clean.
        if coordinator is not None:
            coordinator.uninstall()
        celery_app.conf.leader_backend_url = previous_url
        if added_step:
            celery_app.steps["worker"].discard(LeaderElection)
        reset_memory_stores()
