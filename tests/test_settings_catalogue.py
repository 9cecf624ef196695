"""The settings catalogue: every key the code reads is declared once, and documented from there."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from celery_leader import _catalogue
from celery_leader._catalogue import Owner, Setting
from celery_leader.exceptions import ConfigurationError
from celery_leader.settings import entries, known_names, load_app_settings
from celery_leader.settings.reference import render_markdown
from celery_leader.stores.registry import BUILTIN_STORES, _load

PACKAGE = Path(__file__).resolve().parents[1] / "celery_leader"
BROKER = {"broker_url": "redis://127.0.0.1:6379/0"}


class RecordingConf(dict):
    """A configuration that records every key read from it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.read: set[str] = set()

    def get(self, key: Any, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self.read.add(key)
        return super().__getitem__(key)


def test_the_keys_the_code_reads_are_the_catalogue():
    """Loading a process's settings reads every catalogue key, and no leader_* key beside them."""
    every = known_names()
    conf = RecordingConf(BROKER)
    load_app_settings(conf, "proj")
    read = {key for key in conf.read if str(key).startswith("leader_")}
    assert read == every


def test_every_store_declares_the_keys_it_reads_in_the_catalogue():
    """A store class's option_keys are exactly its own catalogue entries, owned by it."""
    by_store: dict[str, set[str]] = {}
    for setting in entries():
        if setting.owner is Owner.STORE:
            by_store.setdefault(str(setting.store), set()).add(setting.name)
    for path in set(BUILTIN_STORES.values()):
        cls = _load(path)
        declared = set().union(*(by_store.get(form, set()) for form in cls.schemes))
        assert set(cls.option_keys) == declared, path


def test_each_entry_is_complete_and_named_for_django():
    """Every entry has a description, allowed values and a Django spelling; stores say which."""
    for setting in entries():
        assert setting.description and setting.allowed, setting.name
        assert setting.django_name == "CELERY_" + setting.name.upper()
        assert (setting.owner is Owner.STORE) == (setting.store is not None)


def test_no_store_key_is_named_in_the_settings_package():
    """The election knows no store: a store's keys are written in its own module only."""
    store_keys = {s.name for s in entries() if s.owner is Owner.STORE}
    assert store_keys, "the Azure and Sentinel stores declare settings"
    for path in (PACKAGE / "settings").glob("*.py"):
        text = path.read_text()
        named = {key for key in store_keys if key in text}
        assert not named, f"{path.name} names {named}"
        assert not re.search(r"leader_(azure|sentinel|postgres|etcd|sqlite)", text), path.name


def test_no_module_outside_settings_and_stores_reads_a_raw_key():
    """Everything else asks the settings objects: no conf.get("leader_...") of a setting."""
    raw = re.compile(r"""(\.get\(|\[|getattr\([^,()]+,)\s*["'](leader_[a-z_]+)["']""")
    names = known_names()
    offenders = [
        f"{path.relative_to(PACKAGE)}: {match.group(2)}"
        for path in PACKAGE.rglob("*.py")
        if path.relative_to(PACKAGE).parts[0] not in ("settings", "stores")
        for match in raw.finditer(path.read_text())
        if match.group(2) in names
    ]
    assert offenders == []


def test_the_raw_read_check_sees_one():
    """The pattern above finds a raw read (so that test can fail)."""
    raw = re.compile(r"""(\.get\(|\[|getattr\([^,()]+,)\s*["'](leader_[a-z_]+)["']""")
    for line in (
        'conf.get("leader_lease_ttl")',
        "conf['leader_name']",
        'getattr(c, "leader_tasks")',
    ):
        assert raw.search(line), line


def test_a_declared_key_is_not_warned_of_and_is_documented(monkeypatch, caplog):
    """A key is known once declared: the unknown-key warning and the reference read it."""
    from celery_leader.settings import checks

    monkeypatch.setattr(_catalogue, "_entries", dict(_catalogue._entries))
    monkeypatch.setattr(checks, "_warned", set())
    conf = {**BROKER, "leader_example_poll": 2}
    with caplog.at_level("WARNING", logger="celery_leader.settings"):
        load_app_settings(conf, "proj")
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning.startswith("celery-leader: leader_example_poll is not a celery-leader setting")
    _catalogue.register(
        Setting(
            "leader_example_poll",
            Owner.STORE,
            default="1 second",
            allowed="a number of seconds > 0",
            description="How often the example store polls.",
            parse=lambda name, value: float(value),
            store="example://",
        )
    )
    caplog.clear()
    with caplog.at_level("WARNING", logger="celery_leader.settings"):
        load_app_settings(conf, "proj")
    assert caplog.records == []
    page = render_markdown()
    assert "## Store `example://`\n\n### `leader_example_poll`" in page
    assert "- Django: `CELERY_LEADER_EXAMPLE_POLL`" in page


def test_a_key_has_one_owner(monkeypatch):
    """A store cannot declare a key another owner reads."""
    monkeypatch.setattr(_catalogue, "_entries", dict(_catalogue._entries))
    theirs = Setting(
        "leader_lease_ttl",
        Owner.STORE,
        default="",
        allowed="",
        description="",
        parse=lambda name, value: value,
        store="example://",
    )
    with pytest.raises(ValueError, match="leader_lease_ttl is declared by election and by"):
        _catalogue.register(theirs)


def test_a_bad_value_is_refused_by_the_entry_with_today_s_message():
    """Reading through an entry gives the one-line error naming the setting and what is allowed."""
    from celery_leader.settings.metrics import HEALTH_STUCK_AFTER

    with pytest.raises(ConfigurationError) as caught:
        HEALTH_STUCK_AFTER.read({"leader_health_stuck_after": 0})
    assert str(caught.value) == (
        "leader_health_stuck_after=0 is not allowed: it must be a number of seconds > 0"
    )
    assert HEALTH_STUCK_AFTER.read({"leader_health_stuck_after": ""}) is None, "unset"


def test_a_process_port_comes_from_the_option_then_the_environment_then_the_setting():
    """One app, one process's own port: the worker option, else the variable, else the
    setting; each is named as given, and "0" (text, as from an environment) is no port."""
    conf = {
        "leader_backend_url": "redis://127.0.0.1:6379/0",
        "leader_metrics_port": 9808,
        "leader_beat_metrics_port": 9809,
    }
    variables = {"CELERY_LEADER_METRICS_PORT": "9101", "CELERY_LEADER_BEAT_METRICS_PORT": "9102"}
    option = {"leader_metrics_port": "9201"}

    def ports(environ, options):  # type: ignore[no-untyped-def]
        read = load_app_settings(conf, environ=environ, worker_options=options)
        return (read.metrics.port, read.metrics.port_from), read.beat_metrics.port

    assert ports({}, {}) == ((9808, "leader_metrics_port"), 9809)
    by_variable = "environment variable CELERY_LEADER_METRICS_PORT"
    assert ports(variables, {}) == ((9101, by_variable), 9102)
    assert ports(variables, option) == ((9201, "--leader-metrics-port"), 9102)
    assert ports({**variables, "CELERY_LEADER_METRICS_PORT": ""}, {}) == (
        (9808, "leader_metrics_port"),
        9102,
    ), "an empty variable is not set"
    off = load_app_settings(conf, environ={"CELERY_LEADER_METRICS_PORT": "0"})
    assert off.metrics.port is None and not off.metrics.enabled
    with pytest.raises(ConfigurationError) as caught:
        load_app_settings(conf, environ={}, worker_options={"leader_metrics_port": "http"})
    assert str(caught.value) == (
        "--leader-metrics-port='http' is not allowed: it must be a TCP port number, 1..65535"
    )


def test_the_reference_names_each_port_s_variable_and_option():
    """The settings reference tells the variable of each port, and the worker option."""
    page = render_markdown()
    for name, lines in {
        "leader_metrics_port": [
            "`CELERY_LEADER_METRICS_PORT`",
            "`celery worker --leader-metrics-port",
        ],
        "leader_beat_metrics_port": ["`CELERY_LEADER_BEAT_METRICS_PORT`"],
    }.items():
        block = page[page.index(f"### `{name}`") :].split("\n### ", 1)[0]
        for line in lines:
            assert line in block, block
    assert "- Environment:" not in page.split("### `leader_health_stuck_after`")[1], (
        "only the ports have one"
    )


def test_the_reference_lists_every_entry_grouped_by_owner():
    """Sections in owner order, each entry with its Django spelling, default and allowed values."""
    page = render_markdown()
    sections = re.findall(r"^## (.+)$", page, flags=re.MULTILINE)
    assert sections[:3] == ["Election", "Beat", "Metrics and health"]
    assert {"Store `azureblob://`", "Store `sentinel://`"} <= set(sections[3:])
    for setting in entries():
        block = page[page.index(f"### `{setting.name}`") :].split("\n### ", 1)[0]
        assert f"- Django: `{setting.django_name}`" in block
        assert "- Default: " + " ".join(setting.default.split()) in block
        assert "- Allowed: " + " ".join(setting.allowed.split()) in block
        section = page[: page.index(f"### `{setting.name}`")].rsplit("\n## ", 1)[1]
        expected = f"Store `{setting.store}`" if setting.store else setting.owner.value
        assert section.startswith(expected + "\n")


def test_the_reference_prints_as_a_module():
    """python -m celery_leader.settings.reference prints the page, and nothing else."""
    done = subprocess.run(
        [sys.executable, "-m", "celery_leader.settings.reference"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert done.stdout == render_markdown()
    assert done.stderr == ""


WITHOUT_EXTRA = """
import logging
import sys
from celery_leader.exceptions import ConfigurationError
from celery_leader.settings import known_names, load_app_settings

logging.basicConfig(level=logging.WARNING, format="%(message)s")
assert {"leader_azure_account_url", "leader_azure_watch_interval"} <= known_names()
assert "celery_leader.stores.azure_blob" not in sys.modules, "its import failed: no extra"
load_app_settings({"broker_url": "redis://h/0", "leader_azure_watch_interval": 2}, "proj")
try:
    load_app_settings({"broker_url": "redis://h/0", "leader_azure_watch_interval": 0}, "proj")
except ConfigurationError as exc:
    print(exc)
"""


def test_a_store_without_its_extra_still_declares_and_checks_its_settings(tmp_path):
    """Without the azure extra, its settings are known (no warning) and a bad value is refused."""
    package = tmp_path / "azure"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError(\"No module named 'azure'\")\n")
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRA],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": ""},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", "no warning: the keys are settings"
    assert done.stdout == (
        "leader_azure_watch_interval=0 is not allowed: it must be a number of seconds > 0\n"
    )
