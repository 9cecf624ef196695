"""The HTTP endpoint itself: a client that leaves before its answer is not an error."""

from __future__ import annotations

import socket
import struct
import threading
import time
import urllib.request

from celery_leader.observe.endpoint import Endpoint
from celery_leader.observe.health import Verdict
from harness.servers import free_port


def test_a_scraper_that_gave_up_leaves_no_traceback_and_the_endpoint_serves_on(capfd):
    """A scraper times out on a stalled process and resets its connection; the answer
    written afterwards meets a closed socket. Nothing is printed, and the next request
    is answered."""
    answering = threading.Event()

    def slow_health() -> Verdict:
        answering.set()
        time.sleep(0.3)  # the client resets its connection meanwhile
        return Verdict(True, "ok", {"padding": "x" * 200_000})

    endpoint = Endpoint("127.0.0.1", free_port(), slow_health)
    try:
        for _ in range(3):
            answering.clear()
            client = socket.create_connection(("127.0.0.1", endpoint.port))
            client.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert answering.wait(5)
            # Linger 0: close sends a reset, as a scraper's timeout does.
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()
        time.sleep(0.8)
        with urllib.request.urlopen(f"http://127.0.0.1:{endpoint.port}/healthz", timeout=5) as r:
            assert r.status == 200
    finally:
        endpoint.close()
    printed = capfd.readouterr()
    assert "Traceback" not in printed.err + printed.out, printed.err
