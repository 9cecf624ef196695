"""celery-leader's ``celery worker`` options: added by install(app), once, and shown by --help."""

from __future__ import annotations

import subprocess
import sys

from celery import Celery

from celery_leader import install
from harness.cluster import ROOT


def test_install_adds_the_metrics_port_option_once():
    """install(app) twice: one --leader-metrics-port, read by no other environment variable."""
    app = Celery("options-test", broker="memory://")
    install(app)
    install(app)
    options = [o for o in app.user_options["worker"] if "--leader-metrics-port" in o.opts]
    assert len(options) == 1
    (option,) = options
    assert option.name == "leader_metrics_port", "the keyword the worker step reads"
    assert option.allow_from_autoenv is False
    assert "CELERY_LEADER_METRICS_PORT" in option.help


def test_celery_worker_help_lists_the_option():
    """`celery -A <app> worker --help` of an app set up by install() shows the option."""
    proc = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.integration.optionsapp", "worker", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    help_text = " ".join(proc.stdout.split())
    assert "Leader Election Options: --leader-metrics-port PORT" in help_text, proc.stdout
    assert "overrides leader_metrics_port and CELERY_LEADER_METRICS_PORT" in help_text
