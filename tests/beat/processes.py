"""Real ``celery beat`` and ``celery worker -B`` processes for the beat tests, and what they sent.

Each process writes its output to a log file of the test; messages are read
straight from the Redis broker's queue list, so a test sees every send,
led (with beat's token header) or not.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import redis

from harness.cluster import ROOT


class Process:
    """One ``python -m celery`` process of a test, its output in ``<tmp>/<name>.log``."""

    def __init__(self, name: str, args: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.name = name
        self.log = cwd / f"{name}.log"
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "celery", *args],
                cwd=cwd,
                env=env,
                stdout=out,
                stderr=out,
                start_new_session=True,
            )

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_for(self, fragment: str, timeout: float) -> None:
        """Wait until *fragment* is in the output; fail if the process exits first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if fragment in self.text():
                return
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"{self.name} exited {self.proc.returncode} before {fragment!r}:\n"
                    f"{self.text()[-3000:]}"
                )
            time.sleep(0.1)
        raise AssertionError(f"{self.name}: no {fragment!r} in {timeout} s:\n{self.text()[-3000:]}")

    def exit_code(self, timeout: float) -> int:
        """The exit status, waiting up to *timeout*; fail if it still runs then."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{self.name} still runs after {timeout} s:\n{self.text()[-3000:]}"
            ) from None

    def kill(self) -> None:
        """SIGKILL the process and everything it started (a crash)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, timeout: float = 20) -> None:
        """SIGTERM (a clean stop); SIGKILL if it is not gone within *timeout*."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()


class Processes(list[Process]):
    """The processes of one test, stopped at its end."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        super().__init__()
        self.cwd = cwd
        self.env = env

    def start(self, name: str, *args: str, env: dict[str, str] | None = None) -> Process:
        process = Process(name, list(args), self.cwd, {**self.env, **(env or {})})
        self.append(process)
        return process

    def stop_all(self) -> None:
        for process in self:
            if process.proc.poll() is None:
                process.proc.send_signal(signal.SIGTERM)
        for process in self:
            process.stop()


def base_env(name: str) -> dict[str, str]:
    """The environment every process of a test shares: the repository on the path."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "LEADER_NAME": name}


def sent(broker_url: str, queue: str) -> list[dict]:
    """The headers of every message waiting in *queue* on the Redis broker, oldest first."""
    client = redis.Redis.from_url(broker_url)
    try:
        raw = client.lrange(queue, 0, -1)
    finally:
        client.close()
    # Kombu's Redis transport pushes on the left: the oldest message is last.
    return [json.loads(item)["headers"] for item in reversed(raw)]


def wait_sent(broker_url: str, queue: str, count: int, timeout: float) -> list[dict]:
    """Wait until at least *count* messages are in *queue*; fail after *timeout*."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        messages = sent(broker_url, queue)
        if len(messages) >= count:
            return messages
        time.sleep(0.1)
    raise AssertionError(f"{len(sent(broker_url, queue))} sent in {timeout} s, wanted {count}")


def error_line(process: Process) -> str:
    """The one line a refused process printed (``Error: celery-leader: ...``), with no traceback."""
    text = process.text()
    assert "Traceback" not in text, text[-3000:]
    lines = [line for line in text.splitlines() if "celery-leader:" in line]
    assert len(lines) == 1, text[-3000:]
    assert lines[0].startswith("Error: celery-leader: "), lines[0]
    return lines[0]
