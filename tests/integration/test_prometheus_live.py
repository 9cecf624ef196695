"""The shipped alert rules and Grafana dashboard against a live Prometheus and real processes.

A real ``prometheus`` scrapes two prefork workers and a beat every 0.5 s and
evaluates docs/prometheus/celery-leader-rules.yml, with every duration of the
rules divided by 60 (``for: 2m`` waits 2 s, ``[15m]`` looks back 15 s; the
expressions and thresholds are the shipped ones). The test drives one fault
after another (an occurrence sent again, a paused entry, a stalled beat, a
killed watchdog, step-downs, a store outage, a slow store, a leader's
death, a second group of workers under the same name on another store) and
checks that:

* no alert fires while nothing is wrong (at the start);
* each alert fires during its fault, and every alert has cleared after the
  faults ended;
* every query of every dashboard panel, with the dashboard's variables
  substituted, returns series over the run, and each panel that charts an
  event the test caused charts more than 0.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from celery_leader.beat.occurrence import format_slot
from harness.cluster import ROOT, Cluster, Worker
from harness.prometheus import PrometheusServer, scaled_rules
from harness.proxy import FaultProxy
from harness.servers import RedisServer, free_port
from tests.integration.test_beat import wait_sending
from tests.integration.test_metrics_worker import wait_for
from tests.integration.test_run_safety import watchdog_pids

RULES = ROOT / "docs" / "prometheus" / "celery-leader-rules.yml"
DASHBOARD = ROOT / "docs" / "grafana" / "celery-leader.json"
SCALE = 60
SCRAPE = 0.5
TTL = 2.0
BEAT_TTL = 6.0
TASKS = "tests.integration.leaderapp"


class AlertLog:
    """What fired when: a thread reads Prometheus's alerts every 0.25 s.

    ``seen`` holds (time, the alerts firing, the alerts pending) per reading.
    """

    def __init__(self, prometheus: PrometheusServer) -> None:
        self.prometheus = prometheus
        self.seen: list[tuple[float, set[str], set[str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            try:
                alerts = self.prometheus.alerts()
            except (OSError, RuntimeError):
                continue
            firing = {a["labels"]["alertname"] for a in alerts if a["state"] == "firing"}
            pending = {a["labels"]["alertname"] for a in alerts if a["state"] == "pending"}
            self.seen.append((time.time(), firing, pending))

    def firing_since(self, since: float) -> set[str]:
        """Every alert that fired at or after *since*."""
        return set().union(*(firing for at, firing, _ in self.seen if at >= since))

    def raised_since(self, since: float) -> set[str]:
        """Every alert that fired or was pending at or after *since*."""
        return set().union(*(f | p for at, f, p in self.seen if at >= since))

    def fired(self, alert: str, since: float) -> bool:
        return alert in self.firing_since(since)

    def wait_firing(self, alert: str, since: float, timeout: float) -> None:
        """Block until *alert* fired at or after *since*."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.fired(alert, since):
                return
            time.sleep(0.2)
        raise AssertionError(
            f"{alert} did not fire within {timeout:g} s; firing meanwhile: "
            f"{sorted(self.firing_since(since))}"
        )

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def panel_targets(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, query) for every query of every panel."""
    stack = list(dashboard["panels"])
    while stack:
        panel = stack.pop(0)
        stack.extend(panel.get("panels", []))
        for target in panel.get("targets", []):
            if target.get("expr"):
                yield panel["title"], target["expr"]


def substituted(expr: str, election: str, range_s: float) -> str:
    """*expr* with the dashboard's variables as Grafana would fill them for this run."""
    values = {
        # Every election of this run: the workers' and beat's (<name>.beat), as "All" would.
        "election": f"{re.escape(election)}.*",
        "instance": ".*",
        "__rate_interval": "5s",
        "__interval": "1s",
        "__range": f"{int(range_s)}s",
        "__range_s": str(int(range_s)),
    }
    return re.sub(r"\$\{?(\w+)\}?", lambda m: values.get(m.group(1), m.group(0)), expr)


def leader_token(prometheus: PrometheusServer, election: str) -> float | None:
    """The token the leading process of *election* reports, as last scraped."""
    rows = prometheus.query(
        f'max(celery_leader_token{{election="{election}"}} '
        f'and on (instance) celery_leader_is_leader{{election="{election}"}} == 1)'
    )
    return float(rows[0]["value"][1]) if rows else None


class Scenario:
    """Two prefork workers and a beat of one cluster, scraped by *prometheus*; one fault a method.

    Each fault method returns once the alert it should raise fired.
    """

    def __init__(self, cluster: Cluster, prometheus: PrometheusServer, tmp: Path) -> None:
        self.cluster = cluster
        self.prometheus = prometheus
        self.tmp = tmp
        self.ports: dict[str, int] = {}
        self.workers: dict[str, Worker] = {}
        # The workers reach the store through a proxy that can slow its answers.
        assert cluster.store is not None
        self.store_proxy = FaultProxy(cluster.store.port, keep_idle=True)
        self.worker_env = {"LEADER_STORE": f"redis://127.0.0.1:{self.store_proxy.port}/0"}
        for process in ("w1", "w2"):
            self.start_worker(process)
        self.ports["beat1"] = free_port()
        # Beat's lease outlives a 3 s stall (ttl 6 s), and a missed slot is never caught up
        # (its takeover skips it: a "window" skip).
        self.beat = cluster.start_beat(
            env={
                "LEADER_BEAT_METRICS_PORT": str(self.ports["beat1"]),
                "LEADER_TTL": f"{BEAT_TTL:g}",
                "LEADER_BEAT_MISSED": "skip",
            }
        )
        prometheus.scrape(self.ports)
        self.log = AlertLog(prometheus)

    @property
    def name(self) -> str:
        return self.cluster.name

    def start_worker(self, process: str, env: dict[str, str] | None = None) -> Worker:
        self.ports[process] = free_port()
        (worker,) = self.cluster.start(
            1,
            env={
                "LEADER_METRICS_PORT": str(self.ports[process]),
                **self.worker_env,
                **(env or {}),
            },
        )
        self.workers[process] = worker
        return worker

    def celery(self, *args: str) -> None:
        proc = self.cluster.celery("leader", *args)
        assert proc.returncode == 0, proc.stdout + proc.stderr

    def occurrence_sent_again(self) -> None:
        """Four messages of one occurrence: the copies are skipped."""
        slot = datetime.now(timezone.utc).replace(microsecond=0)
        headers = {"leader_occurrence": f"again@{format_slot(slot)}"}
        for i in range(4):
            self.cluster.client.send_task(
                f"{TASKS}.leader_record", args=(i,), queue=f"{self.name}.leader", headers=headers
            )
            time.sleep(0.3)

    def entry_paused(self) -> None:
        """The beat entry paused for a few slots, then resumed."""
        self.celery("schedule", "pause", "tick")
        self.log.wait_firing("CeleryBeatEntryPaused", time.time() - 1, 20)
        self.celery("schedule", "resume", "tick")

    def beat_stalled(self) -> None:
        """The beat stopped for 3 s, within its lease, until three sends were late.

        A stall usually makes one send late; one that ends just before a slot makes none.
        """
        since = time.time()
        for _ in range(6):
            self.beat.signal(signal.SIGSTOP)
            time.sleep(3)
            self.beat.signal(signal.SIGCONT)
            time.sleep(2)
            if self.log.fired("CeleryBeatLateSends", since):
                return

    def beat_stalled_past_its_lease(self) -> None:
        """The beat stopped longer than its lease: taking over again, it skips the missed slot."""
        self.beat.signal(signal.SIGSTOP)
        time.sleep(BEAT_TTL + 2)
        self.beat.signal(signal.SIGCONT)

    def watchdog_killed(self) -> None:
        """The leader's run watchdog SIGKILLed: the worker replaces it."""
        leader = self.cluster.leader_worker()
        os.kill(watchdog_pids(leader)[0], signal.SIGKILL)

    def step_downs(self, count: int = 6) -> None:
        """*count* step-downs in a row, each waited for: leadership flaps.

        Asked through the broker as ``celery leader step-down`` asks, without starting a
        CLI process each time: the flapping window is 15 s here.
        """
        for _ in range(count):
            before = leader_token(self.prometheus, self.name)
            leader = self.cluster.leader_worker()
            replies = self.cluster.client.control.broadcast(
                "leader_step_down", destination=[leader.nodename], reply=True, timeout=3
            )
            assert replies, "the leader did not answer the step-down"
            wait_for(
                lambda b=before: leader_token(self.prometheus, self.name) not in (None, b),
                10 * TTL,
                "a new term after the step-down",
            )

    def store_outage(self) -> None:
        """The store stops answering until nobody has seen a holder for a while."""
        assert self.cluster.store is not None
        since = time.time()
        self.cluster.store.pause()
        try:
            # Errors for 10 m / 60 before the errors alert fires.
            self.log.wait_firing("CeleryNoLeader", since, 30)
            self.log.wait_firing("CeleryLeaderStoreErrors", since, 30)
        finally:
            self.cluster.store.resume()

    def slow_store(self) -> None:
        """Every store answer to the workers comes 0.12 s late: each renewal takes more than
        a quarter of the 0.33 s store timeout, and succeeds (Redis reads get half of it)."""
        since = time.time()
        self.store_proxy.set_mode("trickle", delay=0.12, hang_after=10**9)
        try:
            self.log.wait_firing("CeleryLeaderRenewalSlow", since, 40)
        finally:
            self.store_proxy.set_mode("pass")

    def leader_killed(self) -> None:
        """The leading worker SIGKILLed; a new worker takes its place among the competitors."""
        leader = self.cluster.leader_worker(timeout=30)
        process = next(p for p, w in self.workers.items() if w is leader)
        leader.signal(signal.SIGKILL)
        leader.proc.wait(10)
        wait_for(
            lambda: leader_token(self.prometheus, self.name) is not None,
            10 * TTL,
            "a leader after the kill",
        )
        self.cluster.workers.remove(leader)
        self.start_worker(process)
        self.prometheus.scrape(self.ports)

    def second_group_on_another_store(self) -> None:
        """A worker under the same name on another store leads there: two leaders."""
        other_store = RedisServer(self.tmp).start()
        try:
            rogue = self.start_worker("rogue", {"LEADER_STORE": other_store.url})
            self.prometheus.scrape(self.ports)
            self.log.wait_firing("CeleryTwoLeaders", time.time() - 1, 30)
            rogue.signal(signal.SIGKILL)
            rogue.proc.wait(10)
        finally:
            other_store.stop()
        self.cluster.workers.remove(self.workers.pop("rogue"))
        del self.ports["rogue"]
        self.prometheus.scrape(self.ports)


#: (fault, the alerts it raises, the alerts that must not fire during it), in order.
FAULTS: list[tuple[Callable[[Scenario], None], tuple[str, ...], tuple[str, ...]]] = [
    (Scenario.occurrence_sent_again, ("CeleryLeaderOccurrenceSkipped",), ()),
    (Scenario.entry_paused, ("CeleryBeatEntryPaused",), ("CeleryBeatSlotsSkipped",)),
    (Scenario.beat_stalled, ("CeleryBeatLateSends",), ("CeleryNoLeader",)),
    (Scenario.beat_stalled_past_its_lease, ("CeleryBeatSlotsSkipped",), ()),
    (Scenario.watchdog_killed, ("CeleryLeaderWatchdog",), ("CeleryNoLeader",)),
    # A step-down hands over within a scrape: never "no leader", never "two leaders".
    (Scenario.step_downs, ("CeleryLeaderFlapping",), ("CeleryNoLeader", "CeleryTwoLeaders")),
    (Scenario.store_outage, ("CeleryNoLeader", "CeleryLeaderStoreErrors"), ()),
    (Scenario.slow_store, ("CeleryLeaderRenewalSlow",), ()),
    # A dead leader is replaced within about a ttl: below the no-leader alert's 2 ttl.
    (Scenario.leader_killed, (), ("CeleryNoLeader", "CeleryTwoLeaders")),
    (Scenario.second_group_on_another_store, ("CeleryTwoLeaders",), ()),
]
#: The panels that chart events; each fault above causes at least one of each.
CHARTS_EVENTS = (
    "Term changes",
    "Terms ended",
    "Store errors",
    "Beat schedule",
    "Leader messages skipped",
)


def shipped_alerts() -> set[str]:
    return set(re.findall(r"^\s*- alert:\s*(\w+)", RULES.read_text(encoding="utf-8"), re.M))


def test_every_shipped_alert_has_a_fault_here() -> None:
    """The live test below drives a fault for every alert the rules file ships."""
    driven = {alert for _, alerts, _ in FAULTS for alert in alerts}
    assert shipped_alerts() == driven


def rule_errors(prometheus: PrometheusServer) -> dict[str, str]:
    return {r: h for r, h in prometheus.rule_health().items() if not h.startswith("ok")}


def panels_without_data(
    prometheus: PrometheusServer, election: str, started: float, ended: float
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(queries without series, event queries that charted only 0) over the run."""
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    empty, flat = [], []
    for title, expr in panel_targets(dashboard):
        query = substituted(expr, election, ended - started)
        series = prometheus.query_range(query, started, ended, 1)
        if not series:
            empty.append((title, query))
        elif title in CHARTS_EVENTS and max(float(v) for s in series for _, v in s["values"]) <= 0:
            flat.append((title, query))
    return empty, flat


@pytest.mark.slow
def test_every_alert_fires_on_its_fault_and_clears_and_every_panel_has_data(
    cluster_for, tmp_path: Path
) -> None:
    cluster = cluster_for("redis")
    cluster.env.update(
        {
            "LEADER_TTL": f"{TTL:g}",
            "LEADER_BEAT_EVERY": "1",
            "LEADER_RESULTS": cluster.env["LEADER_HISTORY"],
        }
    )
    rules = scaled_rules(RULES, tmp_path / "rules.yml", SCALE)
    prometheus = PrometheusServer(tmp_path, scrape_interval=SCRAPE, rule_files=(rules,)).start()
    scenario = None
    try:
        scenario = Scenario(cluster, prometheus, tmp_path)
        prometheus.wait_scraping(set(scenario.ports))
        wait_sending(cluster, [scenario.beat], timeout=30)
        cluster.leader_worker()
        started = time.time()
        # Quiet: two workers and a beat in their normal state, longer than any scaled wait
        # (10 m / 60), so that a rule that fires with nothing wrong is seen, pending too.
        time.sleep(15)
        assert not rule_errors(prometheus), rule_errors(prometheus)
        raised = scenario.log.raised_since(started)
        assert not raised, f"alerts fired or pending with nothing wrong: {sorted(raised)}"

        for fault, alerts, quiet in FAULTS:
            since = time.time()
            fault(scenario)
            for alert in alerts:
                scenario.log.wait_firing(alert, since, 30)
            wrongly = scenario.log.firing_since(since) & set(quiet)
            assert not wrongly, f"{fault.__name__} fired {sorted(wrongly)}"

        # Everything clears: the longest window is 1 h / 60 = 60 s.
        deadline = time.monotonic() + 90
        while (firing := prometheus.firing()) and time.monotonic() < deadline:
            time.sleep(1)
        assert not firing, f"still firing after the faults ended: {sorted(firing)}"
        empty, flat = panels_without_data(prometheus, cluster.name, started, time.time())
        assert not empty, f"panels without series: {empty}"
        assert not flat, f"panels that charted 0 for events that happened: {flat}"
    finally:
        if scenario is not None:
            scenario.log.stop()
            scenario.store_proxy.close()
        prometheus.stop()
