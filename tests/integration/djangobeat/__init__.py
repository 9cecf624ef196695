"""A small Django project running django-celery-beat under celery-leader, for the beat tests."""
