"""A store whose extra is not installed: the hint to install it, said once, everywhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.servers import RedisServer
from tests.test_cli import ERROR_PREFIX, celery_runner

AZURE_URL = "azureblob://leases/proj"
#: The one line a worker and the leader commands print when the azure extra is missing.
EXPECTED = (
    f"{ERROR_PREFIX}leader_backend_url={AZURE_URL!r}: the azureblob:// store needs the azure "
    "extra: pip install 'celery-leader[azure]'"
)


def without_azure(app_dir: Path) -> None:
    """Make ``import azure`` fail for processes whose path starts at *app_dir*.

    A package of that name that cannot be imported, found before the installed
    SDK: what a plain ``pip install celery-leader`` (no ``[azure]``) looks like.
    """
    package = app_dir / "azure"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError(\"No module named 'azure'\")\n")


@pytest.mark.parametrize(
    ("command", "args", "code"),
    [("leader", ("status",), 2), ("leader", ("step-down",), 2), ("worker", ("-P", "solo"), 1)],
    ids=["status", "step-down", "worker"],
)
def test_missing_azure_extra_is_one_line_with_the_hint_once(
    tmp_path: Path, redis_server: RedisServer, command: str, args: tuple[str, ...], code: int
) -> None:
    """leader_backend_url = azureblob:// without the extra: one line, 'pip install' once."""
    without_azure(tmp_path)
    run = celery_runner(tmp_path, AZURE_URL, redis_server.url, command=command)
    proc = run(*args, ttl="15", timeout=120)
    assert proc.returncode == code, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error")]
    assert errors == [EXPECTED], proc.stderr
    assert "Traceback" not in proc.stderr
