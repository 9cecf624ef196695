"""celery-leader's pytest fixtures, used as a project uses them: examples/testing's own suite."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "testing"


def test_the_example_suite_passes_with_the_installed_plugin():
    """The plugin loads through its pytest11 entry point; eager, lost and worker fixtures work."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q"],
        cwd=EXAMPLE,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert re.search(r"^4 passed", out, flags=re.MULTILINE), out[-2000:]


def test_the_fixtures_are_listed_for_users():
    """`pytest --fixtures` shows the leader_* fixtures with their docstrings."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--fixtures", "-q"],
        cwd=EXAMPLE,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    for name in ("leader_lease", "lost_leader_lease", "leader_worker", "leader_lease_token"):
        assert re.search(rf"^{name}\b", proc.stdout, flags=re.MULTILINE), proc.stdout[-3000:]
