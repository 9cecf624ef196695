"""An extra not installed (a store's, the metrics'): the hint to install it, said once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.servers import RedisServer, free_port
from tests.test_cli import ERROR_PREFIX, ROOT, celery_runner

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


#: The app of the tests below: its store, and its metrics ports, from the environment.
EXTRAS_APP = """\
import os

from celery import Celery

import celery_leader

app = Celery("extrasapp", broker=os.environ["EXTRAS_BROKER"])
app.conf.leader_backend_url = os.environ["EXTRAS_STORE"]
app.conf.leader_lease_ttl = 15.0  # inside every store's range, Azure's too
if os.environ.get("EXTRAS_METRICS_PORT"):
    app.conf.leader_metrics_port = int(os.environ["EXTRAS_METRICS_PORT"])
    app.conf.leader_beat_metrics_port = int(os.environ["EXTRAS_METRICS_PORT"]) + 1
app.steps["worker"].add(celery_leader.LeaderElection)
"""

#: Each missing extra: the module it installs, the store URL, and the start of the line
#: (which setting asked for it). ``{port}`` is the worker's metrics port, beat's is one more.
MISSING = {
    "postgres": (
        "psycopg",
        "postgresql://app:s3cret-pw@127.0.0.1:1/db",
        "leader_backend_url='postgresql://app:***@127.0.0.1:1/db': the postgresql:// store",
    ),
    "etcd": (
        "requests",
        "etcd://127.0.0.1:1",
        "leader_backend_url='etcd://127.0.0.1:1': the etcd:// store",
    ),
    "azure": ("azure", AZURE_URL, f"leader_backend_url={AZURE_URL!r}: the azureblob:// store"),
    "prometheus": ("prometheus_client", None, None),
}
COMMANDS = {
    "worker": (("worker", "-P", "solo"), 1),
    "beat": (("beat", "-S", "celery_leader.beat:LeaderScheduler"), 1),
    "status": (("leader", "status"), 2),
}


def hide(app_dir: Path, module: str) -> None:
    """Make ``import <module>`` fail for processes whose path starts at *app_dir*.

    A package of that name that cannot be imported, found before the installed
    one: what an install without the extra looks like to the code that needs it.
    """
    package = app_dir / module
    package.mkdir()
    (package / "__init__.py").write_text(f'raise ImportError("No module named {module!r}")\n')


def our_lines(output: str) -> list[str]:
    """The lines of *output*, without Celery's warning to a worker run as root."""
    lines, skipping = [], False
    for line in output.splitlines():
        if "SecurityWarning" in line:
            skipping = True
        if not skipping and line.strip():
            lines.append(line)
        if skipping and "_warn_or_raise_security_error" in line:
            skipping = False
    return lines


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("extra", sorted(MISSING))
def test_a_missing_extra_stops_worker_beat_and_cli_with_one_line(
    tmp_path: Path, redis_server: RedisServer, extra: str, command: str
) -> None:
    """Each extra missing: worker, beat and `leader status` say one line naming the setting
    that asked for it and the pip line, and exit non-zero; no traceback, no password."""
    module, store, start = MISSING[extra]
    args, code = COMMANDS[command]
    hide(tmp_path, module)
    (tmp_path / "extrasapp.py").write_text(EXTRAS_APP)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXTRAS_")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]),
        EXTRAS_BROKER=redis_server.url,
        EXTRAS_STORE=store or redis_server.db_url(1),
    )
    if extra == "prometheus":
        env["EXTRAS_METRICS_PORT"] = str(port)
    if command == "beat":
        args = (*args, "-s", str(tmp_path / "beat-schedule"))
    proc = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "extrasapp", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = proc.stdout + proc.stderr
    assert "Traceback" not in output, output
    assert "s3cret-pw" not in output
    if extra == "prometheus" and command == "status":
        # The leader commands read the store only: no metrics, so no extra needed.
        assert proc.returncode == 1, output
        assert "Error" not in output
        return
    if extra == "prometheus":
        asked = (
            f"leader_beat_metrics_port={port + 1}"
            if command == "beat"
            else (f"leader_metrics_port={port}")
        )
        expected = f"{ERROR_PREFIX}{asked}: metrics need the prometheus extra"
    else:
        expected = f"{ERROR_PREFIX}{start} needs the {extra} extra"
    expected += f": pip install 'celery-leader[{extra}]'"
    assert proc.returncode == code, output
    assert [line for line in our_lines(output) if line.startswith("Error")] == [expected], output
    # Beat says it is starting first (on stdout); nothing else is said.
    assert len(our_lines(output)) <= 2, output
