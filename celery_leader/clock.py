"""The one clock that lease validity is counted on, in every process of a host.

Validity (``valid_until``) is computed by the lease manager, published to
pool children through shared memory, and compared by the children and the
run watchdog. All of them must read the same clock, and that clock must not
stop while the host is suspended: on Linux ``CLOCK_MONOTONIC`` stands still
during a suspend, so a leader whose laptop or VM slept for a minute would
wake believing its lease still had seconds left, while the store expired it
long ago. ``CLOCK_BOOTTIME`` counts the suspend, never jumps with wall-clock
changes, and is one clock for all processes of a host, so that is the clock
here. The SQLite store measures expiry on it too, so a one-host election has
one clock end to end.

Where ``CLOCK_BOOTTIME`` is missing (not Linux), ``time.monotonic()`` is used,
and a suspended host breaks the timing assumption of guarantee 1.
"""

from __future__ import annotations

import time

_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)


def now() -> float:
    """Seconds on the lease clock: boot time on Linux, else the monotonic clock."""
    if _BOOTTIME is not None:
        return time.clock_gettime(_BOOTTIME)
    return time.monotonic()
