"""A memory cgroup for one test process: the kernel's OOM killer, not a signal we send.

:class:`MemoryCage` puts a running process in a new memory cgroup (v1's
``memory`` hierarchy, or v2 where its root offers the ``memory`` controller)
with a limit on what it allocates from then on; past the limit the kernel
kills it with SIGKILL, as it kills a worker whose container runs out of
memory. Needs root (CI runs as root).
"""

from __future__ import annotations

import time
import uuid
from contextlib import suppress
from pathlib import Path
from types import TracebackType

V1_ROOT = Path("/sys/fs/cgroup/memory")
V2_ROOT = Path("/sys/fs/cgroup")


def _v2_has_memory() -> bool:
    """Whether the v2 root gives its children the ``memory`` controller (its subtree_control:
    offered in cgroup.controllers is not enough, a child would have no ``memory.max``)."""
    enabled = V2_ROOT / "cgroup.subtree_control"
    return enabled.exists() and "memory" in enabled.read_text().split()


def _cgroup_of(pid: int, v2: bool) -> str:
    """The memory cgroup of *pid* (its path under the hierarchy's root), "/" when not found."""
    with suppress(OSError):
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if (controllers == "") if v2 else ("memory" in controllers.split(",")):
                return path
    return "/"


class MemoryCage:
    """A memory cgroup of its own, removed on exit; see the module docstring."""

    def __init__(self, limit_bytes: int) -> None:
        name = f"celery-leader-test-{uuid.uuid4().hex[:8]}"
        if (V1_ROOT / "memory.limit_in_bytes").exists():
            self.path, self._v2 = V1_ROOT / name, False
        elif _v2_has_memory():
            self.path, self._v2 = V2_ROOT / name, True
        else:
            raise RuntimeError(
                "no memory cgroup controller (neither /sys/fs/cgroup/memory nor cgroup v2's "
                "memory controller enabled in /sys/fs/cgroup/cgroup.subtree_control): the OOM "
                "test needs one, and root"
            )
        self.limit_bytes = limit_bytes
        #: Where each process moved in came from (its memory cgroup), to go back there.
        self._origins: dict[int, str] = {}

    def __enter__(self) -> MemoryCage:
        self.path.mkdir()
        try:
            if self._v2:
                (self.path / "memory.max").write_text(str(self.limit_bytes))
                swap = self.path / "memory.swap.max"
                if swap.exists():  # absent without swap accounting: no swap to escape to
                    swap.write_text("0")
            else:
                (self.path / "memory.limit_in_bytes").write_text(str(self.limit_bytes))
                # No swap to escape to: past the limit the process is killed, not slowed.
                (self.path / "memory.swappiness").write_text("0")
        except BaseException:
            self._remove()  # never left behind by a cage that could not be set up
            raise
        return self

    def add(self, pid: int) -> None:
        """Move *pid* in: what it allocates from now on counts against the limit."""
        self._origins[pid] = _cgroup_of(pid, self._v2)
        (self.path / "cgroup.procs").write_text(str(pid))

    def oom_kills(self) -> int:
        """How many processes the kernel's OOM killer killed in this cgroup."""
        name = "memory.events" if self._v2 else "memory.oom_control"
        for line in (self.path / name).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._remove()

    def _remove(self) -> None:
        # A process still in it (the test failed before the kill) goes back to the cgroup
        # it came from (and its limits, not the root's none), so the cage can go; the
        # test's cleanup stops it. A process still exiting leaves within moments: the
        # removal is tried again meanwhile.
        root = self.path.parent
        deadline = time.monotonic() + 5.0
        while True:
            with suppress(OSError):
                for pid in (self.path / "cgroup.procs").read_text().split():
                    origin = root / self._origins.get(int(pid), "/").lstrip("/")
                    with suppress(OSError):
                        (origin / "cgroup.procs").write_text(pid)
            try:
                self.path.rmdir()
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)
            else:
                return
