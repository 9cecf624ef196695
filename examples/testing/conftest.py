"""Test settings of the example project: Celery's pytest plugin, on in-memory transports."""

from __future__ import annotations

import pytest
from shop import app

pytest_plugins = ("celery.contrib.pytest",)

# Before any test touches the app: Celery keeps the first backend it made.
app.conf.update(broker_url="memory://", result_backend="cache+memory://")


@pytest.fixture
def celery_app():
    """The project's own app (Celery's fixture would build an empty test app)."""
    return app


@pytest.fixture(scope="session")
def celery_includes() -> list[str]:
    return ["celery.contrib.testing.tasks"]  # the ping task a test worker is checked with
