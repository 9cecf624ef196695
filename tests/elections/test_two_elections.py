"""Two elections in one worker process: ending one term touches only that election's work.

Built directly: one :class:`SharedLeases` group with two election slots
whose tokens are equal numbers, real child processes standing for pool
children, and one coordinator with the default election and a named one, as
a worker builds them for ``@leader_only(election="reports")``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from celery_leader import clock
from celery_leader.elections import procinfo
from celery_leader.elections.group import ElectionGroup
from celery_leader.elections.shared_lease import SharedLeases
from celery_leader.settings import load_app_settings
from celery_leader.stores import open_store
from celery_leader.term_end.in_worker import kill_recorded_runs
from celery_leader.term_end.watchdog import enforce_deadlines
from celery_leader.worker import coordinator as coordinator_module

TOKEN = 7  # both elections' current term: equal numbers, unrelated terms


def sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def start_time(proc) -> int:
    deadline = time.monotonic() + 5
    while (started := procinfo.start_time(proc.pid)) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert started
    return started


def record(lease, index, proc, token=TOKEN, terminate=True):
    """Write run-table slot *index* as a pool child running *lease*'s election would."""
    lease.runs._write(
        index, proc.pid, token, int(terminate), start_time(proc), election=lease.election
    )


def test_the_watchdog_ends_only_the_runs_of_the_election_whose_term_ended():
    group = SharedLeases()
    billing, reports = group.add("billing"), group.add("reports")
    billing.publish(TOKEN, clock.now() + 60)
    reports.publish(TOKEN, clock.now() + 60)
    doomed, spared = sleeper(), sleeper()
    try:
        record(billing, 0, doomed)
        record(reports, 1, spared)
        assert enforce_deadlines(group, os.getpid()) == [], "both terms are valid"
        billing.revoke(TOKEN)
        assert [r.pid for r in group.runs.running(TOKEN, election=billing.election)] == [doomed.pid]
        assert enforce_deadlines(group, os.getpid()) == [doomed.pid]
        assert doomed.wait(5) == -signal.SIGKILL
        assert spared.poll() is None, "the other election's run of token 7 lives on"
        assert group.runs.was_killed(doomed.pid, TOKEN, billing.election)
        assert not group.runs.was_killed(doomed.pid, TOKEN, reports.election)
        reports.revoke(TOKEN)
        assert kill_recorded_runs(reports, TOKEN, "test") == [spared.pid]
        assert spared.wait(5) == -signal.SIGKILL
    finally:
        for proc in (doomed, spared):
            proc.kill()
            proc.wait()


class Task:
    leader_only = True
    leader_on_loss = "terminate"
    acks_late = True

    def __init__(self, election):
        self.leader_election = election


class Request:
    """Stands for a Celery request of one election: what the coordinator reads of it.

    The gate records the lease name a request was admitted under; before
    that, its task names its election (None: the default one).
    """

    def __init__(self, election, pid=None, dispatched=False, admitted=True):
        self.task = Task(election)
        self.leader_election = LEASES[election] if admitted else None
        self.leader_token = TOKEN if dispatched else None
        self.worker_pid, self.leader_dispatched = pid, dispatched
        self.acknowledged, self.handed_back = False, False
        self.leader_killed = False

    def hand_back(self, why):
        self.handed_back = True

    def humaninfo(self):
        return f"job of {self.leader_election}"


#: The lease names of the app "app": its default election and the election "reports".
LEASES = {None: "app", "reports": "app.reports"}


def coordinator(group):
    conf = {"leader_backend_url": "memory://two", "leader_name": "app"}
    settings = load_app_settings(conf, "t")
    made = coordinator_module.Coordinator(
        settings.worker,
        open_store("memory://two", timeout=1),
        nodename="w@h",
        pool_kind="prefork",
        group=group,
        lease_of=settings.names.lease_of,
    )
    made.add_election(
        "reports", settings.for_named("reports"), open_store("memory://two", timeout=1)
    )
    return made


def test_ending_one_election_kills_and_hands_back_only_its_own_requests(monkeypatch):
    group = ElectionGroup()
    made = coordinator(group)
    billing, reports = made.default, made.elections["reports"]
    assert billing.shared.group is reports.shared.group is group.shared
    assert [election.name for election in group] == ["app", "app.reports"]
    billing.shared.publish(TOKEN, clock.now() + 60)
    reports.shared.publish(TOKEN, clock.now() + 60)
    billing_child, reports_child = sleeper(), sleeper()
    running = [
        Request(None, billing_child.pid, dispatched=True),
        Request("reports", reports_child.pid, dispatched=True),
    ]
    waiting = [
        Request(None, admitted=False),
        Request("reports", admitted=False),
        Request("reports"),  # admitted on receipt (a message with an expiry), not sent yet
    ]
    record(billing.shared, 0, billing_child)  # each child registered its run
    record(reports.shared, 1, reports_child)
    monkeypatch.setattr(coordinator_module.worker_state, "active_requests", set(running))
    monkeypatch.setattr(coordinator_module.worker_state, "reserved_requests", set(waiting))
    try:
        assert billing.term_end.leader_runs(TOKEN) == [running[0]]
        assert reports.term_end.leader_runs(TOKEN) == [running[1]]
        billing.term_end.end(TOKEN, on_loop=True)
        assert billing_child.wait(5) == -signal.SIGKILL
        assert reports_child.poll() is None
        assert running[0].leader_killed and not running[1].leader_killed
        assert waiting[0].handed_back, "the waiting message of the ended election went back"
        assert not waiting[1].handed_back and not waiting[2].handed_back, (
            "the other election's messages stay"
        )
        assert reports.shared.valid_for(TOKEN), "the other election's term is untouched"
    finally:
        for proc in (billing_child, reports_child):
            proc.kill()
            proc.wait()
        for election in (billing, reports):
            election.manager.store.close()
