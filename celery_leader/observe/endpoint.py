"""The HTTP endpoint of a worker or a beat: ``/metrics`` and ``/healthz`` on one port.

``GET /metrics`` answers Prometheus text from the default registry;
``GET /healthz`` answers the :mod:`celery_leader.observe.health` verdict as JSON,
200 when healthy and 503 when not. Anything else is 404. Requests are not
logged: a probe every few seconds would flood the worker's log.

The server runs in a daemon thread of the process it reports on (a
greenlet under gevent or eventlet, whose hub must be free to answer). One
endpoint per address and port per process.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from celery_leader.observe.health import Verdict
from celery_leader.settings import MetricsSettings
from celery_leader.startup_error import StartupConfigurationError

logger = logging.getLogger(__name__)

HealthSource = Callable[[], Verdict]

_served: dict[tuple[str, int], Endpoint] = {}
_lock = threading.Lock()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    health: HealthSource

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that left early is not an error; anything else is logged, not printed.

        A scraper gives up on a process that stalled (SIGSTOP, a long pause)
        and closes its connection; the answer written after the stall then
        meets a closed socket. The standard library prints a traceback to
        stderr for that, on every scrape timeout.
        """
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, TimeoutError)):
            return
        logger.warning(
            "celery-leader: /metrics or /healthz request from %s failed",
            client_address[0] if client_address else "?",
            exc_info=error,
        )


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path == "/metrics":
            self._metrics()
        elif path in ("/healthz", "/health"):
            self._health()
        else:
            self._answer(404, "text/plain; charset=utf-8", b"not found: try /metrics or /healthz\n")

    def _metrics(self) -> None:
        from prometheus_client import (  # noqa: PLC0415 - optional extra, checked at start
            CONTENT_TYPE_LATEST,
            REGISTRY,
            generate_latest,
        )

        self._answer(200, CONTENT_TYPE_LATEST, generate_latest(REGISTRY))

    def _health(self) -> None:
        try:
            verdict = self.server.health()
        except Exception:  # a probe must get an answer, not a dropped connection
            logger.exception("celery-leader: the health check raised")
            verdict = Verdict(False, "check-failed")
        body = json.dumps(verdict.as_dict()).encode() + b"\n"
        self._answer(200 if verdict.healthy else 503, "application/json", body)

    def _answer(self, code: int, content_type: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Say nothing per request (see the module docstring)."""


class Endpoint:
    """``/metrics`` and ``/healthz`` served on *address*:*port* from a daemon thread."""

    def __init__(self, address: str, port: int, health: HealthSource) -> None:
        self.pid = os.getpid()
        self.server = _Server((address, port), _Handler)
        self.server.health = health
        self.thread = threading.Thread(
            target=self.server.serve_forever, name="celery-leader-http", daemon=True
        )
        self.thread.start()

    @property
    def port(self) -> int:
        """The port it listens on."""
        return int(self.server.server_address[1])

    def close(self) -> None:
        """Stop serving and free the port."""
        self.server.shutdown()
        self.server.server_close()


def serve_at_start(metrics: MetricsSettings, health: HealthSource) -> Endpoint:
    """Serve on the port *metrics* names, or stop the worker or beat with one line naming it.

    The line names the port as it was given (``metrics.port_from``): the
    setting, the environment variable or the worker option.
    """
    assert metrics.port is not None
    try:
        return serve(metrics.address, metrics.port, health)
    except OSError as exc:
        raise StartupConfigurationError(
            f"celery-leader: {metrics.port_from}={metrics.port} cannot be served: {exc}"
        ) from None


def serve(address: str, port: int, health: HealthSource) -> Endpoint:
    """Serve on *address*:*port* (once per process); raises OSError when the port is taken."""
    with _lock:
        endpoint = _served.get((address, port))
        if endpoint is not None and endpoint.pid != os.getpid():
            # Inherited through a fork (an embedded beat): its thread stayed in the
            # parent, which holds the port; binding it here says so.
            endpoint = None
        if endpoint is None:
            endpoint = Endpoint(address, port, health)
            _served[(address, port)] = endpoint
            shown = f"[{address}]" if ":" in address else address
            everywhere = " (every interface: set leader_metrics_address to narrow it)"
            logger.info(
                "celery-leader: serving /metrics and /healthz on http://%s:%d%s",
                shown,
                endpoint.port,
                everywhere if address in ("0.0.0.0", "::", "") else "",  # noqa: S104 - names it
            )
        else:
            endpoint.server.health = health
        return endpoint
