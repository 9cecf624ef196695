"""The docs' examples cannot rot: every one is a file a test runs, and every command parses.

The pages show code only by including files of docs/examples/ (checked
below: no Python, YAML, SQL or unit file is typed into a page), and every
included file is listed in ``RUN_BY`` with the test that runs it (checked
below too). This module runs the
examples that no other test runs: the task, election, overlap, fencing,
beat, signal and metrics snippets on the real package (fencing on a real
redis-server, sending by name onto a real broker), and the deployment files
(Kubernetes manifests, systemd units) against the ports and commands the
package really has. The Quickstart, Django, Testing and PostgreSQL examples
are run by tests/test_docs_quickstart.py, tests/test_docs_django.py,
tests/test_docs_testing.py and tests/stores/test_postgres.py, the alert
rules of docs/prometheus by tests/observe/test_alert_rules.py.

Every ``celery ... leader ...`` line of the docs and the README is checked
against the click commands: a renamed command or option fails here.
"""

from __future__ import annotations

import configparser
import json
import logging
import re
import shlex
import sys
from pathlib import Path
from types import ModuleType

import click
import pytest
import redis
import yaml

from celery_leader import LeaseError, LeaseLost
from celery_leader.cli import leader
from celery_leader.testing import leadership

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
EXAMPLES = DOCS / "examples"
#: Pages not written by hand here: the benchmarks' report (benchmarks/report.py writes
#: it) and the changelog (an include of CHANGELOG.md). The dashboard's notes keep their
#: one YAML block inline so that they read on their own; a test below checks it.
NOT_CHECKED_FOR_INLINE_CODE = {"benchmarks.md", "changelog.md", "grafana/README.md"}
#: Languages whose blocks must come from a file: code a reader copies and runs.
CODE_LANGUAGES = {"python", "py", "yaml", "yml", "sql", "postgresql", "ini", "toml", "json"}
FENCE = re.compile(r"^([ \t]*)```(\S*)[^\n]*\n(.*?)^\1```[ \t]*$", flags=re.MULTILINE | re.DOTALL)
INCLUDE = re.compile(r"^\s*```\{literalinclude\}\s+(\S+)", flags=re.MULTILINE)
DOCS_SITE = "https://celery-leader.readthedocs.io/en/latest/"

_HERE = "tests/test_docs_examples.py::"
_DJANGO = "tests/test_docs_django.py::test_the_django_page_runs_as_written"
#: Every file the pages include, and the test that runs it (or checks it against the code).
RUN_BY = {
    "examples/quickstart/proj.py": "tests/test_docs_quickstart.py::test_quickstart_runs_as_written",
    "examples/django/proj/settings.py": _DJANGO,
    "examples/django/proj/celery.py": _DJANGO,
    "examples/django/unled-beat-refusal.txt": _DJANGO,
    "examples/testing/shop.py": "tests/test_docs_testing.py::test_the_suite_passes_as_written",
    "examples/testing/conftest.py": "tests/test_docs_testing.py::test_the_suite_passes_as_written",
    "examples/testing/test_shop.py": "tests/test_docs_testing.py::test_the_suite_passes_as_written",
    "examples/postgres/schema.sql": (
        "tests/stores/test_postgres.py::test_the_docs_print_the_schema_the_store_creates"
    ),
    "examples/tasks.py": _HERE + "test_task_forms_run_under_a_lease_and_stop_when_it_is_lost",
    "examples/elections.py": _HERE + "test_named_election_example",
    "examples/singleton.py": _HERE + "test_overlap_example",
    "examples/fencing.py": _HERE + "test_fenced_writes_refuse_a_stale_token",
    "examples/beat_settings.py": _HERE + "test_beat_example_settings_are_accepted",
    "examples/signals.py": _HERE + "test_signal_handlers_log",
    "examples/metrics_settings.py": (
        _HERE + "test_kubernetes_manifests_probe_the_health_endpoint_on_the_metrics_ports"
    ),
    "prometheus/celery-leader-rules.yml": (
        "tests/observe/test_alert_rules.py::test_rules_query_only_exported_series"
    ),
    "examples/kubernetes/worker.yaml": (
        _HERE + "test_kubernetes_manifests_probe_the_health_endpoint_on_the_metrics_ports"
    ),
    "examples/kubernetes/beat.yaml": (
        _HERE + "test_kubernetes_manifests_probe_the_health_endpoint_on_the_metrics_ports"
    ),
    "examples/systemd/celery-worker@.service": (
        _HERE + "test_systemd_units_stop_warmly_and_escape_celerys_percent"
    ),
    "examples/systemd/celery-beat.service": (
        _HERE + "test_systemd_units_stop_warmly_and_escape_celerys_percent"
    ),
}


def pages() -> list[Path]:
    return sorted(path for path in DOCS.rglob("*.md") if "_build" not in path.parts)


def load(path: Path, name: str, replace: tuple[str, str] | None = None) -> ModuleType:
    """Execute the example file *path* as module *name* (its URLs optionally replaced)."""
    source = path.read_text()
    if replace:
        source = source.replace(*replace)
    module = ModuleType(name)
    module.__file__ = str(path)
    sys.modules[name] = module
    exec(compile(source, str(path), "exec"), module.__dict__)
    return module


@pytest.fixture
def clean_modules():
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("docs_example_"):
            del sys.modules[name]


# --- the pages show code only from files that tests run ----------------------------------


def test_pages_show_code_only_from_included_files():
    """No page types a code block in: each comes from a file of docs/examples/."""
    typed = []
    for page in pages():
        if str(page.relative_to(DOCS)) in NOT_CHECKED_FOR_INLINE_CODE:
            continue
        for _, language, _ in FENCE.findall(page.read_text()):
            if language.lower() in CODE_LANGUAGES:
                typed.append(f"{page.relative_to(DOCS)}: {language}")
    assert not typed, typed


def test_every_included_file_exists_and_is_run_by_a_test():
    """Each file a page includes is there and listed in RUN_BY, whose tests exist."""
    included = set()
    for page in pages():
        for target in INCLUDE.findall(page.read_text()):
            path = (page.parent / target).resolve()
            assert path.is_file(), f"{page.relative_to(DOCS)} includes {target}"
            included.add(path.relative_to(DOCS).as_posix())
    assert included == set(RUN_BY), included ^ set(RUN_BY)
    for test in set(RUN_BY.values()):
        module, name = test.split("::")
        assert f"\ndef {name}(" in (ROOT / module).read_text(), test


def test_every_example_file_is_shown_somewhere():
    """No example file is left unshown (a stale copy no page includes)."""
    text = "\n".join(page.read_text() for page in pages())
    files = [
        path.relative_to(DOCS).as_posix()
        for path in EXAMPLES.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    ]
    assert [name for name in files if name not in text] == []


# --- commands ---------------------------------------------------------------------------


def leader_command_lines() -> list[tuple[str, list[str]]]:
    """Every ``celery ... leader ...`` command of the docs' shell blocks and the README."""
    found = []
    for path in [ROOT / "README.md", *pages()]:
        for _, language, body in FENCE.findall(path.read_text()):
            if language not in {"sh", "console", "bash"}:
                continue
            for raw in body.splitlines():
                line = raw.strip().removeprefix("$ ").split("  #", 1)[0].strip()
                words = shlex.split(line) if line.startswith(("celery ", "docker ")) else []
                if "celery" in words and "leader" in words:
                    found.append((path.name, words[words.index("leader") + 1 :]))
    return found


def check_leader_command(args: list[str]) -> str:
    """The command *args* names under ``celery leader``; every option it gives exists."""
    command: click.Command = leader
    context = click.Context(leader)
    while isinstance(command, click.Group) and args and not args[0].startswith("-"):
        sub = command.get_command(context, args[0])
        assert sub is not None, f"no command {args[0]!r} under {command.name!r}"
        command, args = sub, args[1:]
    known = {"--help"} | {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
    unknown = [arg for arg in args if arg.startswith("-") and arg.split("=")[0] not in known]
    assert not unknown, f"{command.name}: no option {unknown}"
    return str(command.name)


def test_every_leader_command_in_the_docs_exists():
    """status, step-down and schedule lines name real commands and real options."""
    lines = leader_command_lines()
    names = {check_leader_command(args) for _, args in lines}
    assert {"status", "step-down", "list", "pause", "resume", "run"} <= names, names


def test_the_command_check_fails_on_a_wrong_option():
    """The check above can fail: an option the command lacks is reported."""
    with pytest.raises(AssertionError, match="--bogus"):
        check_leader_command(["status", "--bogus"])
    with pytest.raises(AssertionError, match="stauts"):
        check_leader_command(["stauts"])


def test_readme_links_into_the_docs_name_pages_that_exist():
    """The README's links into the docs site point at pages the site has."""
    readme = (ROOT / "README.md").read_text()
    links = re.findall(re.escape(DOCS_SITE) + r"([\w/.-]+)\.html", readme)
    assert len(links) >= 10, links
    assert [link for link in links if not (DOCS / f"{link}.md").is_file()] == []


# --- the Python examples, run ----------------------------------------------------------


def test_task_forms_run_under_a_lease_and_stop_when_it_is_lost(clean_modules):
    """examples/tasks.py: the three forms are leader-only; reindex stops on a lost lease,
    export_rows polls and returns early."""
    tasks = load(EXAMPLES / "tasks.py", "docs_example_tasks")
    for task in (tasks.aggregate, tasks.compact, tasks.sweep):
        assert getattr(task, "leader_only", False), task.name
    assert tasks.compact.leader_on_loss == "terminate"
    with leadership(token=7) as lease:
        assert tasks.aggregate.apply(args=("2026-12-01",)).get() == 7
        assert tasks.reindex.apply(args=(3,)).get() == 3
        assert tasks.export_rows.apply(args=(5,)).get() == 5
        lease.lose()
        with pytest.raises(LeaseLost):
            tasks.reindex.apply(args=(3,)).get()
        assert tasks.export_rows.apply(args=(5,)).get() == 0


def test_send_by_name_reaches_the_leader_queue(redis_server, clean_modules):
    """examples/tasks.py: a process that only names the tasks sends them to proj.leader."""
    url = f"redis://127.0.0.1:{redis_server.port}"
    tasks = load(
        EXAMPLES / "tasks.py", "docs_example_send", replace=("redis://127.0.0.1:6379", url)
    )
    sender = tasks.send_by_name()
    try:
        client = redis.Redis.from_url(f"{url}/0")
        (message,) = client.lrange("proj.leader", 0, -1)
        assert json.loads(message)["headers"]["task"] == "proj.tasks.nightly_rollup"
        assert client.llen("celery") == 0
    finally:
        sender.close()


def test_named_election_example(clean_modules):
    """examples/elections.py: settle belongs to election billing, with its own queue."""
    from celery_leader.settings import app_settings
    from celery_leader.tasks import leader_queue_for

    elections = load(EXAMPLES / "elections.py", "docs_example_elections")
    assert elections.settle.leader_election == "billing"
    with leadership(token=11):
        assert elections.settle.apply().get() == 11
    assert leader_queue_for(elections.app, "billing") == "proj.billing.leader"
    settings = app_settings(elections.app, fresh=True)
    assert settings.for_named("reports").queue == "proj.reports.leader"
    assert settings.for_named("billing").name == "proj.billing"


def test_overlap_example(clean_modules):
    """examples/singleton.py: the policies and the key the page describes."""
    singleton = load(EXAMPLES / "singleton.py", "docs_example_singleton")
    assert singleton.rebuild_index.leader_overlap == "skip"
    assert singleton.sync_account.leader_overlap == "buffer_one"
    assert list(singleton.sync_account.leader_overlap_key) == ["account_id"]
    with leadership():
        assert singleton.rebuild_index.apply().get() is None  # not sent by beat


def test_fenced_writes_refuse_a_stale_token(redis_server, monkeypatch, clean_modules):
    """examples/fencing.py on a real Redis: a lower token's write is refused, in both forms."""
    monkeypatch.setenv("DATA_URL", f"redis://127.0.0.1:{redis_server.port}/2")
    fencing = load(EXAMPLES / "fencing.py", "docs_example_fencing")
    with leadership(token=5):
        assert fencing.publish_totals.apply(args=("v5",)).get() == "written"
        fencing.close_day.apply(args=(3,)).get()
    with leadership(token=4):
        assert fencing.publish_totals.apply(args=("v4",)).get() == "stale"
        # StaleTokenError, a LeaseError: an eager result re-raises it as its base class.
        with pytest.raises(LeaseError, match="token 4 is stale"):
            fencing.close_day.apply(args=(1,)).get()
    data = redis.Redis.from_url(f"redis://127.0.0.1:{redis_server.port}/2")
    assert data.get("totals:today") == b"v5"
    assert data.get("totals:month") == b"3"


def test_beat_example_settings_are_accepted(clean_modules):
    """examples/beat_settings.py: the scheduler and the missed policies load as written."""
    from celery_leader.settings import beat_settings

    beat = load(EXAMPLES / "beat_settings.py", "docs_example_beat")
    assert beat.app.conf.beat_scheduler == "celery_leader.beat:LeaderScheduler"
    settings = beat_settings(beat.app.conf)
    assert settings.missed_default == "skip"
    assert dict(settings.missed) == {"nightly-report": 3600}


def test_signal_handlers_log(caplog, clean_modules):
    """examples/signals.py: the handlers run on the signals, filtered on the election."""
    from celery_leader.signals import leader_elected, leader_lost

    signals = load(EXAMPLES / "signals.py", "docs_example_signals")
    try:
        with caplog.at_level(logging.INFO, logger="docs_example_signals"):
            leader_elected.send(sender="w1@host", token=3, name="proj")
            leader_elected.send(sender="w1@host", token=4, name="proj.billing")
            leader_lost.send(sender="w1@host", token=3, name="proj", reason="expired")
        assert [r.getMessage() for r in caplog.records] == [
            "w1@host leads proj with token 3",
            "w1@host lost proj (expired)",
        ]
    finally:
        leader_elected.disconnect(signals.on_elected)
        leader_lost.disconnect(signals.on_lost)


def metrics_ports() -> tuple[int, int]:
    """The worker's and beat's metrics ports of examples/metrics_settings.py, as loaded."""
    from celery_leader.settings import app_settings

    example = load(EXAMPLES / "metrics_settings.py", "docs_example_metrics")
    settings = app_settings(example.app)
    assert settings.worker.metrics.address == "127.0.0.1"
    return settings.worker.metrics.port, settings.beat_election.metrics.port


# --- deployment files -------------------------------------------------------------------


def test_kubernetes_manifests_probe_the_health_endpoint_on_the_metrics_ports(clean_modules):
    """examples/kubernetes/*.yaml: probes on /healthz at the ports the app sets, SIGTERM
    time above the stop grace, and the commands the pages describe."""
    worker_port, beat_port = metrics_ports()
    for name, port, words in (
        ("worker.yaml", worker_port, ["worker"]),
        ("beat.yaml", beat_port, ["beat", "-S", "leader"]),
    ):
        manifest = yaml.safe_load((EXAMPLES / "kubernetes" / name).read_text())
        pod = manifest["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["ports"] == [{"name": "metrics", "containerPort": port}]
        probe = container["livenessProbe"]["httpGet"]
        assert probe == {"path": "/healthz", "port": "metrics"}
        assert "readinessProbe" not in container
        assert pod["terminationGracePeriodSeconds"] > 5  # the default stop grace: one ttl
        command = container["command"]
        assert command[:3] == ["celery", "-A", "proj"]
        assert all(word in command for word in words)


def test_systemd_units_stop_warmly_and_escape_celerys_percent(clean_modules):
    """examples/systemd/*: SIGTERM to the main process, time to hand over, %%h for %h, and
    each worker's own environment file (its metrics port)."""
    units = {}
    for name in ("celery-worker@.service", "celery-beat.service"):
        parser = configparser.ConfigParser(interpolation=None)
        parser.optionxform = str  # type: ignore[assignment,method-assign]
        parser.read(EXAMPLES / "systemd" / name)
        units[name] = parser["Service"]
    for service in units.values():
        assert service["KillMode"] == "mixed"
        assert service["KillSignal"] == "SIGTERM"
        assert int(service["TimeoutStopSec"]) > 5
    worker = shlex.split(units["celery-worker@.service"]["ExecStart"])
    assert worker[worker.index("-n") + 1] == "%i@%%h"
    # Each worker of a host gets its own metrics port from a file of its own instance.
    assert "%i" in units["celery-worker@.service"]["EnvironmentFile"]
    assert (
        "CELERY_LEADER_METRICS_PORT="
        in (EXAMPLES / "systemd" / "celery-worker@.service").read_text()
    )
    beat = shlex.split(units["celery-beat.service"]["ExecStart"])
    assert beat[beat.index("-S") + 1] == "leader" and "-s" in beat


def test_the_dashboard_notes_scrape_the_example_ports(clean_modules):
    """docs/grafana/README.md's scrape config parses and names the example's ports."""
    worker_port, beat_port = metrics_ports()
    notes = (DOCS / "grafana" / "README.md").read_text()
    ((_, _, block),) = [fence for fence in FENCE.findall(notes) if fence[1] == "yaml"]
    config = yaml.safe_load(block)
    (job,) = config["scrape_configs"]
    (targets,) = [static["targets"] for static in job["static_configs"]]
    assert {int(target.rsplit(":", 1)[1]) for target in targets} == {worker_port, beat_port}
