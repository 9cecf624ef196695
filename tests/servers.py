"""Real servers for tests: redis-server processes on free loopback ports.

Each server is a real process the test owns, so tests can kill, pause
(SIGSTOP), resume and restart it empty.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import redis


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(proc: subprocess.Popen[bytes], port: int, what: str, timeout: float) -> None:
    """Block until *proc* listens on 127.0.0.1:*port*; fail if it exits or takes too long."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
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
    """One redis-server without persistence, controlled by the test."""

    def __init__(
        self,
        workdir: Path,
        *,
        port: int | None = None,
        extra: list[str] | None = None,
        tls: dict[str, str] | None = None,
    ) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.extra = extra or []
        self.tls = tls
        self.proc: subprocess.Popen[bytes] | None = None
        self.binary = require_binary("redis-server")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def args(self) -> list[str]:
        args = [
            self.binary,
            "--bind",
            "127.0.0.1",
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
        return args + self.extra

    def start(self) -> RedisServer:
        log = open(self.workdir / f"redis-{self.port}.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(self.args(), stdout=log, stderr=log)
        log.close()
        self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 10.0) -> None:
        assert self.proc is not None
        wait_for_port(self.proc, self.port, "redis-server", timeout)

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, decode_responses=True, **kwargs)

    def kill(self) -> None:
        self.stop()

    def restart_empty(self) -> None:
        """Kill and start again on the same port with no data (no persistence)."""
        self.kill()
        self.start()


AZURITE_ACCOUNT = "devstoreaccount1"
# Azurite's fixed, public development key (documented by Microsoft; not a secret).
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
ROOT = Path(__file__).resolve().parent.parent


class AzuriteServer(ServerProcess):
    """Azurite's blob service (the npm package pinned in package.json), in memory."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.binary = ROOT / "node_modules" / ".bin" / "azurite-blob"
        if not self.binary.exists():
            raise RuntimeError("Azurite is not installed; run the README's test command")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
            f"AccountKey={AZURITE_KEY};"
            f"BlobEndpoint=http://127.0.0.1:{self.port}/{AZURITE_ACCOUNT};"
        )

    def start(self) -> AzuriteServer:
        log = open(self.workdir / f"azurite-{self.port}.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                str(self.binary),
                "--blobHost",
                "127.0.0.1",
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
        wait_for_port(self.proc, self.port, "azurite", 30)
        return self
