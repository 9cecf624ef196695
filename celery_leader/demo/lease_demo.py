"""A demo of the lease itself: several processes elect one leader on one host.

It starts NODES processes (each a lease manager, see :mod:`.node`) on a lease
store (a SQLite file in a temporary directory unless told otherwise), shows
who leads and with which fencing token, SIGKILLs the leader and measures the
failover, then stops the new leader gracefully and measures the handover.
Every process it started is gone when it returns, Ctrl-C included.
"""

from __future__ import annotations

import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from celery_leader._masking import mask_url
from celery_leader.demo.group import NodeGroup


@dataclass
class DemoResult:
    """What the demo measured."""

    first_leader: str = ""
    first_token: int = 0
    failover_leader: str = ""
    failover_token: int = 0
    failover_seconds: float = 0.0
    handover_leader: str = ""
    handover_token: int = 0
    handover_seconds: float = 0.0


@contextmanager
def _store_url(store: str | None) -> Iterator[str]:
    if store:
        yield store
        return
    with tempfile.TemporaryDirectory(prefix="celery-leader-demo-") as tmp:
        yield f"sqlite:///{tmp}/leader.db"


def run_lease_demo(
    *,
    store: str | None = None,
    nodes: int = 3,
    ttl: float = 3.0,
    lead_for: float = 3.0,
    out: Callable[[str], None] = print,
) -> DemoResult:
    """Run the demo and return its measurements; prints a narrative through *out*."""
    result = DemoResult()
    started = time.monotonic()

    def say(text: str) -> None:
        out(f"[{time.monotonic() - started:6.2f}s] {text}")

    def show(event: dict[str, Any]) -> None:
        kind = event["kind"]
        if kind == "renewed":
            return
        detail = f" ({event['reason']})" if event.get("reason") else ""
        say(f"{event['holder']}: {kind} term with token {event['token']}{detail}")

    with _store_url(store) as url:
        cluster = NodeGroup(url, "demo", ttl)
        try:
            say(f"lease store: {mask_url(url)}; ttl {ttl:g} s; starting {nodes} nodes")
            for i in range(1, nodes + 1):
                cluster.start(f"node-{i}")
            say("a new store has no token history: the first leader holds off one ttl")
            first = cluster.wait_elected(ttl * 3 + 10, show)
            result.first_leader, result.first_token = first["holder"], first["token"]
            time.sleep(lead_for)

            def replace(leader: str, sig: signal.Signals) -> tuple[str, int, float]:
                """Signal *leader*; return the next leader, its token and the seconds taken."""
                signalled_at = time.monotonic()
                cluster.signal(leader, sig)
                elected = cluster.wait_elected(ttl * 3 + 10, show, exclude=leader)
                return elected["holder"], elected["token"], elected["elected_at"] - signalled_at

            say(f"SIGKILL {result.first_leader} (the leader): its lease must run out")
            (result.failover_leader, result.failover_token, result.failover_seconds) = replace(
                result.first_leader, signal.SIGKILL
            )
            say(f"failover took {result.failover_seconds:.2f} s")
            cluster.start(f"{result.first_leader}-restarted")
            time.sleep(lead_for)

            say(f"SIGTERM {result.failover_leader} (graceful): it releases the lease")
            (result.handover_leader, result.handover_token, result.handover_seconds) = replace(
                result.failover_leader, signal.SIGTERM
            )
            say(f"handover took {result.handover_seconds:.2f} s")
        finally:
            cluster.stop_all()
    out(summary(result, ttl))
    return result


def summary(result: DemoResult, ttl: float) -> str:
    """The closing table of the demo."""
    return "\n".join(
        [
            "",
            "summary",
            f"  first leader        {result.first_leader:<22} token {result.first_token}",
            f"  failover (SIGKILL)  {result.failover_leader:<22} token {result.failover_token}"
            f"  in {result.failover_seconds:.2f} s (ttl {ttl:g} s)",
            f"  handover (SIGTERM)  {result.handover_leader:<22} token {result.handover_token}"
            f"  in {result.handover_seconds:.2f} s",
            "  tokens increased: "
            f"{result.first_token < result.failover_token < result.handover_token}",
        ]
    )
