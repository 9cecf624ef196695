"""A fault-injecting TCP proxy, to cut one worker off its lease store.

Sits between a client and a server on loopback. Modes, switched at any time:
``pass`` (forward), ``delay`` (forward each chunk after a pause),
``blackhole`` (accept and hold bytes: connections hang, as on a dead
network), ``drop`` (close every connection and refuse new ones).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from tests.servers import free_port


class FaultProxy:
    """Forward 127.0.0.1:<port> to 127.0.0.1:<target>, with faults on demand."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.mode = "pass"
        self.delay = 0.0
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._listener.settimeout(0.2)
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def set_mode(self, mode: str, delay: float = 0.0) -> None:
        self.mode, self.delay = mode, delay
        if mode == "drop":
            self._close_all()

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
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=2)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                while self.mode == "blackhole" and not self._closed.is_set():
                    time.sleep(0.01)
                if self.mode == "delay":
                    time.sleep(self.delay)
                if self.mode == "drop":
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.close()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        self._close_all()
