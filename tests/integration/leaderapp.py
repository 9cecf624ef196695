"""The Celery app the integration tests run real workers of.

Configured from the environment so one module serves every test:
LEADER_BROKER, LEADER_STORE, LEADER_HISTORY (a Redis URL where runs are
recorded), LEADER_TTL, LEADER_RENEW and LEADER_STORE_TIMEOUT (optional),
LEADER_VISIBILITY (the broker's visibility_timeout, seconds: Redis, SQS),
LEADER_TRANSPORT_OPTIONS (JSON: more broker transport options, such as an
SQS server's region), LEADER_FAST_FAILOVER (any value: leader_fast_failover on).
LEADER_NAME names the election and prefixes the queues, so tests sharing one
RabbitMQ never see each other's messages.
"""

from __future__ import annotations

import json
import os
import signal
import time

import redis
from celery import Celery, Task, shared_task
from celery.worker.control import control_command

from celery_leader import LeaderElection, check_leadership, leader_only, lease_lost, signals
from celery_leader.fencing import RedisFence

app = Celery("leaderapp", broker=os.environ.get("LEADER_BROKER", "redis://127.0.0.1:6379/0"))
app.conf.leader_name = os.environ.get("LEADER_NAME", "leaderapp")
app.conf.leader_backend_url = os.environ.get("LEADER_STORE", app.conf.broker_url)
app.conf.leader_lease_ttl = float(os.environ.get("LEADER_TTL", "3"))
if os.environ.get("LEADER_RENEW"):
    app.conf.leader_renew_interval = float(os.environ["LEADER_RENEW"])
if os.environ.get("LEADER_FAST_FAILOVER"):
    app.conf.leader_fast_failover = True
if os.environ.get("LEADER_STORE_TIMEOUT"):
    app.conf.leader_store_timeout = float(os.environ["LEADER_STORE_TIMEOUT"])
_visibility = float(os.environ.get("LEADER_VISIBILITY", "30"))
app.conf.broker_transport_options = {
    # whole seconds as an int: kombu's SQS transport before 5.7 sends "2.0", which SQS refuses
    "visibility_timeout": int(_visibility) if _visibility.is_integer() else _visibility,
    "unacked_restore_interval": 1,
    "unacked_restore_throttle": 1,
    **json.loads(os.environ.get("LEADER_TRANSPORT_OPTIONS") or "{}"),
}
app.conf.worker_prefetch_multiplier = 1
app.conf.task_default_queue = f"{app.conf.leader_name}.default"
app.conf.broker_connection_retry_on_startup = True
app.conf.worker_hijack_root_logger = False
app.steps["worker"].add(LeaderElection)
if os.environ.get("LEADER_RESULTS"):
    app.conf.result_backend = os.environ["LEADER_RESULTS"]
fence = RedisFence(
    redis.Redis.from_url(os.environ.get("LEADER_HISTORY", "redis://127.0.0.1:6379/15"))
)

_history: redis.Redis | None = None


def history() -> redis.Redis:
    global _history  # noqa: PLW0603 - one client per (forked) process
    if _history is None or _history.connection_pool.pid != os.getpid():
        _history = redis.Redis.from_url(os.environ["LEADER_HISTORY"], decode_responses=True)
    return _history


def record(kind: str, task, **fields) -> None:  # type: ignore[no-untyped-def]
    row = {
        "kind": kind,
        "task_id": task.request.id,
        "worker": task.request.hostname,
        "token": getattr(task.request, "leader_token", None),
        "occurrence": getattr(task.request, "leader_occurrence", "no attribute"),
        "at": time.monotonic(),
        "wall": time.time(),
        **fields,
    }
    history().rpush("history", json.dumps(row))


@leader_only
@app.task(bind=True)
def leader_record(self, i):
    # The pool child's pid: a run killed at its term's end has no end row, and
    # tests.integration.streaming records when its process was gone instead.
    record("start", self, i=i, pid=os.getpid())
    record("end", self, i=i, pid=os.getpid())
    return i


@leader_only
@app.task(bind=True)
def grow_memory(self, tag):
    """Allocate (and touch) 10 MB at a time until the kernel kills the process."""
    record("start", self, tag=tag, pid=os.getpid())
    held = []
    for _ in range(400):
        block = bytearray(10 * 1024 * 1024)
        block[::4096] = b"\x01" * len(range(0, len(block), 4096))
        held.append(block)
    record("end", self, tag=tag)
    return tag


@app.task(bind=True)
def plain_record(self, i):
    record("plain", self, i=i)
    return i


@leader_only(on_loss="terminate")
@app.task(bind=True)
def slow_terminate(self, seconds, tag):
    record("start", self, tag=tag, pid=os.getpid())
    time.sleep(seconds)
    record("end", self, tag=tag)
    return tag


@leader_only(on_loss="cancel")
@shared_task(bind=True)
def slow_cancel(self, seconds, tag):
    record("start", self, tag=tag)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if lease_lost():
            record("saw-loss", self, tag=tag)
            check_leadership()
        time.sleep(0.02)
    record("end", self, tag=tag)
    return tag


@leader_only(on_loss="finish")
@app.task(bind=True)
def slow_finish(self, seconds, tag):
    record("start", self, tag=tag)
    time.sleep(seconds)
    record("end", self, tag=tag)
    return tag


@leader_only(on_loss="finish")
@app.task(bind=True)
def fenced_writer(self, seconds, tag):
    """Runs past a freeze, then writes through the fence: a stale token is refused."""
    record("start", self, tag=tag)
    time.sleep(seconds)
    accepted = fence.set("report", f"report:{tag}", tag, token=self.request.leader_token)
    record("fenced-write", self, tag=tag, accepted=accepted)
    return accepted


@control_command()
def block_loop(state, seconds=5.0, **kwargs):
    """Test-only: block the worker's consumer loop, as a stuck worker would."""
    time.sleep(float(seconds))
    return {"ok": "blocked"}


def _signal_recorder(kind):  # type: ignore[no-untyped-def]
    def receiver(sender, token, name, **kwargs):  # type: ignore[no-untyped-def]
        row = {
            "kind": kind,
            "worker": sender,
            "token": token,
            "name": name,
            "reason": kwargs.get("reason"),
            "at": time.monotonic(),
        }
        history().rpush("history", json.dumps(row))

    return receiver


for _kind, _signal in (
    ("signal-elected", signals.leader_elected),
    ("signal-lost", signals.leader_lost),
    ("signal-released", signals.leader_released),
):
    _signal.connect(_signal_recorder(_kind), weak=False)


def _count(kind):  # type: ignore[no-untyped-def]
    now = time.monotonic()
    pipe = history().pipeline(transaction=False)
    pipe.incr(f"noop-{kind}").setnx(f"noop-{kind}-first", now).set(f"noop-{kind}-last", now)
    pipe.execute()


@leader_only
@app.task(bind=True)
def noop_leader(self):
    _count("leader")


@app.task(bind=True, acks_late=True)  # as leader-only tasks are: compare the gate alone
def noop_plain(self):
    _count("plain")


@leader_only(on_loss="terminate")
@app.task(bind=True)
def long_terminate(self, seconds):
    record("start", self, pid=os.getpid())
    time.sleep(seconds)
    record("end", self)


@leader_only(on_loss="terminate")
@app.task(bind=True)
def gil_terminate(self, seconds, chunk=10**8):
    """Holds the GIL in C calls (sums over a range, about 1 s each) for about *seconds*.

    No Python thread of the child can run during a call.
    """
    record("start", self, pid=os.getpid())
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        sum(range(int(chunk)))
    record("end", self)


@leader_only(on_loss="cancel")
@app.task(bind=True)
def poll_cancel(self, seconds, tag, poll):
    """A cooperative task that looks at its lease only every *poll* seconds."""
    record("start", self, tag=tag, pid=os.getpid())
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(poll)
        if lease_lost():
            record("saw-loss", self, tag=tag)
            check_leadership()
    record("end", self, tag=tag)
    return tag


@app.task(bind=True)
def beat_tick(self, entry="tick"):
    """Sent by beat: records which beat term sent it."""
    row = {
        "kind": "beat",
        "entry": entry,
        "token": self.request.get("leader_beat_token"),
        "occurrence": self.request.leader_occurrence,
        "at": time.monotonic(),
        "wall": time.time(),
        "worker": self.request.hostname,
    }
    history().rpush("history", json.dumps(row))


def _overlap_run(task, seconds, tag, **fields):  # type: ignore[no-untyped-def]
    record("start", task, tag=tag, **fields)
    time.sleep(seconds)
    record("end", task, tag=tag, **fields)
    return tag


@leader_only(overlap="skip")
@app.task(bind=True)
def overlap_skip(self, seconds, tag):
    return _overlap_run(self, seconds, tag)


@leader_only(overlap="buffer_one")
@app.task(bind=True)
def overlap_buffer(self, seconds, tag):
    return _overlap_run(self, seconds, tag)


@leader_only(overlap="buffer_one")
@app.task(bind=True)
def overlap_stubborn(self, seconds, tag):
    """Ignores SIGTERM while it runs (a handled signal): revoke(terminate=True) does not end it."""
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        return _overlap_run(self, seconds, tag)
    finally:
        signal.signal(signal.SIGTERM, previous)


@leader_only(overlap="skip", overlap_key=["account_id"])
@app.task(bind=True)
def overlap_account(self, account_id, seconds=1.0, tag=""):
    return _overlap_run(self, seconds, tag, account=account_id)


@leader_only(overlap="skip")
@app.task(bind=True)
def overlap_retry(self, tag):
    """Retries itself once at once: the retry must wait for this run, never be skipped."""
    record("start", self, tag=tag, retries=self.request.retries)
    if self.request.retries == 0:
        raise self.retry(countdown=0, max_retries=1)
    record("end", self, tag=tag, retries=self.request.retries)
    return tag


@leader_only
@app.task(bind=True)
def occurrence_flaky(self, seconds, tag):
    """Raises on the first run of *tag* (after *seconds*), returns on every later one."""
    record("start", self, tag=tag)
    time.sleep(seconds)
    if history().incr(f"flaky-{tag}") == 1:
        record("raised", self, tag=tag)
        raise RuntimeError(f"first run of {tag} fails")
    record("end", self, tag=tag)
    return tag


@leader_only(acks_late=False)
@app.task(bind=True)
def occurrence_early_ack(self, seconds, tag):
    """A leader task acknowledged as it starts; its first run of a "fail..." *tag* raises."""
    record("start", self, tag=tag)
    time.sleep(seconds)
    if tag.startswith("fail") and history().incr(f"early-{tag}") == 1:
        record("raised", self, tag=tag)
        raise RuntimeError(f"first run of {tag} fails")
    record("end", self, tag=tag)
    return tag


if os.environ.get("LEADER_BEAT_EVERY"):
    app.conf.beat_scheduler = "celery_leader.beat:LeaderScheduler"
    app.conf.leader_beat_scheduler = os.environ.get(
        "LEADER_BEAT_WRAPPED", "celery.beat:PersistentScheduler"
    )
    app.conf.beat_schedule = {
        "tick": {
            "task": os.environ.get("LEADER_BEAT_TASK", "tests.integration.leaderapp.beat_tick"),
            "schedule": float(os.environ["LEADER_BEAT_EVERY"]),
            "args": tuple(json.loads(os.environ.get("LEADER_BEAT_ARGS", '["tick"]'))),
        },
    }
    if os.environ.get("LEADER_BEAT_MISSED"):
        app.conf.leader_beat_missed_default = os.environ["LEADER_BEAT_MISSED"]
    if os.environ.get("LEADER_BEAT_REDIS"):
        app.conf.redbeat_redis_url = os.environ["LEADER_BEAT_REDIS"]
        app.conf.redbeat_key_prefix = f"redbeat-{app.conf.leader_name}:"

if os.environ.get("LEADER_METRICS_PORT"):
    app.conf.leader_metrics_port = int(os.environ["LEADER_METRICS_PORT"])
    app.conf.leader_metrics_address = "127.0.0.1"
if os.environ.get("LEADER_BEAT_METRICS_PORT"):
    app.conf.leader_beat_metrics_port = int(os.environ["LEADER_BEAT_METRICS_PORT"])
    app.conf.leader_metrics_address = "127.0.0.1"
if os.environ.get("LEADER_HEALTH_STUCK_AFTER"):
    app.conf.leader_health_stuck_after = float(os.environ["LEADER_HEALTH_STUCK_AFTER"])


@control_command()
def block_loop_soon(state, seconds=5.0, **kwargs):
    """Test-only: block the consumer's own loop, whatever runs remote control.

    gevent and eventlet read remote control on a loop of its own, so
    block_loop would not hold their consumer's loop; this posts the block
    onto it (a cooperative sleep there holds that loop and nothing else).
    """
    state.consumer.call_soon(lambda: time.sleep(float(seconds)))
    return {"ok": "posted"}


@control_command(args=[("election", str)])
def stop_lease_thread(state, election=None, **kwargs):
    """Test-only: end the lease thread of *election* (the default one unless named), as a
    crash of that thread would."""
    from celery_leader.worker.coordinator import current_coordinator

    coordinator = current_coordinator()
    coordinator.elections[election or None].manager.stop(release=True)
    return {"ok": "stopped"}


def _chaos_body(task, i, seconds, election=""):  # type: ignore[no-untyped-def]
    """Chaos suite work: runs a while, then writes through the fence with its token.

    Every row carries the pool child's pid: the chaos runner watches it, to
    record when a run that never wrote its end row was gone. Rows of a named
    election carry its name, and its writes go through a fence of its own:
    tokens of two elections mean nothing to each other.
    """
    pid = os.getpid()
    tagged = {"election": election} if election else {}
    record("start", task, i=i, pid=pid, **tagged)
    time.sleep(seconds)
    sent_at = time.monotonic()  # a freeze after the fence call must not reorder the write
    resource = f"chaos.{election}" if election else "chaos"
    accepted = fence.admit(resource, task.request.leader_token)
    record("write", task, i=i, accepted=accepted, sent_at=sent_at, pid=pid, **tagged)
    record("end", task, i=i, pid=pid, **tagged)


@leader_only(on_loss="terminate")
@app.task(bind=True)
def chaos_work(self, i, seconds):
    """Chaos suite work of the default election (see _chaos_body)."""
    _chaos_body(self, i, seconds)


def _chaos_task_of(election: str):  # type: ignore[no-untyped-def]
    def work(self, i, seconds):  # type: ignore[no-untyped-def]
        _chaos_body(self, i, seconds, election)

    work.__name__ = f"chaos_work_{election}"
    task = app.task(bind=True, name=f"{__name__}.chaos_work_{election}")(work)
    return leader_only(on_loss="terminate", election=election)(task)


# LEADER_CHAOS_ELECTIONS=a,b: the chaos suite's named elections, one task each
# (chaos_work_a, ...). Unset, the app has the default election only.
for _election in filter(None, os.environ.get("LEADER_CHAOS_ELECTIONS", "").split(",")):
    globals()[f"chaos_work_{_election}"] = _chaos_task_of(_election)


@leader_only(on_loss="terminate")
@app.task(bind=True)
def tear_own_slot(self):
    """Dies as a pool child SIGKILLed mid-write of its run-table slot would.

    It marks its slot "write in progress" (naming itself the writer where
    the layout has that field) and kills itself before the write completes.
    """
    import signal
    import struct

    from celery_leader.elections.run_table import RUN_SLOTS
    from celery_leader.tasks.runtime import shared_lease
    from celery_leader.term_end.in_run import pool_child_index

    table = shared_lease().runs
    offset = pool_child_index() * (len(table._slots) // RUN_SLOTS)
    (seq,) = struct.unpack_from("=q", table._slots, offset)
    record("tear", self, pid=os.getpid())
    struct.pack_into("=q", table._slots, offset + 8, os.getpid())
    struct.pack_into("=q", table._slots, offset, seq + 1 if seq % 2 == 0 else seq + 2)
    os.kill(os.getpid(), signal.SIGKILL)


@leader_only
@app.task(bind=True, max_retries=1)
def retry_later(self, countdown):
    """Retries once after *countdown* seconds: two runs in all, the second under retries=1."""
    record("start", self, retries=self.request.retries)
    if self.request.retries < 1:
        raise self.retry(countdown=countdown)
    record("end", self, retries=self.request.retries)


@leader_only(on_loss="terminate")
@app.task(bind=True, max_retries=1)
def long_retry(self, seconds):
    """Runs *seconds*, then retries once at once: two runs in all, each past the timeout."""
    record("start", self, pid=os.getpid(), retries=self.request.retries)
    time.sleep(seconds)
    if self.request.retries < 1:
        raise self.retry(countdown=0)
    record("end", self)


@leader_only(on_loss="terminate")
@app.task(bind=True, max_retries=1)
def countdown_retry(self, seconds, countdown):
    """Runs *seconds*, then retries once *countdown* seconds later: two runs in all."""
    record("start", self, pid=os.getpid(), retries=self.request.retries)
    if self.request.retries < 1:
        time.sleep(seconds)
        raise self.retry(countdown=countdown)
    record("end", self, retries=self.request.retries)


_history_results = None


class HistoryResults(Task):  # type: ignore[misc]
    """A task whose results go to the history Redis (LEADER_HISTORY), whatever the app's.

    For the chaos suite's overlap task alone: a message the gate skips has
    its SKIPPED result stored there before it is acknowledged, for the
    runner to read. The other chaos tasks store no result (an app-wide
    result backend would slow every run, and change how the worker treats
    a run lost after it stored SUCCESS).
    """

    @property
    def backend(self):  # type: ignore[no-untyped-def]
        global _history_results  # noqa: PLW0603 - one backend per process, made on first use
        if _history_results is None:
            from celery.backends.redis import RedisBackend

            _history_results = RedisBackend(app=app, url=os.environ["LEADER_HISTORY"])
        return _history_results


@leader_only(on_loss="terminate", overlap="skip", overlap_key=["account"])
@app.task(bind=True, base=HistoryResults)
def chaos_overlap(self, account, i, seconds):
    """Chaos suite work with an overlap policy: one run per account at a time.

    As _chaos_body (start, fenced write, end; the pid on every row), and its
    rows carry ``overlap_key``, the key the gate holds it under (task name
    and account, as celery_leader.tasks.overlap forms it): the checker judges
    that no two runs of one key overlap. A message of an account whose run
    goes on is skipped: acknowledged without running, its result SKIPPED in
    the history Redis (HistoryResults), where the chaos runner reads it.
    """
    pid = os.getpid()
    key = {"overlap_key": f"{self.name}[{json.dumps(account)}]", "account": account}
    record("start", self, i=i, pid=pid, **key)
    time.sleep(seconds)
    sent_at = time.monotonic()
    accepted = fence.admit("chaos", self.request.leader_token)
    record("write", self, i=i, accepted=accepted, sent_at=sent_at, pid=pid, **key)
    record("end", self, i=i, pid=pid, **key)
