"""leaderapp set up with ``celery_leader.install(app)``: its workers take ``--leader-metrics-port``.

A separate module, so that every other integration test runs the app as
``app.steps["worker"].add(LeaderElection)`` alone sets it up.
"""

from __future__ import annotations

from celery_leader import install
from tests.integration.leaderapp import app, leader_record, plain_record

__all__ = ["app", "leader_record", "plain_record"]

install(app)
