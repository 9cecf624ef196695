"""The example's Celery project: ``celery -A example_project.proj ...`` finds ``app`` here."""

from __future__ import annotations

from example_project.proj.celery import app

__all__ = ["app"]
