# conftest.py
import pytest
from shop import app

# In-memory broker and results for the tests, set before any test uses the app:
# Celery keeps the first connections and result backend it makes.
app.conf.update(broker_url="memory://", result_backend="cache+memory://")


@pytest.fixture
def celery_app():
    return app  # your app: Celery's own celery_app is an empty test app
