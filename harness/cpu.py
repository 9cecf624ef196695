"""CPU seconds of processes, read from ``/proc`` (Linux), for benchmarks."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def cpu_seconds(selected: Callable[[int, int, int], bool]) -> float:
    """User + system CPU seconds of every live process for which ``selected(pid, ppid, pgid)``."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if selected(int(entry.name), int(fields[1]), int(fields[2])):
            total += (int(fields[11]) + int(fields[12])) / tick
    return total
