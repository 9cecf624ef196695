"""The README's Quickstart has what a first deployment on one host needs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from types import SimpleNamespace

README = Path(__file__).resolve().parent.parent / "README.md"


def quickstart() -> str:
    text = README.read_text()
    return text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]


def code_blocks(section: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", section, flags=re.DOTALL)


def test_quickstart_app_sets_prefetch_and_the_visibility_timeout():
    """The Quickstart's app takes one message at a time and sets a visibility_timeout."""
    (source,) = code_blocks(quickstart(), "python")
    namespace: dict[str, object] = {"__name__": "proj"}
    exec(compile(source.replace("    ...\n", "    pass\n"), "quickstart", "exec"), namespace)
    app = SimpleNamespace(**namespace).app
    assert app.conf.worker_prefetch_multiplier == 1
    timeout = app.conf.broker_transport_options["visibility_timeout"]
    assert isinstance(timeout, (int, float)) and timeout > 0


def test_quickstart_workers_on_one_host_each_have_their_own_name():
    """Several workers on one host: each command line gives its own `-n name@%h`."""
    commands = [
        shlex.split(line.split("#", 1)[0])
        for block in code_blocks(quickstart(), "sh")
        for line in block.splitlines()
        if line.startswith("celery -A proj worker")
    ]
    assert len(commands) >= 3, commands
    names = [command[command.index("-n") + 1] for command in commands]
    assert len(set(names)) == len(names)
    assert all(name.endswith("@%h") for name in names)
