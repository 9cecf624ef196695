"""A fault-injecting TCP proxy, to cut one worker off its lease store.

Sits between a client and a server on loopback. Modes, switched at any time:
``pass`` (forward), ``delay`` (forward each chunk after a pause),
``blackhole`` (accept and hold bytes: connections hang, as on a dead
network), ``drop`` (close every connection and refuse new ones), ``trickle``
(each reply from the server late by ``delay``; after ``hang_after`` replies on
one connection since the switch, hold the rest: a call of several round
trips, each just in time, that then hangs). :meth:`FaultProxy.after_next_reply`
switches mode right after the next reply reaches a client (e.g. right after a
renewal) and closes the connections, so the next call starts a fresh one.
:meth:`FaultProxy.freeze_after_requests` lets the next *n* requests of a
client through and then freezes (mode ``freeze``): nothing more goes either
way, and a connection the client closes stays open towards the server, as
for a client stopped (SIGSTOP) or cut off right after its *n*-th request.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from harness.servers import free_port


class FaultProxy:
    """Forward <listen_host>:<port> to <target_host>:<target>, with faults on demand.

    Both hosts are 127.0.0.1 unless given (harness.netbed routes a host's
    connections through a proxy on its controller address to slow them).
    """

    def __init__(
        self,
        target_port: int,
        *,
        target_host: str = "127.0.0.1",
        listen_host: str = "127.0.0.1",
        keep_idle: bool = False,
    ) -> None:
        """*keep_idle*: keep a connection that carries nothing open (by default one whose
        server side is silent for 2 s is closed)."""
        self.keep_idle = keep_idle
        self.target_port = target_port
        self.target_host = target_host
        self.port = free_port()
        self.mode = "pass"
        self.delay = 0.0
        self.hang_after = 0
        self._epoch = 0  # bumped on every switch: replies are counted from it
        self._armed: tuple[str, float, int] | None = None
        self._freeze_after: int | None = None  # requests left to let through, then freeze
        self._listener = socket.create_server((listen_host, self.port))
        self._listener.settimeout(0.2)
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def set_mode(self, mode: str, delay: float = 0.0, hang_after: int = 0) -> None:
        self.mode, self.delay, self.hang_after = mode, delay, hang_after
        self._epoch += 1
        if mode == "drop":
            self._close_all()

    def after_next_reply(self, mode: str, delay: float = 0.0, hang_after: int = 0) -> None:
        """Switch to *mode*, closing every connection, once the next server reply is forwarded."""
        self._armed = (mode, delay, hang_after)

    def freeze_after_requests(self, requests: int) -> None:
        """Forward the next *requests* client writes, then freeze (see the module docstring).

        A "request" is one chunk the client sent: a PostgreSQL client that waits
        for each reply sends one statement per chunk.
        """
        self._freeze_after = requests

    def _close_all(self) -> None:
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self.mode == "drop":
                client.close()
                continue
            try:
                upstream = socket.create_connection((self.target_host, self.target_port), timeout=2)
            except OSError:
                client.close()
                continue
            if self.keep_idle:
                upstream.settimeout(None)  # the 2 s were for connecting only
            with self._lock:
                self._conns += [client, upstream]
            for src, dst, replies in ((client, upstream, False), (upstream, client, True)):
                threading.Thread(target=self._pump, args=(src, dst, replies), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, replies: bool) -> None:
        epoch, count = self._epoch, 0  # replies forwarded on this connection since a switch
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if self._epoch != epoch:
                    epoch, count = self._epoch, 0
                while self._holds(replies, count) and not self._closed.is_set():
                    time.sleep(0.01)
                if self.mode == "delay" or (self.mode == "trickle" and replies):
                    time.sleep(self.delay)
                if self.mode == "drop":
                    break
                dst.sendall(data)
                count += self._forwarded(replies)
        except OSError:
            pass
        finally:
            # A frozen client closes nothing: the server keeps its session (until close()).
            while self.mode == "freeze" and not self._closed.is_set():
                time.sleep(0.05)
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.close()

    def _forwarded(self, replies: bool) -> int:
        """A chunk went through: switch as armed; returns 1 for a reply (0 for a request)."""
        if not replies:
            # A request: freeze when it was the last one to let through.
            if self._freeze_after is not None:
                self._freeze_after -= 1
                if self._freeze_after <= 0:
                    self._freeze_after = None
                    self.set_mode("freeze")
            return 0
        armed, self._armed = self._armed, None
        if armed is not None:
            self.set_mode(*armed)
            self._close_all()
        return 1

    def _holds(self, replies: bool, count: int) -> bool:
        if self.mode in ("blackhole", "freeze"):
            return True
        return self.mode == "trickle" and replies and count >= self.hang_after

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        self._close_all()
