"""The Grafana dashboard in docs/grafana: importable as is, and querying only exported series."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from celery_leader.observe.metrics import LeaderMetrics
from tests.observe.promtool import promtool

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "celery-leader.json"
DATASOURCE_VARIABLE = "DS_PROMETHEUS"
DATASOURCE_UID = "${DS_PROMETHEUS}"
METRIC_NAME = re.compile(r"celery_leader_[a-z_]+")
VARIABLE = re.compile(r"\$(?:\{(\w+)[^}]*\}|(\w+))")
ELECTION_FILTER = 'election=~"$election"'
#: Grafana's uid rule: at most 40 letters, digits, '-' and '_'.
GRAFANA_UID = re.compile(r"[A-Za-z0-9_-]{1,40}")
QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
#: A label of one scrape target, matched against a fixed value.
TARGET_MATCHER = re.compile(r'\b(instance|job|host|hostname|pod|node)\s*(=~|!~|!=|=)\s*"(?!\$)')
HOST_PORT = re.compile(r"[A-Za-z0-9.-]+:\d{2,5}\b")
#: Grafana's own variables, as a range or a number, for checking queries with promtool.
GRAFANA_BUILTINS = {
    "$__range_s": "3600",
    "$__range": "1h",
    "$__rate_interval": "1m",
    "$__interval": "1m",
}
# The series Prometheus scrapes for each family type, by suffix of the family's name.
SERIES_SUFFIXES = {
    "gauge": ("",),
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
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


def unknown_series(expr: str) -> set[str]:
    """The metric names in PromQL *expr* that no worker exports."""
    return set(METRIC_NAME.findall(expr)) - exported_series()


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


def test_the_data_source_is_a_dashboard_variable():
    """$DS_PROMETHEUS lists the Prometheus data sources, first of the variables (the others
    query through it); no __inputs, so an import substitutes nothing and a provisioned copy
    of the file works as it is."""
    dashboard = load()
    assert "__inputs" not in dashboard
    first = dashboard["templating"]["list"][0]
    assert first["name"] == DATASOURCE_VARIABLE
    assert (first["type"], first["query"]) == ("datasource", "prometheus")
    assert first["multi"] is False and first["includeAll"] is False
    required = {(r["type"], r["id"]) for r in dashboard["__requires"]}
    assert {("grafana", "grafana"), ("datasource", "prometheus")} <= required
    used_types = {panel["type"] for panel in panels(dashboard) if panel["type"] != "row"}
    assert used_types <= {r["id"] for r in dashboard["__requires"] if r["type"] == "panel"}
    assert dashboard["schemaVersion"] >= 36
    assert dashboard["id"] is None


def test_every_query_uses_the_data_source_variable():
    """Panels, targets and query variables all point at ${DS_PROMETHEUS}, none at a fixed uid."""
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


def test_panel_ids_are_unique_and_panels_do_not_overlap():
    """Grafana keys panels by id; two panels on one grid cell hide each other."""
    dashboard = load()
    ids = [panel["id"] for panel in panels(dashboard)]
    assert all(isinstance(i, int) for i in ids)
    assert len(ids) == len(set(ids)), ids
    taken: dict[tuple[int, int], str] = {}
    for panel in panels(dashboard):
        box = panel["gridPos"]
        assert box["x"] + box["w"] <= 24, panel["title"]
        for cell in itertools.product(
            range(box["x"], box["x"] + box["w"]), range(box["y"], box["y"] + box["h"])
        ):
            assert cell not in taken, (panel["title"], taken[cell])
            taken[cell] = panel["title"]


def uids(node: Any) -> Iterator[str]:
    """Every uid in *node* but the data source references."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "uid" and value != DATASOURCE_UID:
                yield value
            elif key != "datasource":
                yield from uids(value)
    elif isinstance(node, list):
        for item in node:
            yield from uids(item)


def test_the_dashboard_uid_is_fixed_and_unique():
    """A fixed uid (an import again replaces the earlier one), valid for Grafana, used once."""
    dashboard = load()
    assert GRAFANA_UID.fullmatch(dashboard["uid"])
    found = list(uids(dashboard))
    assert found == [dashboard["uid"]], found


def hard_coded_targets(expr: str) -> list[str]:
    """The parts of PromQL *expr* that name one scrape target instead of a variable."""
    found = [m.group(0) for m in TARGET_MATCHER.finditer(expr)]
    found += [m.group(0) for q in QUOTED.findall(expr) for m in HOST_PORT.finditer(q)]
    return found


def test_the_target_check_catches_a_fixed_instance():
    """The check below can fail: a fixed instance, job or host:port is reported."""
    assert hard_coded_targets('up{instance="worker-1:9808"}') == [
        'instance="',
        "worker-1:9808",
    ]
    assert hard_coded_targets('x{job="celery"}') == ['job="']
    assert hard_coded_targets('x{election=~"$election"} > 0') == []
    assert hard_coded_targets('x{election=~"proj|10.0.0.5:9808"}') == ["10.0.0.5:9808"]
    assert hard_coded_targets('x{instance=~"$instance"}[$__range:$__interval]') == []


def test_no_query_names_a_fixed_instance_or_host():
    """Queries select processes by $instance only: the dashboard fits any deployment."""
    dashboard = load()
    found = [*queries(dashboard), *variable_queries(dashboard)]
    wrong = {where: hard_coded_targets(expr) for where, expr in found}
    assert {where: parts for where, parts in wrong.items() if parts} == {}


def test_every_query_is_valid_promql(tmp_path: Path):
    """promtool parses each query, with Grafana's variables given values."""
    dashboard = load()
    rules = []
    for n, (_where, query) in enumerate(queries(dashboard)):
        expr = query.replace("$election", ".*").replace("$instance", ".*")
        for variable_name, value in GRAFANA_BUILTINS.items():
            expr = expr.replace(variable_name, value)
        rules.append({"record": f"dashboard:query_{n}", "expr": expr})
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = promtool("check", "rules", path.name, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


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
    known = exported_series() | set(exported_families())
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
