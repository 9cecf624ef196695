"""Metrics and health settings (docs: operations)."""

from celery import Celery

app = Celery("proj", broker="redis://127.0.0.1:6379/0")

# [metrics]
app.conf.leader_metrics_port = 9808  # GET /metrics and GET /healthz on this port
app.conf.leader_metrics_address = "127.0.0.1"  # default 0.0.0.0: every interface
app.conf.leader_beat_metrics_port = 9809  # beat's own, standalone or embedded (-B)
app.conf.leader_health_stuck_after = 60  # seconds a loop may stand still
# [end metrics]
