"""A small Celery project that uses celery-leader: see README.md here."""
