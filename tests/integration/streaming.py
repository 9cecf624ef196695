"""A stream of leader tasks sent while a test breaks something."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.chaos.run import RunWatcher


@contextmanager
def streaming(
    cluster: Any,
    every: float = 0.1,
    task: str = "leader_record",
    args: tuple[Any, ...] = (),
    watch: bool = True,
) -> Iterator[list[int]]:
    """Send *task* (leader_record) 0, 1, 2... every *every* seconds while the block runs.

    *args* follow the index: ``task="chaos_work", args=(0.2,)`` sends runs of
    0.2 s that write through the fence, as the chaos suite's do. ``watch=False``:
    the caller runs a :class:`RunWatcher` of its own, for longer than the block.

    Yields a one-item list holding how many were sent so far (read it after the block).
    A run killed at its term's end writes no end row: a :class:`RunWatcher`
    records when its process was gone, as the chaos suite does, so the
    checker judges it as ended by the kill rather than as never ended.
    """
    sent = [0]
    stop = threading.Event()
    watcher = RunWatcher(cluster.env["LEADER_HISTORY"]) if watch else None
    if watcher is not None:
        watcher.start()

    def stream() -> None:
        while not stop.is_set():
            cluster.send(task, sent[0], *args)
            sent[0] += 1
            stop.wait(every)

    sender = threading.Thread(target=stream, daemon=True)
    sender.start()
    try:
        yield sent
    finally:
        stop.set()
        sender.join(5)
        if watcher is not None:
            watcher.stop()
            watcher.close()
