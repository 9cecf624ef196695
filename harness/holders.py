"""Who leads each election over time, sampled from the lease store (for tests and benchmarks).

:class:`HolderSampler` reads the lease of every election it is given every
20 ms on a thread of its own, with a store client of its own, and keeps
each sample: a holder past its hold-off, or None. From the samples it
tells how long an election was led by nobody between two terms.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

from celery_leader.stores import open_store

#: (nodename, token) of a holder past its hold-off, or None.
Held = tuple[str, int] | None


class HolderSampler:
    """Samples the holders of *leases* (label -> lease name) in the store at *store_url*."""

    def __init__(self, store_url: str, leases: Mapping[str, str], every: float = 0.02) -> None:
        self._store = open_store(store_url, timeout=2)
        self._leases = dict(leases)
        self._every = every
        #: (monotonic time, {label: holder}) in time order.
        self.samples: list[tuple[float, dict[str, Held]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="holder-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            at = time.monotonic()
            view: dict[str, Held] = {}
            for label, lease in self._leases.items():
                record = self._store.read(lease)
                leads = record is not None and record.hold_off <= 0
                view[label] = (record.nodename, record.token) if leads else None
            self.samples.append((at, view))
            self._stop.wait(self._every)

    def stop(self) -> None:
        """Stop sampling and close the store client."""
        self._stop.set()
        self._thread.join(5)
        self._store.close()

    def next_term(self, label: str, token: int) -> tuple[float, float, tuple[str, int]]:
        """(the last sample led under *token*, the first led under another term, that term's
        holder). Raises StopIteration when no other term was seen after it."""
        last = max(at for at, view in self.samples if (view[label] or ("", 0))[1] == token)
        first, held = next(
            (at, held)
            for at, view in self.samples
            if at > last and (held := view[label]) is not None and held[1] != token
        )
        return last, first, held

    def seen_since(self, since: float) -> dict[str, set[Held]]:
        """Per label, every holder sampled at or after *since* (monotonic time)."""
        found: dict[str, set[Held]] = {label: set() for label in self._leases}
        for at, view in self.samples:
            if at >= since:
                for label, held in view.items():
                    found[label].add(held)
        return found
