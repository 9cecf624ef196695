"""Run Prometheus's ``promtool`` (the ``prometheus`` package; ./run.sh test installs it)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from harness.servers import require_binary


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``promtool *args`` in *cwd*: its output and exit status, whatever the status."""
    command = [require_binary("promtool"), *args]
    return subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )
