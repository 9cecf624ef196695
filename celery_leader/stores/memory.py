"""In-memory lease store (``memory://``), for tests: one process only.

Safety statement: exclusion holds between lease managers of one process and
nothing else; the store forgets everything when the process ends. It has the
same semantics as the real stores (compare-and-set renew and release, rising
tokens, release notification), so code under test behaves as in production,
minus the network. Never use it where two processes must agree.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from celery_leader.exceptions import StoreError
from celery_leader.stores.base import (
    AcquireRequest,
    AcquireResult,
    Capability,
    Holder,
    LeaseRecord,
    LeaseStoreClass,
    Watch,
)


@dataclass
class _Lease:
    holder: Holder
    token: int
    acquired_at: float
    expires_at: float
    #: When the last acquire or renewal landed (monotonic clock, as expires_at).
    renewed_at: float


@dataclass
class _Space:
    """The leases of one ``memory://<space>`` URL."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    leases: dict[str, _Lease] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)
    state: dict[str, dict[str, str]] = field(default_factory=dict)
    #: group -> member -> (payload, expires at, monotonic clock)
    members: dict[str, dict[str, tuple[str, float]]] = field(default_factory=dict)
    watchers: list[tuple[str, Callable[[], None]]] = field(default_factory=list)


_spaces: dict[str, _Space] = {}
_spaces_lock = threading.Lock()


def reset_memory_stores() -> None:
    """Forget every in-memory lease (between tests)."""
    with _spaces_lock:
        _spaces.clear()


class _MemoryWatch:
    def __init__(self, space: _Space, entry: tuple[str, Callable[[], None]]) -> None:
        self._space, self._entry = space, entry

    def close(self) -> None:
        with self._space.lock:
            if self._entry in self._space.watchers:
                self._space.watchers.remove(self._entry)


class MemoryLeaseStore:
    """Leases in a dict shared by the stores of one process with the same URL."""

    schemes: ClassVar[tuple[str, ...]] = ("memory://",)
    extra: ClassVar[str | None] = None
    capabilities: ClassVar[frozenset[Capability]] = frozenset({Capability.RELEASE_NOTIFICATION})
    ttl_range: ClassVar[tuple[float | None, float | None]] = (None, None)
    default_renew_fraction: ClassVar[float] = 1 / 3
    option_keys: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> None:
        """No keys of its own."""

    def __init__(self, url: str) -> None:
        self.url = url
        with _spaces_lock:
            self._space = _spaces.setdefault(url, _Space())

    @classmethod
    def from_url(
        cls, url: str, *, timeout: float, options: Mapping[str, Any] | None = None
    ) -> MemoryLeaseStore:
        """Open the in-memory space named by *url* (``memory://`` or ``memory://name``)."""
        return cls(url)

    def _live(self, name: str) -> _Lease | None:
        lease = self._space.leases.get(name)
        if lease is not None and lease.expires_at <= time.monotonic():
            del self._space.leases[name]
            return None
        return lease

    def acquire(self, name: str, holder: Holder, ttl: float, min_token: int = 0) -> AcquireResult:
        """Take the lease when free or ours; a new token each time. Never holds off."""
        with self._space.lock:
            lease = self._live(name)
            if lease is not None and lease.holder.lease_id != holder.lease_id:
                return AcquireResult(
                    acquired=False,
                    holder=self._record(lease),
                    retry_in=lease.expires_at - time.monotonic(),
                )
            token = max(self._space.tokens.get(name, 0), min_token) + 1
            self._space.tokens[name] = token
            now = time.monotonic()
            self._space.leases[name] = _Lease(holder, token, time.time(), now + ttl, now)
        return AcquireResult(acquired=True, token=token)

    def renew(self, name: str, lease_id: str, ttl: float) -> bool:
        """Extend our live lease."""
        with self._space.lock:
            lease = self._live(name)
            if lease is None or lease.holder.lease_id != lease_id:
                return False
            lease.renewed_at = time.monotonic()
            lease.expires_at = lease.renewed_at + ttl
            return True

    def release(self, name: str, lease_id: str) -> bool:
        """End our lease and notify watchers."""
        with self._space.lock:
            lease = self._live(name)
            if lease is None or lease.holder.lease_id != lease_id:
                return False
            del self._space.leases[name]
            callbacks = [cb for watched, cb in self._space.watchers if watched == name]
        for callback in callbacks:
            callback()
        return True

    @staticmethod
    def _record(lease: _Lease) -> LeaseRecord:
        now = time.monotonic()
        return LeaseRecord(
            nodename=lease.holder.nodename,
            hostname=lease.holder.hostname,
            pid=lease.holder.pid,
            token=lease.token,
            acquired_at=lease.acquired_at,
            expires_in=max(0.0, lease.expires_at - now),
            renewed_ago=max(0.0, now - lease.renewed_at),
        )

    def read(self, name: str) -> LeaseRecord | None:
        """The live lease of *name*, or None."""
        with self._space.lock:
            lease = self._live(name)
            return None if lease is None else self._record(lease)

    def last_token(self, name: str) -> int | None:
        """The token of the latest term of *name*, None before the first."""
        with self._space.lock:
            return self._space.tokens.get(name)

    def get_state(self, name: str) -> dict[str, str]:
        """The state of *name*."""
        with self._space.lock:
            return dict(self._space.state.get(name, {}))

    def set_state(self, name: str, lease_id: str, key: str, value: str) -> bool:
        """Set one key while *lease_id* holds the lease."""
        with self._space.lock:
            lease = self._live(name)
            if lease is None or lease.holder.lease_id != lease_id:
                return False
            self._space.state.setdefault(name, {})[key] = value
            return True

    def call_many(
        self, renewals: list[tuple[str, str]], acquires: list[AcquireRequest], ttl: float
    ) -> tuple[list[bool], list[AcquireResult | StoreError]]:
        """See :class:`~celery_leader.stores.base.BatchCalls`.

        One call in memory saves nothing, but a worker on this store batches as
        on Redis, so its tests exercise the path.
        """
        renewed = [self.renew(name, lease_id, ttl) for name, lease_id in renewals]
        acquired: list[AcquireResult | StoreError] = [
            self.acquire(request.name, request.holder, ttl, request.min_token)
            for request in acquires
        ]
        return renewed, acquired

    def announce(self, group: str, member: str, payload: str, ttl: float) -> dict[str, str]:
        """See :class:`~celery_leader.stores.base.Presence`."""
        with self._space.lock:
            now = time.monotonic()
            members = self._space.members.setdefault(group, {})
            members[member] = (payload, now + ttl)
            for gone in [m for m, (_, until) in members.items() if until <= now]:
                del members[gone]
            return {m: value for m, (value, _) in members.items()}

    def withdraw(self, group: str, member: str) -> None:
        """See :class:`~celery_leader.stores.base.Presence`."""
        with self._space.lock:
            self._space.members.get(group, {}).pop(member, None)

    def watch(self, name: str, callback: Callable[[], None]) -> Watch:
        """Call back on every release of *name*, and at once if it is free now."""
        entry = (name, callback)
        with self._space.lock:
            self._space.watchers.append(entry)
            free_now = self._live(name) is None
        if free_now:
            callback()
        return _MemoryWatch(self._space, entry)

    def close(self) -> None:
        """Nothing to close."""


#: The class declares what the registry, the settings and the tests read (checked by mypy).
_DECLARES: LeaseStoreClass = MemoryLeaseStore
