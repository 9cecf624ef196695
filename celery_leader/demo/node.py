"""One lease manager in its own process, reporting events as JSON lines.

Usage: ``python -m celery_leader.demo.node URL NAME TTL NODENAME [LOGFILE]``

Prints ``ready`` once started, then one JSON object per lease event (to
LOGFILE when given, appended atomically line by line, else to stdout).
SIGTERM or SIGINT stops it gracefully: it stops leading, then releases.
Used by the demo, the benchmarks and the multi-process tests.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable

from celery_leader.lease import LeaseEvent, LeaseManager
from celery_leader.lease.timing import LeaseTiming
from celery_leader.stores import open_store
from celery_leader.stores.base import Holder


def event_line(nodename: str, event: LeaseEvent) -> str:
    """The JSON line that reports *event* (lease-clock times, one clock per host)."""
    return json.dumps(
        {
            "holder": nodename,
            "pid": os.getpid(),
            "kind": event.kind.value,
            "token": event.term.token,
            "elected_at": event.term.elected_at,
            "valid_until": event.term.valid_until,
            "at": event.at,
            "reason": event.reason.value if event.reason else None,
        }
    )


def line_writer(logfile: str | None) -> Callable[[str], None]:
    """A thread-safe writer of whole lines to *logfile* (appending) or stdout."""
    lock = threading.Lock()
    if logfile is None:

        def to_stdout(line: str) -> None:
            with lock:
                sys.stdout.write(line + "\n")
                sys.stdout.flush()

        return to_stdout
    fd = os.open(logfile, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def to_file(line: str) -> None:
        with lock:
            os.write(fd, (line + "\n").encode())

    return to_file


def main(argv: list[str] | None = None) -> None:
    """Run one node until SIGTERM/SIGINT."""
    args = sys.argv[1:] if argv is None else argv
    url, name, ttl, nodename, *rest = args
    write = line_writer(rest[0] if rest else None)
    timing = LeaseTiming.create(float(ttl))
    store = open_store(url, timeout=timing.op_timeout)
    manager = LeaseManager(
        store,
        name,
        timing,
        holder=Holder.for_this_process(nodename),
        listeners=(lambda event: write(event_line(nodename, event)),),
    )
    logging.basicConfig(level=logging.WARNING, format=f"{nodename}: %(levelname)s %(message)s")
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    manager.start()
    print("ready", flush=True)
    done.wait()
    manager.stop()
    store.close()


if __name__ == "__main__":
    main()
