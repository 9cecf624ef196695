"""``python -m tests.partition``'s arguments: a bad one names the choices before any bed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_unknown_store_names_the_known_ones() -> None:
    """--store with an unknown kind exits with the kinds it knows, building nothing."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.partition", "--store", "nosuch"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert (
        "--store 'nosuch': expected 'all' or some of redis, postgres, etcd, sentinel, azure, "
        "sentinel-minrep" in done.stderr
    )
