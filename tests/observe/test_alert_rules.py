"""The Prometheus alert rules in docs/prometheus: valid, unit-tested, runbooked, exported.

``promtool`` (the ``prometheus`` package, installed by ``./run.sh test``) checks
the rules and runs their unit tests, celery-leader-rules.test.yml; the tests
below also break single alerts on purpose and expect those unit tests to fail,
so that a unit test that can never fail does not pass for one that works.
"""

from __future__ import annotations

import re
import shutil
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.observe.promtool import promtool
from tests.observe.test_grafana_dashboard import METRIC_NAME, unknown_series

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "docs" / "prometheus" / "celery-leader-rules.yml"
RULE_TESTS = RULES.with_name("celery-leader-rules.test.yml")
RUNBOOK = ROOT / "docs" / "alerts.md"
RUNBOOK_PAGE = "https://celery-leader.readthedocs.io/en/latest/alerts.html"
SEVERITIES = {"critical", "warning", "info"}
ALERT_NAME = re.compile(r"Celery[A-Z][A-Za-z]+")
#: One number and one unit: a test of the rules against a live Prometheus scales these.
PLAIN_DURATION = re.compile(r"\d+(ms|[smhdwy])")
RANGE = re.compile(r"\[([^\]]*)\]")


@cache
def rules() -> list[dict[str, Any]]:
    """The alerting rules of the one group, as written."""
    document = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    (group,) = document["groups"]
    assert group["name"] == "celery-leader"
    return list(group["rules"])


def alert_names() -> list[str]:
    return [rule["alert"] for rule in rules()]


def test_promtool_accepts_the_rules():
    """The file parses, every expression is valid PromQL, and no rule is duplicated."""
    result = promtool("check", "rules", "--lint=all", "--lint-fatal", RULES.name, cwd=RULES.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


def test_the_unit_tests_pass():
    """promtool test rules: each alert fires on its fault and not in the healthy cases."""
    result = promtool("test", "rules", RULE_TESTS.name, cwd=RULES.parent)
    assert result.returncode == 0, result.stdout + result.stderr


def test_each_alert_has_a_firing_and_a_quiet_case():
    """Every alert is expected to fire at some evaluation and to stay quiet at another."""
    document = yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))
    assert document["rule_files"] == [RULES.name]
    fires: set[str] = set()
    quiet: set[str] = set()
    for group in document["tests"]:
        for case in group["alert_rule_test"]:
            (fires if case.get("exp_alerts") else quiet).add(case["alertname"])
    assert fires == quiet == set(alert_names())


def test_rules_query_only_exported_series():
    """Every metric name of an expression, and of the unit tests' input, is exported."""
    expressions = {rule["alert"]: rule["expr"] for rule in rules()}
    wrong = {name: unknown_series(expr) for name, expr in expressions.items()}
    assert {name: found for name, found in wrong.items() if found} == {}
    test_input = RULE_TESTS.read_text(encoding="utf-8")
    assert METRIC_NAME.search(test_input)
    assert unknown_series(test_input) == set()


def test_each_alert_is_labelled_and_links_its_runbook_section():
    """severity, summary, description, and a runbook_url whose anchor is a heading of alerts.md."""
    headings = re.findall(r"^## (\S+)$", RUNBOOK.read_text(encoding="utf-8"), flags=re.MULTILINE)
    for rule in rules():
        name = rule["alert"]
        assert ALERT_NAME.fullmatch(name), name
        assert rule["labels"]["severity"] in SEVERITIES, name
        annotations = rule["annotations"]
        assert set(annotations) == {"summary", "description", "runbook_url"}, name
        assert annotations["summary"].strip() and annotations["description"].strip(), name
        # MyST names a heading's anchor after its text, lower case.
        assert annotations["runbook_url"] == f"{RUNBOOK_PAGE}#{name.lower()}", name
    assert headings == alert_names()


def test_windows_and_waits_are_plain_durations():
    """Every ``for`` and range window is one number and one unit (5m, not 1h30m or 5m:1m)."""
    for rule in rules():
        if "for" in rule:
            assert PLAIN_DURATION.fullmatch(rule["for"]), (rule["alert"], rule["for"])
        for window in RANGE.findall(rule["expr"]):
            assert PLAIN_DURATION.fullmatch(window), (rule["alert"], window)


def run_broken(tmp_path: Path, alert: str, field: str, old: str, new: str) -> str:
    """Run the unit tests against the rules with *old* replaced by *new* in *alert*'s *field*.

    Returns promtool's output; fails unless promtool reported a failure of *alert*.
    """
    document = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    (rule,) = [r for r in document["groups"][0]["rules"] if r.get("alert") == alert]
    assert rule[field].count(old) == 1, (alert, field, old)
    rule[field] = rule[field].replace(old, new)
    (tmp_path / RULES.name).write_text(yaml.safe_dump(document, sort_keys=False))
    shutil.copy(RULE_TESTS, tmp_path)
    result = promtool("test", "rules", RULE_TESTS.name, cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert f"alertname: {alert}," in output, output
    return output


@pytest.mark.parametrize("alert", alert_names())
def test_an_alert_that_never_fires_fails_its_tests(tmp_path: Path, alert: str):
    """With an expression that returns nothing, the alert's firing case fails."""
    (rule,) = [r for r in rules() if r["alert"] == alert]
    run_broken(tmp_path, alert, "expr", rule["expr"], "vector(1) == 0")


#: (alert, field, old, new): a plausible mistake, and the quiet case it breaks.
MISTAKES = {
    "no-leader-after-one-ttl": ("CeleryNoLeader", "expr", "> 2 * max", "> 1 * max"),
    "no-leader-from-the-oldest-sighting": ("CeleryNoLeader", "expr", "min by", "max by"),
    "no-leader-ignoring-is-leader": (
        "CeleryNoLeader",
        "expr",
        "and on (election)\n(max by (election) (celery_leader_is_leader) == 0)",
        "",
    ),
    "two-leaders-after-one-scrape": ("CeleryTwoLeaders", "for", "2m", "15s"),
    "two-leaders-counting-scrapes": (
        "CeleryTwoLeaders",
        "expr",
        "count by (election) (max by (election, instance) (celery_leader_is_leader) == 1) > 1",
        "sum by (election) (celery_leader_is_leader) > 1",
    ),
    "flapping-at-four-terms": ("CeleryLeaderFlapping", "expr", ">= 5", ">= 4"),
    "renewal-slow-at-a-tenth-of-a-percent": (
        "CeleryLeaderRenewalSlow",
        "expr",
        "> 0.01",
        "> 0.001",
    ),
    "watchdog-replaced-at-none": ("CeleryLeaderWatchdog", "expr", "> 0)", ">= 0)"),
    "watchdog-up-as-down": (
        "CeleryLeaderWatchdog",
        "expr",
        "watchdog_up) == 0",
        "watchdog_up) >= 0",
    ),
    "store-errors-at-one-error": ("CeleryLeaderStoreErrors", "for", "10m", "1m"),
    "late-sends-at-one": ("CeleryBeatLateSends", "expr", ">= 3", "> 0"),
    "slots-skipped-any-reason": ("CeleryBeatSlotsSkipped", "expr", '{reason="window"}', ""),
    "paused-any-reason": ("CeleryBeatEntryPaused", "expr", '{reason="paused"}', ""),
    "occurrences-any-reason": (
        "CeleryLeaderOccurrenceSkipped",
        "expr",
        '{reason="occurrence"}',
        "",
    ),
}


@pytest.mark.parametrize("mistake", MISTAKES)
def test_a_plausible_mistake_fails_a_quiet_case(tmp_path: Path, mistake: str):
    """A looser threshold, wait or filter makes the alert fire where the tests say it must not."""
    run_broken(tmp_path, *MISTAKES[mistake])
