"""The chaos driver: real workers, real servers, faults in a seeded random loop.

Each run starts three ``celery worker`` processes of
tests/integration/leaderapp.py (one reaches the lease store through a
fault-injecting proxy), streams leader-only ``chaos_work`` tasks, and keeps
injecting faults: SIGKILL, SIGSTOP-past-the-ttl and SIGTERM of the leader,
restarting the lease Redis empty, pausing it past the ttl, cutting one
worker off the store (blackhole) and healing it, and restarting the broker
with its messages: the Redis broker with its append-only file, or a private
RabbitMQ node (tests.servers.RabbitMQServer, never the machine's) with its
data dir, so durable queues keep their persistent messages. The first faults
are every kind once, in a seeded order, so even a short run restarts the
broker; then the kinds are drawn at random from the seed. The history of
runs lives in a Redis of its own that no fault touches; the checker
(tests/chaos/checker.py) judges it.

With RabbitMQ nothing may be lost: the client publishes with publisher
confirms, so ``send_task`` returns (and the message counts as sent) only
once the broker has taken the message; a publish cut off by a restart
raises and is sent again.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import redis
from celery import Celery

from celery_leader import install
from celery_leader.exceptions import StoreError
from celery_leader.stores import open_store
from tests.chaos.checker import Summary, check
from tests.chaos.proxy import FaultProxy
from tests.integration.conftest import ROOT, TASKS, Worker
from tests.servers import RabbitMQServer, RedisServer


@dataclass
class ChaosConfig:
    seconds: float
    seed: int
    broker: str = "redis"
    ttl: float = 2.0
    send_every: float = 0.15  # about a third of what the leader (-c 2) can run


class ChaosRun:
    def __init__(self, config: ChaosConfig, tmp: Path, log: Callable[[str], None]) -> None:
        self.config, self.tmp, self.log = config, tmp, log
        self.rng = random.Random(config.seed)
        # The sender thread draws its own numbers: sharing self.rng would make
        # the fault schedule depend on thread timing, not on the seed alone.
        self.send_rng = random.Random(config.seed + 1)
        for sub in ("history", "broker", "store", "workers"):
            (tmp / sub).mkdir(parents=True, exist_ok=True)
        # close() cannot run on a half-built run: stop what started if a
        # later server fails (a stray RabbitMQ node would outlive the test).
        with ExitStack() as started:
            self.broker: RedisServer | RabbitMQServer
            if config.broker == "rabbitmq":
                self.broker = RabbitMQServer(tmp / "broker").start()
            else:
                self.broker = RedisServer(
                    tmp / "broker", extra=["--appendonly", "yes", "--appendfsync", "always"]
                ).start()
            started.callback(self.broker.stop)
            self.history = RedisServer(tmp / "history").start()
            started.callback(self.history.stop)
            self.store = RedisServer(tmp / "store").start()
            started.callback(self.store.stop)
            self.proxy = FaultProxy(self.store.port)
            started.pop_all()
        self.name = f"chaos{uuid.uuid4().hex[:8]}"
        broker_url = self.broker.url
        self.env = {
            **os.environ,
            "LEADER_BROKER": broker_url,
            "LEADER_STORE": self.store.url,
            "LEADER_HISTORY": self.history.url,
            "LEADER_NAME": self.name,
            "LEADER_TTL": str(config.ttl),
            "LEADER_VISIBILITY": "4",
            "PYTHONPATH": str(ROOT),
        }
        self.workers: dict[int, Worker] = {}
        self.generation = 0
        self.client = Celery("chaos-client", broker=broker_url)
        transport_options: dict[str, object] = {"visibility_timeout": 4}
        if config.broker == "rabbitmq":
            # Without confirms, basic.publish returns once the bytes are in
            # the socket: a message published just before the broker goes
            # down would count as sent and never arrive. With them,
            # send_task returns only after the broker's ack (for a
            # persistent message to a durable queue: once it is on disk),
            # and an unconfirmed publish raises, so the loop sends it again.
            transport_options["confirm_publish"] = True
        self.client.conf.update(
            leader_name=self.name,
            task_default_queue=f"{self.name}.default",
            broker_transport_options=transport_options,
            broker_connection_retry=True,
        )
        install(self.client, tasks=[f"{TASKS}.chaos_work"])
        self.sent = 0
        self._stop = threading.Event()
        self.lease_reader = open_store(self.store.url, timeout=0.5)

    # -- workers --------------------------------------------------------------

    def start_worker(self, slot: int) -> None:
        self.generation += 1
        env = dict(self.env)
        if slot == 0:  # this one reaches the lease store through the proxy
            env["LEADER_STORE"] = f"redis://127.0.0.1:{self.proxy.port}/0"
        worker = Worker(
            env,
            f"w{slot}g{self.generation}@{self.name}",
            self.tmp / "workers",
            "prefork",
            ["-c", "2"],
        )
        self.workers[slot] = worker

    def ensure_workers(self) -> None:
        for slot in range(3):
            worker = self.workers.get(slot)
            if worker is None or worker.proc.poll() is not None:
                self.start_worker(slot)

    def leader(self) -> tuple[int, Worker] | None:
        try:
            record = self.lease_reader.read(self.name)
        except StoreError:
            return None
        if record is None:
            return None
        for slot, worker in self.workers.items():
            if worker.nodename == record.nodename and worker.proc.poll() is None:
                return slot, worker
        return None

    # -- traffic ---------------------------------------------------------------

    def _send_loop(self) -> None:
        while not self._stop.is_set():
            duration = self.send_rng.uniform(0.02, 0.2)
            try:
                self.client.send_task(f"{TASKS}.chaos_work", args=(self.sent, duration))
            except Exception:  # noqa: BLE001 - the broker may be restarting: not sent, retry
                time.sleep(0.2)
                continue
            self.sent += 1
            self._stop.wait(self.config.send_every)

    # -- faults ---------------------------------------------------------------

    def fault_kill_leader(self) -> str:
        found = self.leader()
        if not found:
            return "no leader to kill"
        found[1].signal(signal.SIGKILL)
        return f"SIGKILL {found[1].nodename}"

    def fault_freeze_leader(self) -> str:
        found = self.leader()
        if not found:
            return "no leader to freeze"
        found[1].signal(signal.SIGSTOP)
        time.sleep(self.config.ttl + self.rng.uniform(0.5, 2.0))
        found[1].signal(signal.SIGCONT)
        return f"SIGSTOP {found[1].nodename} past the ttl, then SIGCONT"

    def fault_term_leader(self) -> str:
        found = self.leader()
        if not found:
            return "no leader to stop"
        found[1].proc.send_signal(signal.SIGTERM)
        return f"SIGTERM {found[1].nodename}"

    def fault_restart_store(self) -> str:
        self.store.restart_empty()
        return "lease Redis restarted empty"

    def fault_pause_store(self) -> str:
        self.store.pause()
        time.sleep(self.config.ttl + self.rng.uniform(0.5, 1.5))
        self.store.resume()
        return "lease Redis paused past the ttl"

    def fault_cut_network(self) -> str:
        mode = self.rng.choice(["blackhole", "drop", "delay"])
        self.proxy.set_mode(mode, delay=self.config.ttl / 2)
        time.sleep(self.config.ttl + self.rng.uniform(0.5, 1.5))
        self.proxy.set_mode("pass")
        return f"worker 0 cut off the lease store ({mode}), then healed"

    def fault_restart_broker(self) -> str:
        if isinstance(self.broker, RabbitMQServer):
            self.broker.restart()  # same data dir: durable queues keep their messages
            return "RabbitMQ broker restarted"
        self.broker.restart_empty()  # appendonly: it comes back with its messages
        return "Redis broker restarted"

    def run(self) -> Summary:
        faults = [
            self.fault_kill_leader,
            self.fault_freeze_leader,
            self.fault_term_leader,
            self.fault_restart_store,
            self.fault_pause_store,
            self.fault_cut_network,
            self.fault_restart_broker,
        ]
        self.log(
            f"chaos: seed {self.config.seed}, broker {self.config.broker}, "
            f"ttl {self.config.ttl:g} s, {self.config.seconds:g} s of faults"
        )
        self.ensure_workers()
        for worker in self.workers.values():
            worker.wait_ready(60)
        sender = threading.Thread(target=self._send_loop, daemon=True)
        sender.start()
        # Every kind once first, so a short run sees each (the broker restart
        # included); the order and the rest still come from the seed alone.
        first = self.rng.sample(faults, len(faults))
        started = time.monotonic()
        try:
            while time.monotonic() - started < self.config.seconds:
                time.sleep(self.rng.uniform(1.0, 3.0))
                fault = first.pop(0) if first else self.rng.choice(faults)
                what = fault()
                self.log(f"  [{time.monotonic() - started:6.1f}s] {what}")
                time.sleep(self.rng.uniform(0.5, 1.5))
                self.ensure_workers()
        finally:
            self._stop.set()
            sender.join(10)
            self.proxy.set_mode("pass")
        self.ensure_workers()
        # Let every sent message run: a dead worker's unacked ones come back
        # after visibility_timeout (Redis broker) or at once (RabbitMQ).
        client = redis.Redis.from_url(self.history.url, decode_responses=True)
        deadline, last_progress, seen = time.monotonic() + 90, time.monotonic(), -1
        while time.monotonic() < deadline and time.monotonic() - last_progress < 15:
            done = {r["i"] for r in self.rows(client) if r["kind"] == "start"}
            if done >= set(range(self.sent)):
                break
            if len(done) != seen:
                seen, last_progress = len(done), time.monotonic()
            time.sleep(0.5)
        time.sleep(1.0)
        summary = check(self.rows(client), self.sent)
        client.close()
        return summary

    @staticmethod
    def rows(client: redis.Redis) -> list[dict]:
        import json

        return [json.loads(x) for x in client.lrange("history", 0, -1)]

    def close(self) -> None:
        try:
            for worker in self.workers.values():
                worker.signal(signal.SIGCONT)
                worker.signal(signal.SIGKILL)
            for worker in self.workers.values():
                worker.proc.wait(10)
            self.client.close()
            self.lease_reader.close()
            self.proxy.close()
        finally:  # whatever failed above, no server (a RabbitMQ node least of all) outlives us
            for server in (self.history, self.broker, self.store):
                server.stop()


def run_chaos(config: ChaosConfig, tmp: Path, log: Callable[[str], None] = print) -> Summary:
    """Run one chaos session and return the checker's summary (also logged)."""
    chaos = ChaosRun(config, tmp, log)
    try:
        summary = chaos.run()
    finally:
        chaos.close()
    log(summary.table())
    return summary
