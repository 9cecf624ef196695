"""The test app with named elections: leaderapp's tasks, plus tasks of "billing" and "reports".

A separate module, so that workers of every other integration test take part
in the default election only. LEADER_EXCLUDE (comma-separated) sets
``leader_elections_exclude``; LEADER_ELECTIONS sets ``leader_elections``;
LEADER_RECORDERS (comma-separated) adds a recording task ``<election>_record``
for each election it names.
"""

from __future__ import annotations

import os

from celery_leader import leader_only, lease_lost
from tests.integration.leaderapp import app, leader_record, plain_record, record

__all__ = ["app", "billing_record", "leader_record", "plain_record", "reports_record"]

if os.environ.get("LEADER_EXCLUDE"):
    app.conf.leader_elections_exclude = os.environ["LEADER_EXCLUDE"].split(",")
if os.environ.get("LEADER_ELECTIONS"):
    app.conf.leader_elections = os.environ["LEADER_ELECTIONS"].split(",")


def _recorder(election):
    """A leader-only task of *election* that records its start and end."""

    def run(self, i):
        record("start", self, i=i, election=election, lost=lease_lost())
        record("end", self, i=i, election=election)
        return i

    task = app.task(bind=True, name=f"{__name__}.{election}_record")(run)
    return leader_only(election=election)(task)


billing_record = _recorder("billing")
reports_record = _recorder("reports")
for _election in filter(None, os.environ.get("LEADER_RECORDERS", "").split(",")):
    _recorder(_election)

if os.environ.get("LEADER_BEAT_EVERY"):
    # A beat entry may target a named election's task like any other: beat's own
    # election decides who sends, the task's election who runs it.
    app.conf.beat_schedule["billing-tick"] = {
        "task": f"{__name__}.billing_record",
        "schedule": float(os.environ["LEADER_BEAT_EVERY"]),
        "args": (-1,),
    }
