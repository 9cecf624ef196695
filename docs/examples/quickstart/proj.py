from celery import Celery
from celery.utils.log import get_task_logger

from celery_leader import LeaderElection, leader_only

app = Celery("proj", broker="redis://127.0.0.1:6379/0")
app.conf.leader_backend_url = "redis://127.0.0.1:6379/1"  # where the lease lives
app.conf.leader_lease_ttl = 10.0  # seconds
app.steps["worker"].add(LeaderElection)  # the one line that turns it on
# One message at a time per worker process: leader-only tasks are acks_late, and a
# prefetched message would wait on a worker that may lose the lease.
app.conf.worker_prefetch_multiplier = 1
# Redis broker: a dead worker's unacknowledged messages come back only after this
# many seconds (kombu's default is an hour). Keep it above your longest leader task.
app.conf.broker_transport_options = {"visibility_timeout": 600}

logger = get_task_logger(__name__)


@leader_only
@app.task(bind=True, time_limit=300)  # below the visibility timeout
def aggregate(self, day):
    token = self.request.leader_token  # fencing token of the term this run holds
    logger.info("aggregated %s on %s, token %s", day, self.request.hostname, token)
    return token
