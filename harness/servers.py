"""Real servers for tests: redis-server processes on free loopback ports.

Each server is a real process the test owns, so tests can kill, pause
(SIGSTOP), resume and restart it empty. ``RabbitMQServer`` is a private
RabbitMQ node on free ports that tests can stop and restart with its data,
without touching the machine's shared RabbitMQ. ``EtcdCluster`` is one or
three etcd members whose leader tests can kill, and which can lose all data.
``SqsServer`` is an SQS-compatible server (moto's) for workers on kombu's
SQS transport.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import amqp
import redis

if TYPE_CHECKING:
    from harness.proxy import FaultProxy


def _share(variable: str, value: str) -> tuple[int, int]:
    """(index, count) from "INDEX/COUNT" in *value*; (0, 1) when it is not that."""
    index, _, count = value.partition("/")
    if not (index.isdigit() and count.isdigit() and int(index) < int(count)):
        if value:
            raise RuntimeError(f"{variable}={value!r}: expected INDEX/COUNT, INDEX < COUNT")
        return 0, 1
    return int(index), int(count)


def port_share() -> tuple[int, int]:
    """(this process's share of the ports, the number of shares): see :func:`free_port`.

    A pytest-xdist worker (``gwN`` of ``PYTEST_XDIST_WORKER_COUNT``) has share
    N; ``LEADER_TEST_PORT_SHARE=K/M`` (set by run.sh for test runs it starts
    side by side) splits that again: share ``K * workers + N`` of ``M * workers``.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "").removeprefix("gw")
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    index, workers = _share("PYTEST_XDIST_WORKER", f"{worker}/{count}" if worker else "")
    run, runs = _share("LEADER_TEST_PORT_SHARE", os.environ.get("LEADER_TEST_PORT_SHARE", ""))
    return run * workers + index, runs * workers


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now.

    The kernel picks it (a port it would give any ``bind(("127.0.0.1", 0))``),
    and each of the test processes running side by side (pytest-xdist workers,
    run.sh's concurrent compat runs) takes only its own share of the ports:
    ``(port // 2) % shares == share`` (the kernel hands out mostly odd ports
    for ``bind``, hence the halving). Between this call and the server's own
    bind the port is free for anyone, so two processes picking at once could
    otherwise both get the same port; with disjoint shares they cannot.
    """
    share, shares = port_share()
    for _ in range(100 * shares):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if (port // 2) % shares == share:
            return port
    raise RuntimeError(f"no free port in share {share} of {shares}")


def wait_for_port(
    proc: subprocess.Popen[bytes], port: int, what: str, timeout: float, host: str = "127.0.0.1"
) -> None:
    """Block until *proc* listens on *host*:*port*; fail if it exits or takes too long."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"{what} did not start within {timeout:g} s")


def require_binary(name: str) -> str:
    """The path of *name*; fail (never skip) when it is missing."""
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} is not installed; run the README's test command")
    return path


class ServerProcess:
    """A server process a test owns: it can pause (SIGSTOP), resume and kill it."""

    proc: subprocess.Popen[bytes] | None = None

    def pause(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)


class RedisServer(ServerProcess):
    """One redis-server without persistence, controlled by the test.

    By default on loopback; with *host* and *wrapper* (harness.netbed's
    ``NetBed.address`` and ``NetBed.wrapper``), on that address inside a
    host's network namespace: the test reaches it there, from the root one.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        port: int | None = None,
        extra: list[str] | None = None,
        tls: dict[str, str] | None = None,
        host: str = "127.0.0.1",
        wrapper: list[str] | None = None,
    ) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.extra = extra or []
        self.tls = tls
        self.host = host
        self.wrapper = wrapper or []  # runs redis-server (``ip netns exec NS``, which execs it)
        self.proc: subprocess.Popen[bytes] | None = None
        self.binary = require_binary("redis-server")

    @property
    def url(self) -> str:
        return self.db_url(0)

    def db_url(self, db: int) -> str:
        return f"redis://{self.host}:{self.port}/{db}"

    def args(self) -> list[str]:
        args = [
            *self.wrapper,
            self.binary,
            "--bind",
            self.host,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.workdir),
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
        ]
        if self.tls:
            args += [
                "--port",
                "0",
                "--tls-port",
                str(self.port),
                "--tls-cert-file",
                self.tls["cert"],
                "--tls-key-file",
                self.tls["key"],
                "--tls-ca-cert-file",
                self.tls["ca"],
                "--tls-auth-clients",
                "no",
            ]
        else:
            args += ["--port", str(self.port)]
        if self.host != "127.0.0.1":
            # Bound to a test bed's private address alone: clients of other hosts of the
            # bed connect to it, which protected mode refuses without a password.
            args += ["--protected-mode", "no"]
        return args + self.extra

    def start(self) -> RedisServer:
        log = open(self.workdir / f"redis-{self.port}.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(self.args(), stdout=log, stderr=log)
        log.close()
        self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 10.0) -> None:
        assert self.proc is not None
        wait_for_port(self.proc, self.port, "redis-server", timeout, self.host)

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(host=self.host, port=self.port, decode_responses=True, **kwargs)

    def kill(self) -> None:
        self.stop()

    def restart_empty(self) -> None:
        """Kill and start again on the same port with no data (no persistence)."""
        self.kill()
        self.start()


class SentinelProcess(ServerProcess):
    """One ``redis-server --sentinel`` with its own config file (sentinels rewrite it).

    On loopback by default; with *host* and *wrapper* (harness.netbed's
    ``NetBed.address`` and ``NetBed.wrapper``) on that address inside a
    host's network namespace, monitoring the primary at *primary_host*.
    """

    def __init__(
        self,
        workdir: Path,
        primary_port: int,
        master_name: str,
        quorum: int,
        *,
        host: str = "127.0.0.1",
        wrapper: list[str] | None = None,
        primary_host: str = "127.0.0.1",
    ) -> None:
        self.port = free_port()
        self.host = host
        self.wrapper = wrapper or []
        self.workdir = workdir / f"sentinel-{self.port}"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config = self.workdir / "sentinel.conf"
        # A primary is down after 1 s without answer; a failover may take 3 s.
        self.config.write_text(
            f"port {self.port}\nbind {host}\ndaemonize no\ndir {self.workdir}\n"
            # Bound to a test bed's private address alone: the bed's other hosts connect.
            + ("protected-mode no\n" if host != "127.0.0.1" else "")
            + f"sentinel monitor {master_name} {primary_host} {primary_port} {quorum}\n"
            f"sentinel down-after-milliseconds {master_name} 1000\n"
            f"sentinel failover-timeout {master_name} 3000\n"
            f"sentinel parallel-syncs {master_name} 1\n"
        )
        self.binary = require_binary("redis-server")

    def start(self) -> SentinelProcess:
        log = open(self.workdir / "sentinel.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [*self.wrapper, self.binary, str(self.config), "--sentinel", "--loglevel", "notice"],
            stdout=log,
            stderr=log,
        )
        log.close()
        wait_for_port(self.proc, self.port, "redis sentinel", 10, self.host)
        return self

    def client(self) -> redis.Redis:
        return redis.Redis(host=self.host, port=self.port, socket_timeout=1)


#: A Sentinel set's place on a harness.netbed bed: (address, command prefix) of the
#: primary, the replica and each of the three sentinels.
SentinelHosts = dict[str, tuple[str, list[str]]]


class SentinelRedis:
    """A primary, a replica and three sentinels (quorum 2) on loopback ports, for one test.

    :attr:`url` is the ``sentinel://`` URL of the three, naming the primary
    :attr:`master_name`. :meth:`primary_port` asks a sentinel which server is
    primary now; :meth:`wait_failover` waits until that changed.
    """

    def __init__(
        self,
        workdir: Path,
        master_name: str = "leadertest",
        *,
        proxied_replica: bool = False,
        hosts: SentinelHosts | None = None,
        extra: list[str] | None = None,
    ) -> None:
        """*hosts*: where each runs on a harness.netbed bed, keyed "primary", "replica",
        "sentinel1".."sentinel3" (default: all on loopback). *extra*: redis-server
        arguments of both the primary and the replica (``--min-replicas-to-write 1``).
        """
        self.workdir = workdir
        self.master_name = master_name
        (workdir / "primary").mkdir(parents=True, exist_ok=True)
        (workdir / "replica").mkdir(parents=True, exist_ok=True)
        self.hosts: SentinelHosts = hosts or {}
        loopback: tuple[str, list[str]] = ("127.0.0.1", [])
        primary_host, primary_wrapper = self.hosts.get("primary", loopback)
        replica_host, replica_wrapper = self.hosts.get("replica", loopback)
        # No 5 s wait before a full sync (Redis 7's default for diskless replication).
        fast_sync = ["--repl-diskless-sync-delay", "0", *(extra or [])]
        self.primary = RedisServer(
            workdir / "primary", extra=fast_sync, host=primary_host, wrapper=primary_wrapper
        )
        #: With *proxied_replica*, the replica replicates through this proxy: blackhole it
        #: and the primary's later writes never reach the replica (a lagging replica).
        self.proxy: FaultProxy | None = None
        source = self.primary.port
        if proxied_replica:
            from harness.proxy import FaultProxy  # here: harness.proxy imports this module

            self.proxy = FaultProxy(self.primary.port)
            source = self.proxy.port
        self.replica = RedisServer(
            workdir / "replica",
            extra=[*fast_sync, "--replicaof", primary_host, str(source)],
            host=replica_host,
            wrapper=replica_wrapper,
        )
        self.sentinels: list[SentinelProcess] = []

    def start(self) -> SentinelRedis:
        try:
            self.primary.start()
            self.replica.start()
            self.wait_replicated()
            self.sentinels = []
            for n in range(1, 4):
                host, wrapper = self.hosts.get(f"sentinel{n}", ("127.0.0.1", []))
                sentinel = SentinelProcess(
                    self.workdir, self.primary.port, self.master_name, 2,
                    host=host, wrapper=wrapper, primary_host=self.primary.host,
                )  # fmt: skip
                self.sentinels.append(sentinel.start())
            self.wait_acquainted()
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def servers(self) -> list[RedisServer]:
        return [self.primary, self.replica]

    @property
    def url(self) -> str:
        parts = ";".join(f"sentinel://{s.host}:{s.port}" for s in self.sentinels)
        return f"{parts}/0?master_name={self.master_name}"

    def primary_port(self) -> int | None:
        """The port of the primary the sentinels name now (None when none answers)."""
        for sentinel in self.sentinels:
            if sentinel.proc is None or sentinel.proc.poll() is not None:
                continue
            try:
                with sentinel.client() as client:
                    found = client.sentinel_get_master_addr_by_name(self.master_name)
            except redis.RedisError:
                continue
            if found:
                return int(found[1])
        return None

    def server_on(self, port: int) -> RedisServer:
        (server,) = (s for s in self.servers if s.port == port)
        return server

    def wait_replicated(self, timeout: float = 10.0) -> None:
        """Until the replica is in sync with the primary."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with self.replica.client(socket_timeout=1) as client:
                    if client.info("replication").get("master_link_status") == "up":
                        return
            except redis.RedisError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"the replica did not sync within {timeout:g} s")

    def wait_acquainted(self, timeout: float = 15.0) -> None:
        """Until every sentinel knows the other two and the replica (a failover needs both)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            known = []
            for sentinel in self.sentinels:
                try:
                    with sentinel.client() as client:
                        master = client.sentinel_master(self.master_name)
                    known.append(
                        int(master.get("num-other-sentinels", 0)) >= 2
                        and int(master.get("num-slaves", 0)) >= 1
                    )
                except redis.RedisError:
                    known.append(False)
            if all(known):
                return
            time.sleep(0.1)
        raise RuntimeError(f"the sentinels did not find each other within {timeout:g} s")

    def wait_failover(self, old_port: int, timeout: float = 30.0) -> int:
        """Until the sentinels name a primary other than *old_port*, and it takes writes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            port = self.primary_port()
            if port is not None and port != old_port:
                try:
                    with self.server_on(port).client(socket_timeout=1) as client:
                        if client.info("replication").get("role") == "master":
                            return port
                except redis.RedisError:
                    pass
            time.sleep(0.05)
        raise RuntimeError(f"no failover within {timeout:g} s")

    def stop(self) -> None:
        for process in [*self.sentinels, self.replica, self.primary]:
            process.stop()
        if self.proxy is not None:
            self.proxy.close()


RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"


class RabbitMQServer:
    """A private RabbitMQ node the test owns, with its own name, ports and data dir.

    Guarantees:

    * the machine's RabbitMQ is never touched: the node has a unique name,
      listens on free loopback ports (AMQP and Erlang distribution), and
      keeps its config, data (mnesia), logs and Erlang cookie under
      *workdir*; /etc/rabbitmq is not read;
    * :meth:`start` returns only once a client can log in over AMQP as
      guest/guest at :attr:`url` and open a channel;
    * :meth:`stop` returns only once no process of the node is left (the
      Erlang VM and its helpers: erl_child_setup, inet_gethost, the disk
      monitor);
    * :meth:`restart` keeps the port and the data dir, so durable queues and
      their persistent messages survive it, as in a real broker restart.

    Measured on the 2-core test machine (RabbitMQ 3.10.8, OTP 25): a start
    takes about 6 s (the first one, which creates the data dir, too), a
    restart about 7.5 s (1 s of graceful shutdown, then the start). Most of a
    start is RabbitMQ loading every module to find its boot steps, so there
    is little to tune.

    With *host* and *wrapper* (harness.netbed's ``NetBed.address`` and
    ``NetBed.wrapper``) the node runs inside that host's network namespace
    and listens for AMQP on *host* (guest may log in from other hosts: the
    address is a test bed's private one); its Erlang distribution and epmd
    stay on the namespace's own loopback.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        wrapper: list[str] | None = None,
    ) -> None:
        self.binary = require_binary(RABBITMQ_SERVER)
        self.host = host
        self.wrapper = wrapper or []
        self.port = port or free_port()
        self.dist_port = free_port()
        while self.dist_port == self.port:
            self.dist_port = free_port()
        self.nodename = f"leadertest{uuid.uuid4().hex[:12]}@localhost"
        self.workdir = workdir / f"rabbitmq-{self.port}"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log = self.workdir / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        # Our own config files: otherwise the node reads /etc/rabbitmq, whose
        # listener is the machine's port 5672 and whose env file names the
        # machine's node.
        (self.workdir / "rabbitmq-env.conf").write_text("")
        (self.workdir / "enabled_plugins").write_text("[].\n")  # no management plugin: faster
        (self.workdir / "advanced.config").write_text("[].\n")
        config = f"listeners.tcp.default = {host}:{self.port}\n"
        if host != "127.0.0.1":
            config += "loopback_users = none\n"  # guest, from the other hosts of the bed
        (self.workdir / "rabbitmq.conf").write_text(config)

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{self.host}:{self.port}//"

    def env(self) -> dict[str, str]:
        # Inherited RABBITMQ_*/ERL_* settings (or systemd's NOTIFY_SOCKET)
        # would point the node at someone else's ports, files or node name.
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("RABBITMQ_", "ERL_")) and key != "NOTIFY_SOCKET"
        }
        work = self.workdir
        env.update(
            HOME=str(work),  # the Erlang cookie goes here, not in root's home
            RABBITMQ_CONF_ENV_FILE=str(work / "rabbitmq-env.conf"),
            RABBITMQ_CONFIG_FILE=str(work / "rabbitmq.conf"),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(work / "advanced.config"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(work / "enabled_plugins"),
            RABBITMQ_NODENAME=self.nodename,
            RABBITMQ_NODE_IP_ADDRESS=self.host,
            RABBITMQ_NODE_PORT=str(self.port),
            # The default (node port + 20000) may be taken, or past 65535.
            RABBITMQ_DIST_PORT=str(self.dist_port),
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}",
            RABBITMQ_MNESIA_BASE=str(work / "mnesia"),
            RABBITMQ_LOG_BASE=str(work / "log"),
            RABBITMQ_LOGS="-",  # to stdout, which is self.log
            RABBITMQ_PID_FILE=str(work / "rabbitmq.pid"),
        )
        return env

    def start(self, timeout: float = 60.0) -> RabbitMQServer:
        """Start the node (with whatever data its data dir holds); wait until AMQP works."""
        assert self.proc is None, "already started"
        # The script itself, not /usr/sbin's wrapper that switches to the
        # rabbitmq user. In the foreground it stays our child and turns our
        # SIGTERM into a clean shutdown of the Erlang VM it runs.
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [*self.wrapper, self.binary],
                env=self.env(),
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout: float) -> None:
        """Block until a guest login and a channel work over AMQP (the port opens earlier)."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"rabbitmq-server exited with {self.proc.returncode}; see {self.log}"
                )
            # py-amqp itself: kombu's connect() sleeps 2 s before its one retry.
            connection = amqp.Connection(
                f"{self.host}:{self.port}", userid="guest", password="guest", connect_timeout=1
            )
            try:
                connection.connect()
                connection.channel().close()
            except (OSError, amqp.AMQPError):
                connection.collect()
                time.sleep(0.1)
                continue
            connection.close()
            return
        raise RuntimeError(f"RabbitMQ did not accept AMQP within {timeout:g} s; see {self.log}")

    def stop(self, timeout: float = 30.0) -> None:
        """Shut the node down cleanly (SIGKILL after *timeout*); leave no process of it."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(10)
            self.proc = None
        self._kill_leftovers()

    def restart(self) -> None:
        """Stop and start again on the same port with the same data, as a broker restart."""
        self.stop()
        self.start()

    def pids(self) -> list[int]:
        """The live processes of this node: the script, the Erlang VM and its helpers."""
        # erl_child_setup and its children run in sessions of their own, out
        # of reach of killpg; the node name in their environment finds them.
        needle = f"RABBITMQ_NODENAME={self.nodename}".encode()
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                environ = (entry / "environ").read_bytes()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:  # gone meanwhile, or not ours to read
                continue
            if state != "Z" and needle in environ.split(b"\0"):
                pids.append(int(entry.name))
        return pids

    def _kill_leftovers(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while pids := self.pids():
            if time.monotonic() > deadline:
                raise RuntimeError(f"RabbitMQ processes {pids} of {self.nodename} survived SIGKILL")
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):  # exited meanwhile
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)


AZURITE_ACCOUNT = "devstoreaccount1"
# Azurite's fixed, public development key (documented by Microsoft; not a secret).
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
ROOT = Path(__file__).resolve().parent.parent


class AzuriteServer(ServerProcess):
    """Azurite's blob service (the npm package pinned in package.json), in memory.

    On loopback by default; with *host* and *wrapper* (harness.netbed's
    ``NetBed.address`` and ``NetBed.wrapper``) on that address inside a
    host's network namespace.
    """

    def __init__(
        self,
        workdir: Path,
        port: int | None = None,
        *,
        host: str = "127.0.0.1",
        wrapper: list[str] | None = None,
    ) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.host = host
        self.wrapper = wrapper or []
        self.binary = ROOT / "node_modules" / ".bin" / "azurite-blob"
        if not self.binary.exists():
            raise RuntimeError("Azurite is not installed; run the README's test command")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
            f"AccountKey={AZURITE_KEY};"
            f"BlobEndpoint=http://{self.host}:{self.port}/{AZURITE_ACCOUNT};"
        )

    def start(self) -> AzuriteServer:
        log = open(self.workdir / f"azurite-{self.port}.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                *self.wrapper,
                str(self.binary),
                "--blobHost",
                self.host,
                "--blobPort",
                str(self.port),
                "--inMemoryPersistence",
                "--skipApiVersionCheck",
                "--disableTelemetry",
                "--silent",
            ],
            stdout=log,
            stderr=log,
            cwd=self.workdir,
        )
        log.close()
        wait_for_port(self.proc, self.port, "azurite", 30, self.host)
        return self


#: Any key and secret do for moto's server; AWS would want real ones.
SQS_KEY, SQS_SECRET = "testing", "testing"
SQS_REGION = "us-east-1"


class SqsServer(ServerProcess):
    """An SQS-compatible server (moto's standalone server) on a loopback port, in memory.

    What it emulates that the tests rely on: a queue's VisibilityTimeout (an
    unacknowledged message is delivered again once it passes), a new
    ReceiptHandle at every receive (kombu's SQS transport makes it the
    delivery tag), ApproximateReceiveCount, and long polling
    (WaitTimeSeconds returns as soon as a message arrives). Where it differs
    from AWS: DeleteMessage with any receipt handle the message ever had
    deletes it (AWS promises that only for the latest one), and deleting a
    deleted message again succeeds.
    """

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """kombu's broker URL: the host and port make its endpoint (http, see transport_options)."""
        return f"sqs://{SQS_KEY}:{SQS_SECRET}@127.0.0.1:{self.port}"

    @staticmethod
    def transport_options() -> dict[str, Any]:
        """kombu SQS options for this server: plain http, short polls (an empty poll waits 1 s)."""
        return {
            "region": SQS_REGION,
            "is_secure": False,
            "wait_time_seconds": 1,
            "polling_interval": 0.1,
        }

    def start(self) -> SqsServer:
        log = open(self.workdir / f"moto-{self.port}.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            # this interpreter's moto (moto[server], a test dependency)
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=log,
            stderr=log,
            cwd=self.workdir,
        )
        log.close()
        wait_for_port(self.proc, self.port, "moto_server (SQS)", 30)
        return self

    def client(self) -> Any:
        """A boto3 SQS client of this server (boto3 comes with kombu's sqs extra)."""
        import boto3  # only the SQS tests need it

        return boto3.client(
            "sqs",
            endpoint_url=f"http://127.0.0.1:{self.port}",
            region_name=SQS_REGION,
            aws_access_key_id=SQS_KEY,
            aws_secret_access_key=SQS_SECRET,
        )

    def messages(self, queue: str) -> dict[str, int]:
        """Messages in the SQS queue kombu makes of *queue*: visible, in flight, delayed.

        kombu names the SQS queue after the kombu one, dots turned into dashes.
        """
        client = self.client()
        url = client.get_queue_url(QueueName=queue.replace(".", "-"))["QueueUrl"]
        kinds = {
            "visible": "ApproximateNumberOfMessages",
            "in_flight": "ApproximateNumberOfMessagesNotVisible",
            "delayed": "ApproximateNumberOfMessagesDelayed",
        }
        attributes = client.get_queue_attributes(QueueUrl=url, AttributeNames=list(kinds.values()))
        return {kind: int(attributes["Attributes"][name]) for kind, name in kinds.items()}


POSTGRES_BIN = Path("/usr/lib/postgresql")


def postgres_binary(name: str) -> str:
    """The newest installed PostgreSQL's *name* (``initdb``, ``pg_ctl``); fail if none is."""
    found = sorted(POSTGRES_BIN.glob(f"*/bin/{name}"), key=lambda p: int(p.parts[-3]))
    if not found:
        return require_binary(name)
    return str(found[-1])


class PostgresServer(ServerProcess):
    """A private PostgreSQL cluster (``initdb`` in a temp dir, trust auth on loopback).

    PostgreSQL refuses to run as root: as root the cluster belongs to the
    ``postgres`` user and every server command runs through ``runuser``. The
    data dir lives in its own directory under /tmp (a pytest tmp dir is
    closed to other users). :meth:`kill` is ``kill -9`` of the postmaster
    (and its children with it); :meth:`start` again recovers from the WAL, as
    after a crash.

    With *host* and *wrapper* (harness.netbed's ``NetBed.address`` and
    ``NetBed.wrapper``) the server runs inside that host's network namespace,
    listens on *host*, and trusts clients of that address's /24 (a test
    bed's private subnet).
    """

    def __init__(
        self, *, port: int | None = None, host: str = "127.0.0.1", wrapper: list[str] | None = None
    ) -> None:
        self.host = host
        self.wrapper = wrapper or []
        self.port = port or free_port()
        self.root = Path(tempfile.mkdtemp(prefix="celery-leader-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.as_postgres = os.geteuid() == 0
        if self.as_postgres:
            shutil.chown(self.root, "postgres", "postgres")
        self.proc = None

    def _run(self, *args: str, timeout: float = 60, wrapper: list[str] | None = None) -> None:
        command = [*args]
        if self.as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        command = [*(wrapper or []), *command]
        subprocess.run(command, check=True, capture_output=True, timeout=timeout)

    @property
    def url(self) -> str:
        return f"postgresql://postgres@{self.host}:{self.port}/postgres"

    #: A cluster made by initdb once per test process, copied for each server after it
    #: (a copy takes a fraction of initdb's time and CPU).
    _template: ClassVar[Path | None] = None

    def _initdb(self) -> None:
        template = PostgresServer._template
        if template is None or not (template / "PG_VERSION").exists():
            root = Path(tempfile.mkdtemp(prefix="celery-leader-pg-template-"))
            if self.as_postgres:
                shutil.chown(root, "postgres", "postgres")
            template = root / "data"
            self._run(
                postgres_binary("initdb"), "-D", str(template), "-U", "postgres",
                "--auth=trust", "--no-sync",
            )  # fmt: skip
            PostgresServer._template = template
        self._run("cp", "-a", str(template), str(self.data))

    def start(self) -> PostgresServer:
        if not (self.data / "PG_VERSION").exists():
            self._initdb()
            if self.host != "127.0.0.1":
                subnet = ".".join(self.host.split(".")[:3])
                with open(self.data / "pg_hba.conf", "a") as hba:
                    hba.write(f"host all all {subnet}.0/24 trust\n")
        self._run(
            postgres_binary("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w",
            "-o", f"-p {self.port} -k {self.root} -c listen_addresses={self.host} -c fsync=off",
            "start",
            wrapper=self.wrapper,
        )  # fmt: skip
        return self

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def processes(self) -> list[int]:
        """The postmaster and its children."""
        pid = self.postmaster_pid()
        if pid is None:
            return []
        found = subprocess.run(
            ["pgrep", "-P", str(pid)], check=False, capture_output=True, text=True
        )
        return [pid, *(int(p) for p in found.stdout.split())]

    def pause(self) -> None:
        for pid in self.processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def resume(self) -> None:
        for pid in self.processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def kill(self) -> None:
        """``kill -9`` of the postmaster and its children: a crash."""
        for pid in self.processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                probe.settimeout(1)
                if probe.connect_ex((self.host, self.port)) != 0:
                    break
            time.sleep(0.05)
        # What a crashed postmaster leaves behind, and a new one refuses to start beside.
        for stale in [self.data / "postmaster.pid", *self.root.glob(".s.PGSQL.*")]:
            with contextlib.suppress(OSError):
                stale.unlink()

    def stop(self) -> None:
        if self.postmaster_pid() is not None:
            self.kill()
        shutil.rmtree(self.root, ignore_errors=True)


#: Raft timings for test clusters: a heartbeat every 50 ms and an election after 500 ms
#: without one (etcd's defaults are 100 ms and 1 s; it wants the election timeout at
#: least 5 heartbeats). A SIGKILLed leader is replaced within 0.5 to 1.5 s.
ETCD_TIMINGS = ("--heartbeat-interval", "50", "--election-timeout", "500")


def etcd_env() -> dict[str, str]:
    """The environment for etcd and etcdctl: ours without ETCD_*/ETCDCTL_* settings.

    etcd reads every flag from an ``ETCD_<FLAG>`` variable too, and etcdctl from
    ``ETCDCTL_<FLAG>``: an inherited one would point them at someone else's cluster.
    """
    return {k: v for k, v in os.environ.items() if not k.startswith(("ETCD_", "ETCDCTL_"))}


#: HTTP without any proxy from the environment (http_proxy would take loopback calls too).
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def etcd_post(client_url: str, path: str, body: dict[str, object], timeout: float) -> Any:
    """POST *body* as JSON to etcd's gRPC gateway (``/v3/...``); its answer, decoded.

    Raises OSError (``urllib.error.URLError``, a timeout) when the member does not
    answer, ``urllib.error.HTTPError`` when it answers an error. The gateway writes
    64-bit numbers (ids, revisions, terms) as JSON strings.
    """
    request = urllib.request.Request(
        f"{client_url}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with _DIRECT.open(request, timeout=timeout) as response:
        return json.loads(response.read())


class EtcdMember(ServerProcess):
    """One etcd 3.4 member on loopback: its data dir and log in *workdir*, free ports.

    :class:`EtcdCluster` makes the members of a cluster and sets their
    :attr:`initial_cluster` and :attr:`cluster_token`; alone, a member is a
    cluster of one. Those two (and ``--initial-cluster-state new``) only count
    when the data dir is empty: :meth:`restart` on the same data dir rejoins
    the cluster the data dir names.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        name: str | None = None,
        client_port: int | None = None,
        peer_port: int | None = None,
        extra: list[str] | None = None,
        host: str = "127.0.0.1",
        wrapper: list[str] | None = None,
    ) -> None:
        self.binary = require_binary("etcd")
        self.workdir = workdir
        self.host = host  # with *wrapper*, a host of harness.netbed runs it on its address
        self.wrapper = wrapper or []
        self.client_port = client_port or free_port()
        self.peer_port = peer_port or free_port()
        while self.peer_port == self.client_port:
            self.peer_port = free_port()
        #: Unique among the members started by this process (their ports are).
        self.name = name or f"etcd-{self.client_port}"
        self.data_dir = workdir / f"{self.name}.etcd"
        self.log = workdir / f"{self.name}.log"
        self.initial_cluster = f"{self.name}={self.peer_url}"
        self.cluster_token = f"celery-leader-{uuid.uuid4().hex}"
        self.extra = extra or []
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_start = 0  # where the last start's lines begin in the log

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.client_port}"

    @property
    def client_url(self) -> str:
        return f"http://{self.host}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"

    @property
    def running(self) -> bool:
        """Whether the process is alive (a paused one is)."""
        return self.proc is not None and self.proc.poll() is None

    def args(self) -> list[str]:
        return [
            *self.wrapper,
            self.binary,
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.client_url,
            "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", self.peer_url,
            "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", self.initial_cluster,
            "--initial-cluster-state", "new",
            "--initial-cluster-token", self.cluster_token,
            *ETCD_TIMINGS,
            # Structured, to the log file (capnslog may go to journald under systemd).
            "--logger", "zap",
            "--log-outputs", "stderr",
            *self.extra,
        ]  # fmt: skip

    def start(self, *, wait: bool = True, timeout: float = 15.0) -> EtcdMember:
        """Start the member on its data dir; with *wait*, until it serves reads.

        The members of a new cluster (or of one whose quorum is down) cannot
        serve before enough of them run: start those with ``wait=False``, then
        :meth:`wait_ready` each.
        """
        assert not self.running, f"{self.name} is running"
        self.workdir.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self._log_start = log.tell()
            self.proc = subprocess.Popen(
                self.args(),
                env=etcd_env(),
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        if wait:
            try:
                self.wait_ready(timeout)
            except BaseException:
                self.stop()
                raise
        return self

    def wait_ready(self, timeout: float = 15.0) -> None:
        """Block until a linearizable read works (the member is in a cluster with a leader)."""
        self._wait_serving(
            lambda: etcd_post(self.client_url, "/v3/kv/range", {"key": "AA=="}, timeout=1),
            "serve",
            timeout,
        )

    def _wait_serving(self, probe: Callable[[], object], what: str, timeout: float) -> None:
        """Block until *probe* stops raising OSError or ValueError, while our process runs."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                raise RuntimeError(f"etcd {self.name} exited with {code}; see {self.log}")
            try:
                probe()
            except (OSError, ValueError):
                time.sleep(0.01)
                continue
            # The port may have answered for someone else's server while ours failed to bind.
            if self.proc.poll() is None:
                return
        raise RuntimeError(f"etcd {self.name} did not {what} within {timeout:g} s; see {self.log}")

    def bind_failed(self) -> bool:
        """Whether the last start failed because one of the member's ports was taken."""
        try:
            with open(self.log, "rb") as log:
                log.seek(self._log_start)
                return b"address already in use" in log.read()
        except OSError:
            return False

    def wait_peer_port(self, timeout: float = 15.0) -> None:
        """Block until the member serves its peer port (before it has a cluster leader)."""

        def probe() -> None:
            with _DIRECT.open(f"{self.peer_url}/version", timeout=1) as response:
                response.read()

        self._wait_serving(probe, "serve its peer port", timeout)

    def status(self, timeout: float = 0.5) -> dict[str, Any] | None:
        """The member's ``/v3/maintenance/status``, or None when it does not answer."""
        if not self.running:
            return None
        try:
            found: dict[str, Any] = etcd_post(
                self.client_url, "/v3/maintenance/status", {}, timeout=timeout
            )
        except (OSError, ValueError):
            return None
        return found

    def pause(self) -> None:
        """SIGSTOP, and wait until every thread has stopped (a signal arrives a little
        later: a request sent right after os.kill() returns may still be answered)."""
        super().pause()
        assert self.proc is not None
        tasks = Path(f"/proc/{self.proc.pid}/task")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            states = []
            for task in tasks.iterdir():
                with contextlib.suppress(OSError, IndexError):  # a thread ended meanwhile
                    states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
            if all(state in ("T", "t") for state in states):
                return
            time.sleep(0.001)
        raise RuntimeError(f"etcd {self.name} did not stop on SIGSTOP within 5 s")

    def kill(self) -> None:
        """SIGKILL, and wait until it is gone: a crash."""
        self.stop()

    def restart(self, *, wait: bool = True, timeout: float = 15.0) -> EtcdMember:
        """Kill the member if it runs, and start it again on the same data dir and ports."""
        self.kill()
        return self.start(wait=wait, timeout=timeout)

    def remove_data(self) -> None:
        """Delete the data dir (the member must be stopped): it starts as a new member."""
        assert not self.running, f"{self.name} is running"
        shutil.rmtree(self.data_dir, ignore_errors=True)


class EtcdCluster:
    """*size* etcd members (1 or 3) on loopback ports under *workdir*, for one test.

    :attr:`url` is the store URL of all members with :attr:`prefix`;
    :meth:`leader` asks the members which of them is the raft leader now;
    :meth:`restart_empty` loses all data, as a store rebuilt from nothing.
    :meth:`stop` keeps the data (:meth:`start` again restarts the cluster with
    it); :meth:`close`, also the end of a ``with`` block, deletes it, but not
    the members' logs. Each member's data dir takes about 125 MB of disk at once
    (etcd preallocates two 64 MB WAL files).
    """

    def __init__(
        self,
        workdir: Path,
        size: int = 1,
        *,
        prefix: str = "celery-leader-test",
        extra: list[str] | None = None,
        hosts: list[tuple[str, list[str]]] | None = None,
    ) -> None:
        """*hosts*: (address, command prefix) of each member, harness.netbed hosts (one
        per member); by default every member on loopback."""
        if size < 1:
            raise ValueError(f"size={size}: a cluster has at least one member")
        if hosts is not None and len(hosts) != size:
            raise ValueError(f"hosts: {len(hosts)} given for {size} members")
        self.hosts = hosts
        self.workdir = workdir
        self.prefix = prefix
        self.size = size
        self.extra = extra
        self.cluster_token = ""
        self.members: list[EtcdMember] = []
        self._new_members()
        self._started = False

    def _new_members(self) -> None:
        """*size* new members on new ports, with a new cluster token."""
        members: list[EtcdMember] = []
        ports: set[int] = set()
        while len(members) < self.size:
            host, wrapper = self.hosts[len(members)] if self.hosts else ("127.0.0.1", [])
            member = EtcdMember(self.workdir, extra=self.extra, host=host, wrapper=wrapper)
            if not {member.client_port, member.peer_port} & ports:
                members.append(member)
                ports |= {member.client_port, member.peer_port}
        initial_cluster = ",".join(f"{m.name}={m.peer_url}" for m in members)
        for member in members:
            member.initial_cluster = initial_cluster
        self.members = members
        self.new_token()

    def new_token(self) -> None:
        """A new ``--initial-cluster-token`` for every member: a new cluster id on empty data."""
        self.cluster_token = f"celery-leader-{uuid.uuid4().hex}"
        for member in self.members:
            member.cluster_token = self.cluster_token

    @property
    def quorum(self) -> int:
        return len(self.members) // 2 + 1

    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    @property
    def url(self) -> str:
        return f"etcd://{','.join(self.endpoints)}/{self.prefix}"

    def start(self, timeout: float = 30.0) -> EtcdCluster:
        """Start the members that do not run (with the data they have); wait until each
        serves reads and they agree on a leader. Stops them all if that fails.

        The first start may move the cluster to other ports (read :attr:`url` and
        :attr:`members` after it): when a port free_port() picked is taken before
        etcd binds it, it starts a new cluster on new ports (up to three tries). Later
        starts keep the ports, as clients hold the URL.
        """
        for attempt in range(3):
            try:
                self._start(timeout)
            except RuntimeError:
                lost_port = any(m.bind_failed() for m in self.members)
                if self._started or attempt == 2 or not lost_port:
                    raise
                self.close()
                self._new_members()
                continue
            self._started = True
            break
        return self

    def _start(self, timeout: float) -> None:
        # A member of a new cluster first asks each peer for its member list, allowing
        # it 1 s: a peer that listens but does not serve yet costs that second. So each
        # member starts once the one before serves its peer port (within milliseconds).
        deadline = time.monotonic() + timeout
        try:
            for member in self.members:
                if not member.running:
                    member.start(wait=False)
                    member.wait_peer_port(max(deadline - time.monotonic(), 0.1))
            for member in self.members:
                member.wait_ready(max(deadline - time.monotonic(), 0.1))
            self.wait_leader(max(deadline - time.monotonic(), 0.1))
        except BaseException:
            self.stop()
            raise

    def _statuses(self) -> list[tuple[EtcdMember, int, int, int]]:
        """(member, its id, the leader it names, raft term) of each member that answers."""
        found = []
        for member in self.members:
            status = member.status()
            if status is None:
                continue
            header = status.get("header", {})
            found.append(
                (
                    member,
                    int(header.get("member_id", 0)),
                    int(status.get("leader", 0)),
                    int(status.get("raftTerm", header.get("raft_term", 0))),
                )
            )
        return found

    def leader(self) -> EtcdMember | None:
        """The member that answers as raft leader (of the highest term, if a deposed one
        has not heard yet); None when none does."""
        leaders = [(term, m) for m, own, leader, term in self._statuses() if own and own == leader]
        if not leaders:
            return None
        return max(leaders, key=lambda found: found[0])[1]

    def wait_leader(
        self, timeout: float = 10.0, *, other_than: EtcdMember | None = None
    ) -> EtcdMember:
        """Until a quorum of the members answer and name the same leader, which answers as
        leader itself (and is not *other_than*); that member."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            statuses = self._statuses()
            named = {leader for _, _, leader, _ in statuses}
            if len(statuses) >= self.quorum and len(named) == 1:
                (leader_id,) = named
                for member, own, _, _ in statuses:
                    if leader_id and own == leader_id and member is not other_than:
                        return member
            time.sleep(0.02)
        raise RuntimeError(f"no etcd leader within {timeout:g} s; see the logs in {self.workdir}")

    def stop(self) -> None:
        """Kill every member (SIGKILL); their data stays."""
        for member in self.members:
            member.stop()

    def close(self) -> None:
        """Kill every member and delete their data dirs (the logs stay)."""
        self.stop()
        for member in self.members:
            member.remove_data()

    def __enter__(self) -> EtcdCluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def restart_empty(self, timeout: float = 30.0) -> EtcdCluster:
        """Stop every member, delete every data dir and start a new cluster on the same
        ports, with a new cluster token (so a new cluster id): all data is lost and the
        revisions start again from 1."""
        self.close()
        self.new_token()
        return self.start(timeout)

    def etcdctl(self, *args: str, timeout: float = 20.0) -> subprocess.CompletedProcess[str]:
        """``etcdctl`` (API v3) with the endpoints of the members that run; not checked."""
        endpoints = [m.endpoint for m in self.members if m.running] or self.endpoints
        return subprocess.run(
            [require_binary("etcdctl"), f"--endpoints={','.join(endpoints)}", *args],
            env={**etcd_env(), "ETCDCTL_API": "3"},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
