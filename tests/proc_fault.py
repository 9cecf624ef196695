"""Failing ``/proc`` reads for a while, through ``procinfo``'s test-only fault file.

In this process, :meth:`ProcFault.in_this_process` installs the fault; a
worker started with ``{FAULT_ENV: str(path)}`` in its environment checks the
same file (each of its processes opens its own window at its first read
after :meth:`ProcFault.fail`).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from celery_leader.elections import procinfo
from celery_leader.elections.procinfo import FAULT_ENV

__all__ = ["FAULT_ENV", "ProcFault"]


class ProcFault:
    """Makes ``/proc`` reads fail: :meth:`fail` opens a window, :meth:`heal` closes it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def in_this_process(cls, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ProcFault:
        path = tmp_path / "proc-fault"
        monkeypatch.setattr(procinfo, "_fault", procinfo._Fault(str(path)))
        return cls(path)

    def fail(self, millis: float, name: str = "EMFILE") -> None:
        """Each process's next read opens a window of *millis* ms of errno *name*."""
        spare = self.path.with_suffix(".new")
        spare.write_text(f"{millis} {name}")
        os.replace(spare, self.path)  # a new inode: a new window, even within one mtime tick

    def heal(self) -> None:
        self.fail(0)

    def opened(self) -> list[int]:
        """The pids that opened a window so far (once per window)."""
        opened = Path(f"{self.path}.opened")
        return [int(line) for line in opened.read_text().split()] if opened.exists() else []
