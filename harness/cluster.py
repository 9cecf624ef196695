"""Real ``celery worker`` and ``celery beat`` processes of the tests' app, for tests and benchmarks.

:class:`Cluster` starts the servers one test needs (a Redis for the broker and
the run history, a Redis for the lease store; for an SQS broker, an
SQS-compatible server too) and ``celery worker`` /
``celery beat`` processes of the test app, configured through the
environment; :class:`Worker` and :class:`Beat` wrap one process each.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import redis
from celery import Celery

from celery_leader import install
from celery_leader.exceptions import StoreError
from celery_leader.settings.names import BEAT_SUFFIX
from celery_leader.stores import open_store
from celery_leader.stores.base import Holder
from harness.servers import RedisServer, SqsServer

ROOT = Path(__file__).resolve().parents[1]
TASKS = "tests.integration.leaderapp"
LEADER_TASKS = (
    "leader_record",
    "grow_memory",
    "slow_terminate",
    "slow_cancel",
    "slow_finish",
    "fenced_writer",
    "noop_leader",
    "long_terminate",
    "gil_terminate",
    "poll_cancel",
    "overlap_skip",
    "overlap_buffer",
    "overlap_account",
    "overlap_retry",
    "overlap_stubborn",
    "retry_later",
    "chaos_work",
)
RABBITMQ_URL = os.environ.get("LEADER_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672//")
RABBITMQCTL = "/usr/sbin/rabbitmqctl"
#: The brokers a Cluster runs its workers on.
BROKERS = ("redis", "rabbitmq", "sqs")


class Worker:
    """One ``celery worker`` process of tests.integration.leaderapp."""

    def __init__(
        self,
        env: dict[str, str],
        nodename: str,
        logdir: Path,
        pool: str,
        extra: list[str],
        app: str = TASKS,
        wrapper: list[str] | None = None,
    ) -> None:
        self.nodename = nodename
        self.log = logdir / f"{nodename.split('@', maxsplit=1)[0]}.log"
        args = [
            *(wrapper or []),  # a command that runs the worker (a profiler, say)
            sys.executable,
            "-m",
            "celery",
            "-A",
            app,
            "worker",
            "-n",
            nodename,
            "-P",
            pool,
            "-l",
            "info",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            *extra,
        ]
        if pool != "solo" and not any(a.startswith("-c") for a in extra):
            args += ["-c", "2"]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                args, cwd=ROOT, env=env, stdout=log, stderr=log, start_new_session=True
            )

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "ready." in self.text():
                return
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"{self.nodename} exited {self.proc.returncode}:\n{self.text()[-3000:]}"
                )
            time.sleep(0.05)
        raise AssertionError(f"{self.nodename} not ready:\n{self.text()[-3000:]}")

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def signal(self, signum: int) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signum) if signum in (
                signal.SIGKILL,
                signal.SIGSTOP,
                signal.SIGCONT,
            ) else self.proc.send_signal(signum)

    def stop(self, timeout: float = 20) -> None:
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.proc.wait(10)


class Beat(Worker):
    """One ``celery beat`` process of tests.integration.leaderapp."""

    def __init__(
        self,
        env: dict[str, str],
        name: str,
        logdir: Path,
        extra: list[str],
        app: str = TASKS,
        wrapper: list[str] | None = None,
    ) -> None:
        self.nodename = name
        self.log = logdir / f"{name}.log"
        args = [
            *(wrapper or []),  # a command that runs beat's (a network namespace's, say)
            sys.executable,
            "-m",
            "celery",
            "-A",
            app,
            "beat",
            "-s",
            str(logdir / f"{name}-schedule"),
            "-l",
            "info",
            *extra,
        ]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                args, cwd=ROOT, env=env, stdout=log, stderr=log, start_new_session=True
            )

    def sends_now(self) -> bool:
        return "this beat sends now" in self.text()


class Cluster:
    """Servers, environment and workers for one test.

    By default it starts its servers on loopback: a Redis for the broker and
    the run history (db 2), a Redis for the lease store. A test may hand it
    servers it started elsewhere (on hosts of harness.netbed, say): *data*
    (the Redis broker), *store* (a Redis lease store) or *store_url* (a lease
    store of any kind, which the test stops; :attr:`store` is None then) and
    *history* (the run history, db 2, apart from the broker so that no fault
    of the broker's reaches it). The cluster stops the Redis servers it was
    given, as its own.
    """

    def __init__(
        self,
        tmp: Path,
        broker: str,
        rabbitmq_url: str = RABBITMQ_URL,
        *,
        visibility: float = 4,
        data: RedisServer | None = None,
        store: RedisServer | None = None,
        store_url: str | None = None,
        history: RedisServer | None = None,
    ) -> None:
        """*broker*: "redis" (the data server), "rabbitmq" (*rabbitmq_url*) or "sqs" (its own
        moto server); *visibility*: the broker's visibility timeout (Redis, SQS), seconds.
        """
        if broker not in BROKERS:
            raise ValueError(f"broker={broker!r}: expected one of {', '.join(BROKERS)}")
        self.tmp = tmp
        self.data = data or RedisServer(tmp).start()  # broker (redis runs) and run history
        # The lease store, separate so it can be paused.
        self.store = store or (RedisServer(tmp).start() if store_url is None else None)
        self.history_server = history or self.data
        self.sqs = SqsServer(tmp).start() if broker == "sqs" else None
        self.name = f"t{uuid.uuid4().hex[:8]}"
        broker_url = {"redis": self.data.url, "rabbitmq": rabbitmq_url}.get(broker, "")
        transport_options: dict[str, object] = {}
        if self.sqs is not None:
            broker_url = self.sqs.url
            transport_options = self.sqs.transport_options()
        self.env = {
            **os.environ,
            "LEADER_BROKER": broker_url,
            "LEADER_STORE": self.store.url if self.store is not None else str(store_url),
            "LEADER_HISTORY": self.history_server.db_url(2),
            "LEADER_NAME": self.name,
            "LEADER_TTL": "2",
            "LEADER_VISIBILITY": f"{visibility:g}",
            "LEADER_TRANSPORT_OPTIONS": json.dumps(transport_options),
            "PYTHONPATH": str(ROOT),
        }
        self.workers: list[Worker] = []
        self.beats: list[Beat] = []
        self.history_client = redis.Redis(
            host=self.history_server.host,
            port=self.history_server.port,
            db=2,
            decode_responses=True,
        )
        self.client = Celery("client", broker=broker_url)
        self.client.conf.update(
            leader_name=self.name,
            task_default_queue=f"{self.name}.default",
            broker_transport_options={"visibility_timeout": visibility, **transport_options},
        )
        install(self.client, tasks=[f"{TASKS}.{name}" for name in LEADER_TASKS])

    def send(self, task: str, *args, **options):  # type: ignore[no-untyped-def]
        """Send a task of leaderapp by name, routed as any client would route it."""
        return self.client.send_task(f"{TASKS}.{task}", args=args, **options)

    def start(
        self,
        count: int,
        pool: str = "prefork",
        extra: list[str] | None = None,
        wait: bool = True,
        *,
        app: str = TASKS,
        env: dict[str, str] | None = None,
        wrapper: list[str] | None = None,
    ) -> list[Worker]:
        """Start *count* workers of *app* (with *env* added to the cluster's environment).

        *wrapper* is a command line that runs each worker's command (``valgrind ...``).
        """
        started = []
        for _ in range(count):
            nodename = f"w{len(self.workers) + 1}@{self.name}"
            worker = Worker(
                {**self.env, **(env or {})}, nodename, self.tmp, pool, extra or [], app, wrapper
            )
            self.workers.append(worker)
            started.append(worker)
        if wait:
            for worker in started:
                worker.wait_ready()
        return started

    def start_beat(
        self,
        extra: list[str] | None = None,
        app: str = TASKS,
        wrapper: list[str] | None = None,
        *,
        env: dict[str, str] | None = None,
    ) -> Beat:
        """Start a ``celery beat`` process of *app* with its own schedule file.

        *wrapper* is a command line that runs beat's command (``ip netns exec ...``);
        *env* is added to the cluster's environment.
        """
        index = len(self.beats) + 1
        beat = Beat(
            {**self.env, **(env or {})}, f"beat{index}", self.tmp, extra or [], app, wrapper
        )
        self.beats.append(beat)
        return beat

    def beat_sends(self) -> list[dict]:
        return sorted((r for r in self.history() if r["kind"] == "beat"), key=lambda r: r["at"])

    def celery(self, *args: str, app: str = TASKS) -> subprocess.CompletedProcess[str]:
        """Run ``celery -A <app> <args>`` (default: leaderapp) against this cluster."""
        return subprocess.run(
            [sys.executable, "-m", "celery", "-A", app, *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    def leader_status(self) -> tuple[int, dict | None]:
        proc = self.celery("leader", "status", "--json")
        return proc.returncode, (json.loads(proc.stdout) if proc.stdout.strip() else None)

    @property
    def beat_election(self) -> str:
        """The name of beat's own election (the workers' name and ``.beat``)."""
        return self.name + BEAT_SUFFIX

    def prime_store(self, *names: str) -> None:
        """Give the lease store a record of an earlier, released term of each of *names*.

        *names* defaults to the workers' election (:attr:`name`); pass
        :attr:`beat_election` too for beats. A store with no record makes the
        first holder wait one ttl before it leads (the hold-off after a store
        lost its data); a worker or beat started on a primed store leads at once.
        """
        store = open_store(self.env["LEADER_STORE"], timeout=2)
        try:
            for name in names or (self.name,):
                holder = Holder.for_this_process("primer")
                if store.acquire(name, holder, ttl=2.0).acquired:
                    store.release(name, holder.lease_id)
        finally:
            store.close()

    def sending_beat(self, timeout: float = 15, after: int = 0) -> tuple[Beat, int]:
        """The live beat that holds beat's lease and sends under it now, and its term's token.

        Sending: its log says "this beat sends now" for the term in the
        store (it read the last sends and took the term over). Only a term
        whose token is above *after* counts.
        """
        deadline = time.monotonic() + timeout
        store = open_store(self.env["LEADER_STORE"], timeout=2)
        try:
            while time.monotonic() < deadline:
                try:
                    record = store.read(self.beat_election)
                except StoreError:
                    record = None
                if record is not None and record.hold_off <= 0 and record.token > after:
                    for beat in self.beats:
                        if (
                            beat.proc.pid == record.pid
                            and beat.proc.poll() is None
                            and f"this beat sends now (token {record.token})" in beat.text()
                        ):
                            return beat, record.token
                time.sleep(0.02)
        finally:
            store.close()
        raise AssertionError("no beat sends")

    def leader_worker(self, timeout: float = 15) -> Worker:
        """The worker holding the lease, past its hold-off, consuming the leader queue."""
        deadline = time.monotonic() + timeout
        options = {}
        if self.env.get("AZURE_STORAGE_CONNECTION_STRING"):
            options["leader_azure_connection_string"] = self.env["AZURE_STORAGE_CONNECTION_STRING"]
        store = open_store(self.env["LEADER_STORE"], timeout=2, options=options)
        try:
            while time.monotonic() < deadline:
                try:
                    record = store.read(self.name)
                except StoreError:
                    record = None
                if record is not None and record.hold_off <= 0:
                    for worker in self.workers:
                        if (
                            worker.nodename == record.nodename
                            and worker.proc.poll() is None
                            and "Started consuming from" in worker.text()
                        ):
                            return worker
                time.sleep(0.05)
        finally:
            store.close()
        raise AssertionError("no leader elected")

    def history(self) -> list[dict]:
        return [json.loads(x) for x in self.history_client.lrange("history", 0, -1)]

    def wait_history(self, predicate, timeout: float) -> list[dict]:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rows = self.history()
            if predicate(rows):
                return rows
            time.sleep(0.05)
        return self.history()

    def close(self) -> None:
        for worker in [*self.workers, *self.beats]:  # all at once: each takes a moment to stop
            if worker.proc.poll() is None:
                worker.signal(signal.SIGCONT)
                worker.proc.send_signal(signal.SIGTERM)
        for process in [*self.workers, *self.beats]:
            process.stop()
        self.client.close()
        self.history_client.close()
        servers = [self.data, self.history_server, *([self.store] if self.store else [])]
        for server in {id(s): s for s in servers}.values():  # the history may be the broker's
            server.stop()
        if self.sqs is not None:
            self.sqs.stop()
