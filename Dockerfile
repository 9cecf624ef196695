# The example project (example_project/) with celery-leader installed from this
# checkout. One image for the workers, beats and Flower of docker-compose.yml.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONPATH=/app

WORKDIR /app

# Only what the image needs (not .venv, node_modules or tests): the package,
# its metadata, and the example project.
COPY pyproject.toml README.md ./
COPY celery_leader ./celery_leader
COPY example_project ./example_project

RUN pip install -e ".[azure]" flower \
    && useradd --create-home --uid 1000 proj \
    && chown -R proj /app

USER proj

CMD ["celery", "-A", "example_project.proj", "worker", "-l", "info"]
