"""harness.oom's memory cage on a made-up cgroup tree (a directory of plain files).

What each test shows: a cgroup v2 root that offers the memory controller
without giving it to its children is no cage (a child would have no
``memory.max``), and nothing is made; a cage that cannot be set up is not
left behind; a process still in the cage at the end goes back to the
cgroup it came from, not to the root without a limit.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness import oom


@pytest.fixture
def v2_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(oom, "V1_ROOT", tmp_path / "memory")  # no v1 hierarchy
    monkeypatch.setattr(oom, "V2_ROOT", tmp_path)
    (tmp_path / "cgroup.controllers").write_text("cpu io memory pids\n")
    (tmp_path / "cgroup.subtree_control").write_text("memory pids\n")
    (tmp_path / "cgroup.procs").write_text("")
    # cgroupfs removes a cgroup with its control files; a plain directory needs rmtree.
    monkeypatch.setattr(Path, "rmdir", shutil.rmtree)
    return tmp_path


def _cages(root: Path) -> list[Path]:
    return sorted(root.glob("celery-leader-test-*"))


def test_a_v2_root_that_does_not_give_memory_to_its_children_is_no_cage(v2_root):
    (v2_root / "cgroup.subtree_control").write_text("pids\n")
    with pytest.raises(RuntimeError, match="subtree_control"):
        oom.MemoryCage(limit_bytes=1 << 20)
    assert _cages(v2_root) == []


def test_a_cage_that_cannot_be_set_up_is_not_left_behind(v2_root, monkeypatch):
    real = Path.write_text

    def write_text(self: Path, data: str, *args: object, **kwargs: object) -> int:
        if self.name == "memory.max":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, data, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "write_text", write_text)
    with pytest.raises(PermissionError):
        oom.MemoryCage(limit_bytes=1 << 20).__enter__()
    assert _cages(v2_root) == []


def test_a_process_left_in_the_cage_goes_back_where_it_came_from(v2_root, monkeypatch):
    home = v2_root / "system.slice" / "ci.scope"
    home.mkdir(parents=True)
    (home / "cgroup.procs").write_text("")
    monkeypatch.setattr(oom, "_cgroup_of", lambda pid, v2: "/system.slice/ci.scope")
    with oom.MemoryCage(limit_bytes=1 << 20) as cage:
        cage.add(4242)
        assert (cage.path / "memory.max").read_text() == str(1 << 20)
    assert (home / "cgroup.procs").read_text() == "4242"
    assert (v2_root / "cgroup.procs").read_text() == "", "not the root, without a limit"
    assert _cages(v2_root) == []
