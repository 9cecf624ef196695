# settings.py
CELERY_BROKER_URL = "redis://127.0.0.1:6379/0"
CELERY_LEADER_BACKEND_URL = "redis://127.0.0.1:6379/1"
CELERY_LEADER_LEASE_TTL = 10
CELERY_BEAT_SCHEDULER = "celery_leader.beat:LeaderScheduler"
CELERY_LEADER_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
