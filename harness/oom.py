"""A memory cgroup for one test process: the kernel's OOM killer, not a signal we send.

:class:`MemoryCage` puts a running process in a new memory cgroup (v1's
``memory`` hierarchy, or v2 where its root offers the ``memory`` controller)
with a limit on what it allocates from then on; past the limit the kernel
kills it with SIGKILL, as it kills a worker whose container runs out of
memory. Needs root (CI runs as root).
"""

from __future__ import annotations

import uuid
from contextlib import suppress
from pathlib import Path
from types import TracebackType

V1_ROOT = Path("/sys/fs/cgroup/memory")
V2_ROOT = Path("/sys/fs/cgroup")


def _v2_has_memory() -> bool:
    controllers = V2_ROOT / "cgroup.controllers"
    return controllers.exists() and "memory" in controllers.read_text().split()


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
                "memory controller): the OOM test needs one, and root"
            )
        self.limit_bytes = limit_bytes

    def __enter__(self) -> MemoryCage:
        self.path.mkdir()
        if self._v2:
            (self.path / "memory.max").write_text(str(self.limit_bytes))
            (self.path / "memory.swap.max").write_text("0")
        else:
            (self.path / "memory.limit_in_bytes").write_text(str(self.limit_bytes))
            # No swap to escape to: past the limit the process is killed, not slowed.
            (self.path / "memory.swappiness").write_text("0")
        return self

    def add(self, pid: int) -> None:
        """Move *pid* in: what it allocates from now on counts against the limit."""
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
        # A process still in it (the test failed before the kill) goes back to the root
        # cgroup, without a limit, so the cgroup can go; the test's cleanup stops it.
        root = self.path.parent / "cgroup.procs"
        for pid in (self.path / "cgroup.procs").read_text().split():
            with suppress(OSError):
                root.write_text(pid)
        with suppress(OSError):
            self.path.rmdir()
