"""Lease-manager processes on one election, driven from a parent process."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Event = dict[str, Any]


@dataclass
class Node:
    """One node process and the thread reading its events."""

    name: str
    proc: subprocess.Popen[str]
    reader: threading.Thread | None = field(default=None)
    ready: threading.Event = field(default_factory=threading.Event)


class NodeGroup:
    """Node processes on one election, and one queue of their events.

    Events are the JSON objects of :mod:`celery_leader.demo.node`, as dicts.
    """

    def __init__(self, url: str, election: str, ttl: float, *, quiet: bool = True) -> None:
        self.url, self.election, self.ttl, self.quiet = url, election, ttl, quiet
        self.nodes: dict[str, Node] = {}
        self.events: queue.Queue[Event] = queue.Queue()

    def start(self, name: str) -> None:
        """Start node *name* (our own interpreter, our own module: no outside input)."""
        proc = subprocess.Popen(  # noqa: S603 - argv built from our own values
            [
                sys.executable,
                "-m",
                "celery_leader.demo.node",
                self.url,
                self.election,
                str(self.ttl),
                name,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL if self.quiet else None,
            text=True,
            start_new_session=True,  # Ctrl-C reaches us; we stop the nodes in order
        )
        node = Node(name, proc)
        node.reader = threading.Thread(target=self._read, args=(node,), daemon=True)
        node.reader.start()
        self.nodes[name] = node

    def _read(self, node: Node) -> None:
        assert node.proc.stdout is not None
        for line in node.proc.stdout:
            if line.strip() == "ready":
                node.ready.set()
            elif line.startswith("{"):
                self.events.put(json.loads(line))

    def wait_ready(self, name: str) -> None:
        """Block until *name* is running (its events start after this)."""
        while not self.nodes[name].ready.wait(0.05):
            if self.nodes[name].proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {self.nodes[name].proc.returncode}")

    def signal(self, name: str, signum: int) -> None:
        """Send *signum* to node *name*."""
        os.kill(self.nodes[name].proc.pid, signum)

    def wait_elected(
        self, timeout: float, on_event: Callable[[Event], None], exclude: str | None = None
    ) -> Event:
        """The next ELECTED event not of *exclude*; every event goes to *on_event*."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no leader elected within {timeout:.0f} s")
            try:
                event = self.events.get(timeout=left)
            except queue.Empty:
                continue
            on_event(event)
            if event["kind"] == "elected" and event["holder"] != exclude:
                return event

    def stop_all(self) -> None:
        """SIGTERM every node, then SIGKILL those still running after 5 s."""
        for node in self.nodes.values():
            if node.proc.poll() is None:
                node.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        for node in self.nodes.values():
            try:
                node.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait()
