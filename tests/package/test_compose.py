"""docker-compose.yml and its Dockerfile: services, commands and wiring (no Docker needed)."""

from __future__ import annotations

import importlib
import importlib.util
import re
import shlex
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from celery import Celery

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
WORKERS = ("worker1", "worker2", "worker3")
BEATS = ("beat1", "beat2")
APP_SERVICES = (*WORKERS, *BEATS, "flower")


def services() -> dict[str, dict]:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def command(service: dict) -> list[str]:
    value = service.get("command") or []
    return shlex.split(value) if isinstance(value, str) else [str(part) for part in value]


def environment(service: dict) -> dict[str, str]:
    value = service.get("environment") or {}
    if isinstance(value, list):
        return dict(item.split("=", 1) for item in value)
    return {key: str(val) for key, val in value.items()}


def option(args: list[str], *names: str) -> str:
    for index, arg in enumerate(args):
        if arg in names:
            return args[index + 1]
        for name in names:
            if name.startswith("--") and arg.startswith(f"{name}="):
                return arg.split("=", 1)[1]
    raise AssertionError(f"none of {names} in {args}")


def test_compose_defines_the_expected_services():
    """Redis 7, Azurite (blob only), three workers, two beats and Flower are defined."""
    found = services()
    assert set(found) >= {"redis", "azurite", *APP_SERVICES}
    assert found["redis"]["image"] == "redis:7"
    assert found["azurite"]["image"].startswith("mcr.microsoft.com/azure-storage/azurite")
    assert command(found["azurite"])[0] == "azurite-blob"
    for name in WORKERS:
        assert command(found[name])[3] == "worker", name
    for name in BEATS:
        assert command(found[name])[3] == "beat", name
        assert option(command(found[name]), "-s", "--schedule"), name
    assert command(found["flower"])[3] == "flower"


@pytest.mark.parametrize("name", APP_SERVICES)
def test_celery_app_of_each_command_imports(name):
    """The module after `celery -A` in the service's command exists and holds a Celery app."""
    args = command(services()[name])
    assert args[0] == "celery"
    module = option(args, "-A", "--app")
    assert module == "example_project.proj"
    assert importlib.util.find_spec(module) is not None
    assert isinstance(importlib.import_module(module).app, Celery)


def test_workers_beats_and_flower_share_the_redis_broker_and_one_lease_store():
    """Every app service's broker is the redis service, and all use the same lease store."""
    found = services()
    envs = {name: environment(found[name]) for name in APP_SERVICES}
    for name, env in envs.items():
        broker = urlsplit(env["PROJ_BROKER_URL"])
        assert (broker.scheme, broker.hostname) == ("redis", "redis"), name
        assert "redis" in (found[name].get("depends_on") or {}), name
    # One election: the same store (default: the broker) and data everywhere.
    for key in ("PROJ_BROKER_URL", "PROJ_LEADER_URL", "PROJ_DATA_URL"):
        assert len({env.get(key) for env in envs.values()}) == 1, key


def test_worker_nodenames_are_unique():
    """Each worker has its own -n nodename, as the lease names its holder by it."""
    found = services()
    names = [option(command(found[name]), "-n", "--hostname") for name in WORKERS]
    assert len(set(names)) == len(WORKERS), names


def test_app_services_build_from_the_dockerfile_here():
    """Every app service builds from an existing Dockerfile whose COPY sources exist."""
    found = services()
    for name in APP_SERVICES:
        build = found[name]["build"]
        context = ROOT / (build if isinstance(build, str) else build.get("context", "."))
        dockerfile = context / (
            "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
        )
        assert dockerfile.is_file(), (name, dockerfile)
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.MULTILINE)
    assert re.search(r"pip install -e \"?\.\[azure\]", text)
    copies = re.findall(r"^COPY (.+)$", text, re.MULTILINE)
    assert copies
    for line in copies:
        for source in line.split()[:-1]:
            assert (ROOT / source).exists(), source
