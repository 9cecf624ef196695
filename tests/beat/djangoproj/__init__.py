"""A small Django project with django-celery-beat, configured from the environment."""
