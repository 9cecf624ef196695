"""Test settings of the example project: the project's app, on in-memory transports.

celery-leader's pytest plugin enables Celery's (``celery.contrib.pytest``), whose
fixtures ``leader_worker`` builds on: no ``pytest_plugins`` line.
"""

from __future__ import annotations

import pytest
from shop import app

# Before any test uses the app: Celery keeps the first connections and result backend it makes.
app.conf.update(broker_url="memory://", result_backend="cache+memory://")


@pytest.fixture
def celery_app():
    """The project's own app (Celery's fixture would build an empty test app)."""
    return app
