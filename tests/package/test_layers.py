"""The package's floors, as its docstring writes them down, hold in every module's imports.

Every ``import`` and ``from ... import`` in the package is read (also those
inside functions), so a new import that runs up a floor fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "celery_leader"

#: Third-party packages of Celery itself: lease/ and elections/ must do without them.
CELERY = ("celery", "kombu", "billiard", "vine")

#: Folder (or module) -> the celery_leader modules it may import (prefix match).
ALLOWED: dict[str, tuple[str, ...]] = {
    "stores": ("exceptions", "clock", "_masking", "_values", "_catalogue", "stores"),
    "lease": ("exceptions", "clock", "_masking", "stores", "lease"),
    "elections": ("exceptions", "clock", "_masking", "stores", "lease", "elections"),
    "term_end": ("exceptions", "clock", "_masking", "stores", "lease", "elections", "term_end"),
}

#: Folder (or module) -> celery_leader modules it must never import.
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "tasks": ("worker", "beat", "cli", "demo", "simulation"),
    "beat": ("worker", "tasks", "cli", "demo", "simulation"),
    "observe": ("worker", "beat", "tasks", "cli", "demo", "simulation"),
    "settings": ("worker", "beat", "tasks", "cli", "demo", "simulation", "term_end"),
}


def imports_of(path: Path) -> list[str]:
    """The absolute module names *path* imports (relative imports resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = module.split(".")[: -node.level]
                base = ".".join([*parent, base] if base else parent)
            found.append(base)
            found += [f"{base}.{alias.name}" for alias in node.names]
    return found


def own(name: str) -> str | None:
    """``worker.coordinator`` for ``celery_leader.worker.coordinator``; None outside."""
    return name.split(".", 1)[1] if name.startswith("celery_leader.") else None


def floor_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return parts[0]


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_import_runs_up_a_floor(path):
    floor = floor_of(path)
    names = [n for n in (own(i) for i in imports_of(path)) if n is not None]
    if floor in ALLOWED:
        bad = [n for n in names if not within(n, ALLOWED[floor])]
        assert not bad, f"{floor}/ may import only {ALLOWED[floor]}, not {bad}"
    if floor in FORBIDDEN:
        bad = [n for n in names if within(n, FORBIDDEN[floor])]
        assert not bad, f"{floor} must not import {bad}"
    if floor in ("lease", "elections", "stores"):
        celery = [i for i in imports_of(path) if within(i, CELERY)]
        assert not celery, f"{floor}/ runs without Celery, yet imports {celery}"


def test_the_rules_are_written_where_a_reader_finds_them():
    """The package docstring states the floors this test checks."""
    import celery_leader

    doc = celery_leader.__doc__ or ""
    for floor in ("stores/", "lease/", "elections/", "term_end/", "worker/", "observe/"):
        assert floor in doc, f"the package docstring does not name {floor}"


def test_the_checker_sees_an_import_that_runs_up():
    """The reader resolves relative and function-level imports (so the test can fail)."""
    source = PACKAGE / "term_end" / "in_worker.py"
    names = [own(n) for n in imports_of(source)]
    assert "elections.shared_lease" in names
    assert "term_end" in names


def test_lease_names_and_queues_are_derived_in_settings_only():
    """No module outside the settings package builds an election's name or its queue from parts."""
    import pathlib
    import re

    suffix = r"\.(leader|beat|step-down)[\"']"
    derive = re.compile(rf"""BEAT_SUFFIX|f["'][^"']*\}}{suffix}|\+ ["']{suffix}""")
    root = pathlib.Path(__file__).resolve().parents[2] / "celery_leader"
    offenders = [
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if path.relative_to(root).parts[0] != "settings" and derive.search(path.read_text())
    ]
    assert offenders == []
