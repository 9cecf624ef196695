"""The Grafana dashboard in docs/grafana: importable as is, and querying only exported series."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from celery_leader.observe.metrics import LeaderMetrics

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "celery-leader.json"
DATASOURCE_UID = "${DS_PROMETHEUS}"
METRIC_NAME = re.compile(r"celery_leader_[a-z_]+")
VARIABLE = re.compile(r"\$(?:\{(\w+)[^}]*\}|(\w+))")
ELECTION_FILTER = 'election=~"$election"'
# The series Prometheus scrapes for each family type, by suffix of the family's name.
SERIES_SUFFIXES = {
    "gauge": ("",),
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
}
#: Families another change adds to metrics.py alongside the alert rules and the
#: dashboard that use them; allowed here until metrics.py exports them (a test below
#: fails once it does: then drop the entry).
ADDED_ALONGSIDE = {
    "celery_leader_lease_ttl_seconds": "gauge",
    "celery_leader_renew_interval_seconds": "gauge",
    "celery_leader_watchdog_up": "gauge",
    "celery_leader_watchdog_replacements": "counter",
}


@cache
def exported_families() -> dict[str, str]:
    """Family name -> type, as a fresh :class:`LeaderMetrics` registers them."""
    registry = CollectorRegistry()
    LeaderMetrics(registry)
    return {family.name: family.type for family in registry.collect()}


@cache
def exported_series() -> frozenset[str]:
    """Every series name a worker's /metrics can show for the families."""
    return frozenset(
        name + suffix
        for name, kind in exported_families().items()
        for suffix in SERIES_SUFFIXES[kind]
    )


@cache
def known_series() -> frozenset[str]:
    """The exported series and those of the families :data:`ADDED_ALONGSIDE`."""
    added = (
        name + suffix for name, kind in ADDED_ALONGSIDE.items() for suffix in SERIES_SUFFIXES[kind]
    )
    return exported_series() | frozenset(added)


def unknown_series(expr: str) -> set[str]:
    """The metric names in PromQL *expr* that no worker exports."""
    return set(METRIC_NAME.findall(expr)) - known_series()


def load() -> dict[str, Any]:
    """The dashboard, parsed."""
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def panels(container: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, also those nested in (collapsed) rows."""
    for panel in container.get("panels", []):
        yield panel
        yield from panels(panel)


def queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every panel target."""
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            yield f"{panel.get('title')!r} {target.get('refId')}", target.get("expr", "")


def variable_queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, query) of every query variable (a string, or Grafana's object form)."""
    for variable in dashboard["templating"]["list"]:
        if variable.get("type") == "query":
            query = variable["query"]
            yield f"${variable['name']}", query["query"] if isinstance(query, dict) else query


def variable(dashboard: dict[str, Any], name: str) -> dict[str, Any]:
    """The template variable called *name*."""
    found = [v for v in dashboard["templating"]["list"] if v["name"] == name]
    assert found, f"no template variable {name!r}"
    return found[0]


def test_the_checker_catches_a_wrong_metric_name():
    """A typo, a counter without _total, or a gauge with a counter suffix is reported."""
    assert unknown_series('celery_leader_is_leader{election=~"$election"}') == set()
    assert unknown_series("rate(celery_leader_renew_seconds_bucket[5m])") == set()
    assert unknown_series("rate(celery_leader_store_error_total[5m])") == {
        "celery_leader_store_error_total"
    }
    assert unknown_series("increase(celery_leader_elections[5m])") == {"celery_leader_elections"}
    assert unknown_series("celery_leader_is_leader_total") == {"celery_leader_is_leader_total"}


def test_the_families_are_read_from_the_package():
    """The allowed names come from metrics.py itself, with the types Prometheus sees."""
    families = exported_families()
    assert families["celery_leader_is_leader"] == "gauge"
    assert families["celery_leader_elections"] == "counter"
    assert families["celery_leader_renew_seconds"] == "histogram"
    assert "celery_leader_elections_total" in exported_series()


def test_families_added_alongside_are_not_exported_yet():
    """An entry of ADDED_ALONGSIDE that metrics.py now exports is stale: drop it."""
    assert set(ADDED_ALONGSIDE) & set(exported_families()) == set()


def test_the_dashboard_imports_with_a_prometheus_data_source_input():
    """__inputs asks for a Prometheus data source; __requires names Grafana and Prometheus."""
    dashboard = load()
    inputs = {i["name"]: i for i in dashboard["__inputs"]}
    assert inputs["DS_PROMETHEUS"]["type"] == "datasource"
    assert inputs["DS_PROMETHEUS"]["pluginId"] == "prometheus"
    required = {(r["type"], r["id"]) for r in dashboard["__requires"]}
    assert {("grafana", "grafana"), ("datasource", "prometheus")} <= required
    used_types = {panel["type"] for panel in panels(dashboard) if panel["type"] != "row"}
    assert used_types <= {r["id"] for r in dashboard["__requires"] if r["type"] == "panel"}
    assert dashboard["schemaVersion"] >= 36
    assert dashboard["id"] is None


def test_every_query_uses_the_imported_data_source():
    """Panels, targets and variables all point at ${DS_PROMETHEUS}, so import needs no edits."""
    dashboard = load()
    refs = [panel["datasource"] for panel in panels(dashboard) if panel["type"] != "row"]
    refs += [t["datasource"] for panel in panels(dashboard) for t in panel.get("targets", [])]
    refs += [v["datasource"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    assert refs
    assert all(ref == {"type": "prometheus", "uid": DATASOURCE_UID} for ref in refs), refs


def test_every_panel_has_a_title_a_description_and_queries():
    """Each panel says what it shows and queries at least one celery-leader metric."""
    dashboard = load()
    shown = [panel for panel in panels(dashboard) if panel["type"] != "row"]
    assert len(shown) >= 5
    for panel in shown:
        assert panel.get("title", "").strip(), panel
        assert panel.get("description", "").strip(), panel["title"]
        assert panel.get("targets"), panel["title"]
        for target in panel["targets"]:
            assert METRIC_NAME.search(target.get("expr", "")), (panel["title"], target)
    ids = [panel["id"] for panel in panels(dashboard)]
    assert len(ids) == len(set(ids))


def test_queries_name_only_series_the_workers_export():
    """Every metric name in a target or variable query is a series metrics.py exports."""
    dashboard = load()
    found = [*queries(dashboard), *variable_queries(dashboard)]
    assert found
    wrong = {where: unknown_series(expr) for where, expr in found if unknown_series(expr)}
    assert wrong == {}


def test_descriptions_name_only_existing_metrics():
    """A metric named in a description is a family or a series that exists."""
    dashboard = load()
    known = known_series() | set(exported_families()) | set(ADDED_ALONGSIDE)
    for panel in panels(dashboard):
        named = set(METRIC_NAME.findall(panel.get("description", "")))
        assert named <= known, (panel["title"], named - known)


@pytest.mark.parametrize("name", ["election", "instance"])
def test_the_template_variables_list_label_values(name: str):
    """$election and $instance: multi-select with All, from the is_leader series."""
    var = variable(load(), name)
    assert var["type"] == "query"
    assert var["multi"] is True
    assert var["includeAll"] is True
    query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
    assert query.startswith("label_values(celery_leader_is_leader")
    assert query.replace(" ", "").endswith(f",{name})")


def test_every_selector_filters_on_the_election_variable():
    """Each metric in a panel query is selected with election=~"$election"."""
    dashboard = load()
    for where, expr in queries(dashboard):
        for match in METRIC_NAME.finditer(expr):
            rest = expr[match.end() :]
            assert rest.startswith("{"), (where, match.group())
            assert ELECTION_FILTER in rest[: rest.index("}")], (where, match.group())


def test_queries_use_only_defined_variables():
    """Every $variable in a query is a template variable of the dashboard or Grafana's own."""
    dashboard = load()
    defined = {v["name"] for v in dashboard["templating"]["list"]}
    for where, expr in [*queries(dashboard), *variable_queries(dashboard)]:
        for braced, plain in VARIABLE.findall(expr):
            used = braced or plain
            assert used in defined or used.startswith("__"), (where, used)
