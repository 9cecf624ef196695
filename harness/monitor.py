"""What clients ask a Redis server, counted from outside: round trips, not script internals."""

from __future__ import annotations

import time
from collections import Counter

import redis


def round_trips(port: int, window: float, host: str = "127.0.0.1") -> Counter[str]:
    """Commands clients sent the Redis at *host*:*port* during *window* seconds, by name.

    Read with MONITOR: the commands a script runs inside Redis are marked
    ``lua`` there and left out, so a script counts once, as the EVALSHA (or
    EVAL) that ran it. MONITOR shows only what arrives, so the window ends at
    the first command after it (a server that leads or follows elections
    hears from its workers at least once per renew interval).
    """
    found: Counter[str] = Counter()
    client = redis.Redis(host=host, port=port)
    deadline = time.monotonic() + window
    try:
        with client.monitor() as monitor:
            while time.monotonic() < deadline:
                command = monitor.next_command()
                if command["client_type"] != "lua":
                    found[command["command"].split(" ", 1)[0].upper()] += 1
    finally:
        client.close()
    return found
