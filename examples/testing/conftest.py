"""Test settings of the example project: Celery's pytest plugin, on in-memory transports."""

from __future__ import annotations

import pytest
from shop import app

# Celery's own fixtures, which leader_worker builds on.
pytest_plugins = ("celery.contrib.pytest",)

# Before any test uses the app: Celery keeps the first connections and result backend it makes.
app.conf.update(broker_url="memory://", result_backend="cache+memory://")


@pytest.fixture
def celery_app():
    """The project's own app (Celery's fixture would build an empty test app)."""
    return app
