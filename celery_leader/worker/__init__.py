"""Celery worker glue: bootsteps, leader queue switching, the request gate, revocation."""
