"""The ``celery-leader demo`` command and the processes it runs."""
