"""The chaos driver: real workers, real servers, faults in a seeded random loop.

Each run starts three ``celery worker`` processes of
tests/integration/leaderapp.py (one reaches the lease store through a
fault-injecting proxy), streams leader-only ``chaos_work`` tasks, and beside
them ``chaos_overlap`` tasks (``overlap="skip"``, one run per account of
three at a time; see below), and keeps injecting faults: SIGKILL,
SIGSTOP-past-the-ttl (of the whole process group, and of the main process
alone) and SIGTERM of the leader, restarting the lease Redis empty, pausing
it past the ttl, cutting one worker off the store (blackhole, drop, delay)
and healing it, slowing that worker's store replies
(each just in time, then held, with the server's scripts flushed), a run
longer than the Redis broker's visibility timeout (the broker delivers it
again while it runs; every other long run stays shorter than the timeout), and
restarting the broker with its messages: the Redis broker with its
append-only file, or a private RabbitMQ node (harness.servers.RabbitMQServer,
never the machine's) with its data dir, so durable queues keep their
persistent messages. The first faults are every kind once, in a seeded
order, so even a short run restarts the broker; then the kinds are drawn at
random from the seed. The history of runs lives in a Redis of its own that
no fault touches; the checker (tests/chaos/checker.py) judges it.

A stalled main process and a slow store (when worker 0 leads) come with a
long run in flight, for the end of the term to stop; the streamed runs are
too short to be caught. A run killed at the end of its term writes no end
row. A :class:`RunWatcher`
thread follows the pid of every started run (its start row carries it) in
/proc every 10 ms and appends a ``gone`` row when the process is gone (a
zombie counts: a stopped parent cannot reap) without the run's end row, so
the checker knows when killed work stopped. The runner also records the
windows in which a worker's whole process group was frozen: a paused leader
is outside the guarantee's assumptions, and only fencing is judged there.

The overlap traffic, light beside the rest: a thread of its own sends a
``chaos_overlap`` message every 0.75 to 2.25 s (``overlap_every`` on
average) for an account of three drawn from the seed, running 0.05 to 0.5 s;
one time in three a second message of the same account right after it, which
arrives while the first runs and is skipped (when a pool process is free for
it then). Its messages take their index from the same count as the others
(one index space: sent and lost count both). ``chaos_overlap`` stores its
results in the history Redis (no other task stores any): at the end the
runner reads the result of each overlap message and adds a ``skip`` row for
each one that reads ``SKIPPED`` (stored before the message is acknowledged),
so the checker counts it skipped, not lost (the rows the workers wrote come
first, the skip rows after them, in history.jsonl too).

With RabbitMQ nothing may be lost: the client publishes with publisher
confirms, so ``send_task`` returns (and the message counts as sent) only
once the broker has taken the message; a publish cut off by a restart
raises and is sent again.
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import redis
from celery import Celery

from celery_leader import install
from celery_leader.elections.procinfo import has_ended
from celery_leader.exceptions import StoreError
from celery_leader.stores import open_store
from harness.cluster import ROOT, TASKS, Worker
from harness.proxy import FaultProxy
from harness.servers import EtcdCluster, RabbitMQServer, RedisServer
from tests.chaos.checker import Freeze, Summary, check

#: The Redis broker's visibility timeout, seconds: above the long runs of three ttls
#: (6 s), so that only the fault made for it outlasts it.
VISIBILITY = 8.0


class RunWatcher:
    """Appends ``gone`` rows to the history for runs whose process died before their end row.

    A thread reads the new history rows and looks at the pid of each run
    that started and has not ended in /proc every *interval* seconds; a pool
    child runs many tasks over its life, so a pid counts as gone for a run
    only while that run is open. Between looks it waits on a pidfd of each
    such process, which wakes it the moment one exits: a handover can start
    the next term's work within 10 ms of the kill, so the time of a death
    must not wait for the next look. When a process is gone, the rows are
    read once more before anything is written: an end row written before
    the process died is certain to be in the history by then. The ``at`` of
    a gone row is the first time the process was seen gone, on the same
    monotonic clock as the rows (CLOCK_MONOTONIC is system-wide on Linux).
    """

    def __init__(self, url: str, interval: float = 0.01) -> None:
        self.client = redis.Redis.from_url(url, decode_responses=True)
        self.interval = interval
        self.read = 0
        self.open: dict[tuple[str, int, int], int] = {}  # (task id, token, pid): open starts
        self.gone = 0
        self._pidfds: dict[int, int] = {}  # pid: pidfd, while the pid has an open run
        self._poller = select.poll()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="run-watcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            woke = self._poller.poll(self.interval * 1000)
            at = time.monotonic()
            exited = {pid for pid, fd in self._pidfds.items() if any(fd == w for w, _ in woke)}
            with suppress(redis.RedisError):  # the history Redis is never faulted; try again
                self.poll(at if woke else None, exited)

    def _ingest(self) -> None:
        new = self.client.lrange("history", self.read, -1)
        self.read += len(new)
        for raw in new:
            row = json.loads(raw)
            if row.get("kind") not in ("start", "end") or row.get("pid") is None:
                continue
            key = (row["task_id"], row["token"], row["pid"])
            count = self.open.get(key, 0) + (1 if row["kind"] == "start" else -1)
            if count > 0:
                self.open[key] = count
            else:
                self.open.pop(key, None)
        pids = {key[2] for key in self.open}
        for pid in pids - self._pidfds.keys():
            with suppress(OSError):  # already reaped: /proc says it is gone
                self._pidfds[pid] = fd = os.pidfd_open(pid)
                self._poller.register(fd, select.POLLIN)
        for pid in self._pidfds.keys() - pids:
            self._forget(pid)

    def _forget(self, pid: int) -> None:
        fd = self._pidfds.pop(pid)
        self._poller.unregister(fd)
        os.close(fd)

    def poll(
        self, woke_at: float | None = None, exited: frozenset[int] | set[int] = frozenset()
    ) -> None:
        """One look: read new rows, then record the open runs whose process is gone.

        *woke_at*: when pidfds woke the thread (the time of a death); *exited*:
        the pids whose pidfd did (gone, whatever a reused pid shows in /proc).
        """
        self._ingest()
        dead = [key for key in self.open if key[2] in exited or has_ended(key[2])]
        if not dead:
            return
        at = time.monotonic() if woke_at is None else woke_at
        self._ingest()  # an end row written before the death is in the history now
        for key in dead:
            for _ in range(self.open.pop(key, 0)):
                task_id, token, pid = key
                row = {"kind": "gone", "task_id": task_id, "token": token, "pid": pid, "at": at}
                self.client.rpush("history", json.dumps(row))
                self.gone += 1
        for pid in {key[2] for key in dead} & self._pidfds.keys():
            if all(key[2] != pid for key in self.open):
                self._forget(pid)

    def settle(self, timeout: float) -> None:
        """Wait up to *timeout* seconds for every open run to end or be gone."""
        deadline = time.monotonic() + timeout
        while self.open and time.monotonic() < deadline:
            time.sleep(0.1)

    def stop(self) -> None:
        """Stop the thread, then take a last look at every open run."""
        self._stop.set()
        self._thread.join(10)
        self.poll()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for pid in list(self._pidfds):
            self._forget(pid)
        self.client.close()


@dataclass
class ChaosConfig:
    seconds: float
    seed: int
    broker: str = "redis"
    ttl: float = 2.0
    send_every: float = 0.15  # with the overlap traffic, most of what the leader (-c 2) runs
    #: Named elections beside the default one: each has a chaos task of its own, the
    #: workers balance them, faults hit the holder of an election drawn from the seed,
    #: and the checker judges each election's history on its own.
    elections: tuple[str, ...] = ()
    #: The lease store: "redis" (one server) or "etcd" (a cluster of three members;
    #: worker 0 reaches the first one alone, through the proxy).
    store: str = "redis"
    #: Mean seconds between two ``chaos_overlap`` messages (0: none are sent).
    overlap_every: float = 1.5
    #: Accounts the overlap messages are drawn from: one overlap key each.
    overlap_accounts: int = 3


class Leading(NamedTuple):
    """A worker that holds an election's lease."""

    slot: int
    worker: Worker
    election: str  # "" for the default election


def _leads(found: Leading) -> str:
    """`` (leads 'a')`` for a named election's holder; nothing for the default one."""
    return f" (leads {found.election!r})" if found.election else ""


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
            self.store: RedisServer | EtcdCluster
            if config.store == "etcd":
                self.store = EtcdCluster(tmp / "store", size=3).start()
                started.callback(self.store.close)
                self.proxy = FaultProxy(self.store.members[0].client_port)
            else:
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
            "LEADER_VISIBILITY": str(VISIBILITY),
            "PYTHONPATH": str(ROOT),
            "LEADER_CHAOS_ELECTIONS": ",".join(config.elections),
        }
        self.workers: dict[int, Worker] = {}
        self.generation = 0
        self.client = Celery("chaos-client", broker=broker_url)
        transport_options: dict[str, object] = {"visibility_timeout": VISIBILITY}
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
        #: Election -> the chaos task of it ("" is the default election).
        self.tasks = {"": f"{TASKS}.chaos_work"} | {
            election: f"{TASKS}.chaos_work_{election}" for election in config.elections
        }
        self.overlap_task = f"{TASKS}.chaos_overlap"  # of the default election
        install(
            self.client,
            tasks={task: election for election, task in self.tasks.items()}
            | {self.overlap_task: ""},
        )
        self.sent = 0
        #: Index -> task id of each overlap message sent (its result says whether it was skipped).
        self.overlap_ids: dict[int, str] = {}
        # The overlap sender's own numbers: the other traffic and the faults stay as they were.
        self.overlap_rng = random.Random(config.seed + 2)
        self._stop = threading.Event()
        self.lease_reader = open_store(self.store.url, timeout=0.5)
        self.freezes: list[Freeze] = []  # whole process groups frozen: fencing alone is judged
        self._send_lock = threading.Lock()
        self.history_client = redis.Redis.from_url(self.history.url, decode_responses=True)
        self.watcher = RunWatcher(self.history.url)

    # -- workers --------------------------------------------------------------

    def start_worker(self, slot: int) -> None:
        self.generation += 1
        env = dict(self.env)
        if slot == 0:  # this one reaches the lease store through the proxy
            if isinstance(self.store, EtcdCluster):
                env["LEADER_STORE"] = f"etcd://127.0.0.1:{self.proxy.port}/{self.store.prefix}"
            else:
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

    def leader(self) -> Leading | None:
        """The holder of an election drawn from the seed (the default one, with no others)."""
        # With the default election alone, no draw: the seed's fault schedule stays as it was.
        election = self.rng.choice(sorted(self.tasks)) if len(self.tasks) > 1 else ""
        lease = f"{self.name}.{election}" if election else self.name
        try:
            record = self.lease_reader.read(lease)
        except StoreError:
            return None
        if record is None:
            return None
        for slot, worker in self.workers.items():
            if worker.nodename == record.nodename and worker.proc.poll() is None:
                return Leading(slot, worker, election)
        return None

    # -- traffic ---------------------------------------------------------------

    def send(self, duration: float, election: str = "") -> int:
        """Send the chaos task of *election* with the next index *i* and return it.

        Raises when the message was not sent (the broker may be restarting).
        """
        with self._send_lock:
            i = self.sent
            self.client.send_task(self.tasks[election], args=(i, duration))
            self.sent += 1
            return i

    def send_overlap(self, account: int, duration: float) -> int:
        """Send ``chaos_overlap`` for *account* with the next index *i* and return it.

        Raises when the message was not sent (the broker may be restarting).
        """
        with self._send_lock:
            i = self.sent
            result = self.client.send_task(self.overlap_task, args=(account, i, duration))
            self.overlap_ids[i] = result.id
            self.sent += 1
            return i

    def _overlap_loop(self) -> None:
        every = self.config.overlap_every
        while not self._stop.is_set():
            account = self.overlap_rng.randrange(self.config.overlap_accounts)
            # One time in three a pair of one account: the second comes while the first runs.
            pair = self.overlap_rng.random() < 1 / 3
            durations = [self.overlap_rng.uniform(0.05, 0.5) for _ in range(1 + pair)]
            try:
                for duration in durations:
                    self.send_overlap(account, duration)
            except Exception:  # noqa: BLE001 - the broker may be restarting: not sent, retry
                time.sleep(0.2)
                continue
            self._stop.wait(self.overlap_rng.uniform(0.5 * every, 1.5 * every))

    def skips(self, client: redis.Redis) -> list[dict[str, Any]]:
        """A ``skip`` row per overlap message whose result reads SKIPPED (see the checker)."""
        with self._send_lock:
            sent = sorted(self.overlap_ids.items())
        found = []
        for start in range(0, len(sent), 500):
            batch = sent[start : start + 500]
            metas = client.mget([f"celery-task-meta-{task_id}" for _, task_id in batch])
            for (i, task_id), raw in zip(batch, metas, strict=True):
                meta = json.loads(raw) if raw else {}
                if meta.get("status") == "SKIPPED":
                    result = meta.get("result") or {}
                    found.append(
                        {
                            "kind": "skip",
                            "i": i,
                            "task_id": task_id,
                            "overlap_key": result.get("key"),
                            "reason": result.get("reason"),
                            "date_done": meta.get("date_done"),
                        }
                    )
        return found

    def _send_loop(self) -> None:
        while not self._stop.is_set():
            duration = self.send_rng.uniform(0.02, 0.2)
            election = self.send_rng.choice(sorted(self.tasks)) if len(self.tasks) > 1 else ""
            try:
                self.send(duration, election)
            except Exception:  # noqa: BLE001 - the broker may be restarting: not sent, retry
                time.sleep(0.2)
                continue
            self._stop.wait(self.config.send_every)

    def long_run(self, seconds: float | None = None, election: str = "") -> str:
        """Send a run of three ttls and wait (6 s at most) until it starts; what happened.

        The faults that stop a leader's work from inside its worker (a stalled
        main process, a slow store) put one in flight first: the ordinary
        runs are too short to be caught by the end of a term.
        """
        try:
            i = self.send(self.config.ttl * 3 if seconds is None else seconds, election)
        except Exception:  # noqa: BLE001 - the broker may be restarting
            return "no long run in flight (not sent)"
        # Up to 6 s: the queue holds the ordinary and the overlap traffic ahead of it.
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            for raw in self.history_client.lrange("history", -200, -1):
                row = json.loads(raw)
                if row["kind"] == "start" and row.get("i") == i:
                    worker = row["worker"].split("@", 1)[0]
                    return f"long run i={i} in flight in {worker} pid {row['pid']}"
            time.sleep(0.05)
        return f"long run i={i} not started yet"

    # -- faults ---------------------------------------------------------------

    def fault_outlast_visibility(self) -> str:
        """A run longer than the Redis broker's visibility timeout, on purpose.

        The broker delivers its message again while it runs; the leader must
        not start the copy beside it (the checker's "run again while it ran").
        The other long runs (three ttls) stay shorter than the timeout.
        """
        run = self.long_run(VISIBILITY + 2.0)
        return f"{run}, longer than the visibility timeout ({VISIBILITY:g} s)"

    def fault_kill_leader(self) -> str:
        found = self.leader()
        if not found:
            return "no leader to kill"
        found.worker.signal(signal.SIGKILL)
        return f"SIGKILL {found.worker.nodename}{_leads(found)}"

    def fault_freeze_leader(self) -> str:
        found = self.leader()
        if not found:
            return "no leader to freeze"
        frozen_at = time.monotonic()
        found.worker.signal(signal.SIGSTOP)  # the process group: main, pool, run watchdog
        time.sleep(self.config.ttl + self.rng.uniform(0.5, 2.0))
        found.worker.signal(signal.SIGCONT)
        self.freezes.append(Freeze(found.worker.nodename, frozen_at, time.monotonic()))
        return f"SIGSTOP {found.worker.nodename}{_leads(found)} past the ttl, then SIGCONT"

    def fault_stall_leader_parent(self) -> str:
        found = self.leader()
        if not found:
            return "no leader to stall"
        worker = found.worker
        hold = self.config.ttl + self.rng.uniform(0.5, 2.0)
        run = self.long_run(election=found.election)
        with suppress(ProcessLookupError):
            os.kill(worker.proc.pid, signal.SIGSTOP)  # the main process alone: children run on
        try:
            time.sleep(hold)
        finally:
            with suppress(ProcessLookupError):
                os.kill(worker.proc.pid, signal.SIGCONT)
        return (
            f"SIGSTOP of {worker.nodename}'s main process alone for {hold:.2f} s, then SIGCONT "
            f"({run})"
        )

    def fault_term_leader(self) -> str:
        found = self.leader()
        if not found:
            return "no leader to stop"
        found.worker.proc.send_signal(signal.SIGTERM)
        return f"SIGTERM {found.worker.nodename}{_leads(found)}"

    def fault_restart_store(self) -> str:
        self.store.restart_empty()
        if isinstance(self.store, EtcdCluster):
            return "etcd cluster recreated empty (a new cluster id)"
        return "lease Redis restarted empty"

    def fault_pause_store(self) -> str:
        if isinstance(self.store, EtcdCluster):
            return self._pause_etcd(self.store)
        self.store.pause()
        time.sleep(self.config.ttl + self.rng.uniform(0.5, 1.5))
        self.store.resume()
        return "lease Redis paused past the ttl"

    def _pause_etcd(self, cluster: EtcdCluster) -> str:
        """Every member paused past the ttl: an outage of the whole store."""
        for member in cluster.members:
            member.pause()
        time.sleep(self.config.ttl + self.rng.uniform(0.5, 1.5))
        for member in cluster.members:
            member.resume()
        return "every etcd member paused past the ttl"

    def fault_kill_etcd_leader(self) -> str:
        """etcd's leader member SIGKILLed and restarted: the workers go on through the others."""
        assert isinstance(self.store, EtcdCluster)
        leader = self.store.leader()
        if leader is None:
            return "etcd has no leader member to kill"
        leader.kill()
        time.sleep(self.rng.uniform(0.5, 1.5))
        leader.restart()
        return f"etcd leader member :{leader.client_port} killed, restarted"

    def fault_cut_network(self) -> str:
        mode = self.rng.choice(["blackhole", "drop", "delay"])
        self.proxy.set_mode(mode, delay=self.config.ttl / 2)
        time.sleep(self.config.ttl + self.rng.uniform(0.5, 1.5))
        self.proxy.set_mode("pass")
        return f"worker 0 cut off the lease store ({mode}), then healed"

    def fault_slow_store(self) -> str:
        # Right after the next reply (a renewal, when worker 0 leads), every
        # reply is late by just under the client's read timeout (op_timeout / 2,
        # op_timeout = renew / 2 = ttl / 6 by default) and the fourth on a
        # connection is held; the flushed scripts add the NOSCRIPT round trip.
        read_timeout = self.config.ttl / 12
        delay = self.rng.uniform(0.7, 0.95) * read_timeout
        hold = self.config.ttl + self.rng.uniform(0.5, 1.5)
        found = self.leader()
        leads = found is not None and found.slot == 0
        run = (
            self.long_run(election=found.election)
            if found is not None and leads
            else "no long run: worker 0 follows"
        )
        self.proxy.after_next_reply("trickle", delay=delay, hang_after=3)
        deadline = time.monotonic() + self.config.ttl
        while self.proxy.mode != "trickle" and time.monotonic() < deadline:
            time.sleep(0.001)
        switched = self.proxy.mode == "trickle"
        if isinstance(self.store, RedisServer):
            admin = redis.Redis.from_url(self.store.url, socket_timeout=2)
            with suppress(redis.RedisError), admin:  # the store may be restarting: no flush
                admin.script_flush()
        if switched:
            time.sleep(hold)
        else:
            self.proxy.after_next_reply("pass")  # never switched: disarm
        self.proxy.set_mode("pass")
        role = "leader" if leads else "follower"
        if not switched:
            return f"worker 0 ({role}) never got a store reply to slow"
        flushed = ", scripts flushed" if isinstance(self.store, RedisServer) else ""
        return (
            f"worker 0 ({role}) store replies {delay * 1000:.0f} ms late, the 4th held"
            f"{flushed}, for {hold:.2f} s ({run})"
        )

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
            self.fault_stall_leader_parent,
            self.fault_term_leader,
            self.fault_restart_store,
            self.fault_pause_store,
            self.fault_cut_network,
            self.fault_slow_store,
            self.fault_restart_broker,
            self.fault_outlast_visibility,
        ]
        if isinstance(self.store, EtcdCluster):
            faults.append(self.fault_kill_etcd_leader)
        elections = ", ".join(["default", *self.config.elections])
        self.log(
            f"chaos: seed {self.config.seed}, broker {self.config.broker}, "
            f"store {self.config.store}, "
            f"ttl {self.config.ttl:g} s, {self.config.seconds:g} s of faults, "
            f"elections: {elections}"
        )
        self.ensure_workers()
        for worker in self.workers.values():
            worker.wait_ready(60)
        self.watcher.start()
        sender = threading.Thread(target=self._send_loop, daemon=True)
        sender.start()
        senders = [sender]
        if self.config.overlap_every > 0:
            senders.append(threading.Thread(target=self._overlap_loop, daemon=True))
            senders[-1].start()
        # Every kind once first, so a short run sees each (the broker restart
        # included); the order and the rest still come from the seed alone.
        first = self.rng.sample(faults, len(faults))
        started = time.monotonic()
        try:
            while first or time.monotonic() - started < self.config.seconds:
                time.sleep(self.rng.uniform(1.0, 3.0))
                fault = first.pop(0) if first else self.rng.choice(faults)
                began = time.monotonic()
                what = fault()
                self.log(
                    f"  [{began - started:6.1f}s] {what} "
                    f"(monotonic {began:.3f} to {time.monotonic():.3f})"
                )
                time.sleep(self.rng.uniform(0.5, 1.5))
                self.ensure_workers()
        finally:
            self._stop.set()
            for thread in senders:
                thread.join(10)
            self.proxy.set_mode("pass")
        self.ensure_workers()
        # Let every sent message run: a dead worker's unacked ones come back
        # after visibility_timeout (Redis broker) or at once (RabbitMQ).
        client = redis.Redis.from_url(self.history.url, decode_responses=True)
        deadline, last_progress, seen = time.monotonic() + 90, time.monotonic(), -1
        while time.monotonic() < deadline and time.monotonic() - last_progress < 15:
            done = {r["i"] for r in self.rows(client) if r["kind"] == "start"}
            done |= {r["i"] for r in self.skips(client)}  # skipped: they never start
            if done >= set(range(self.sent)):
                break
            if len(done) != seen:
                seen, last_progress = len(done), time.monotonic()
            time.sleep(0.5)
        time.sleep(1.0)  # the last runs' rows, and the watcher's reading of them
        # The last look at every run's pid, before close() kills the workers.
        self.watcher.settle(10)
        self.watcher.stop()
        rows = self.rows(client) + self.skips(client)
        with open(self.tmp / "history.jsonl", "w") as out:  # kept for a post-mortem
            out.writelines(json.dumps(row) + "\n" for row in rows)
        summary = check(rows, self.sent, self.freezes)
        client.close()
        return summary

    @staticmethod
    def rows(client: redis.Redis) -> list[dict]:
        return [json.loads(x) for x in client.lrange("history", 0, -1)]

    def close(self) -> None:
        try:
            for worker in self.workers.values():
                worker.signal(signal.SIGCONT)
                worker.signal(signal.SIGKILL)
            for worker in self.workers.values():
                worker.proc.wait(10)
            self.watcher.close()
            self.history_client.close()
            self.client.close()
            self.lease_reader.close()
            self.proxy.close()
        finally:  # whatever failed above, no server (a RabbitMQ node least of all) outlives us
            for server in (self.history, self.broker):
                server.stop()
            if isinstance(self.store, EtcdCluster):
                self.store.close()
            else:
                self.store.stop()


def run_chaos(config: ChaosConfig, tmp: Path, log: Callable[[str], None] = print) -> Summary:
    """Run one chaos session and return the checker's summary (also logged)."""
    chaos = ChaosRun(config, tmp, log)
    try:
        summary = chaos.run()
    finally:
        chaos.close()
    log(summary.table())
    return summary
