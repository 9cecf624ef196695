"""The lease store contract.

A lease store keeps, per election name, at most one lease: who holds it, until
when, and the fencing token of the term. Everything that makes the lease safe
happens inside the store's atomic operations:

* ``acquire`` succeeds only when no lease is held, or when the lease held is
  the caller's own (its reply was lost earlier); every success hands out a new
  fencing token, strictly greater than every token handed out before for that
  name, also after the store lost its data.
* ``renew`` and ``release`` are compare-and-set on the holder's lease id: they
  never touch another holder's lease.
* A store that lost its data cannot tell whether an old holder still trusts its
  local validity, so the first acquire after such a loss reports a hold-off of
  one ttl; the lease manager does not act as leader until it has passed.

A store class declares, before any instance exists, what the registry, the
settings and the tests read from it (:class:`LeaseStoreClass`): the URL schemes
it serves, the extra that installs it, the ttl range it accepts, its renew
fraction, its own setting keys and what it can do (:class:`Capability`; the
contract suite checks every claim). The rules every acquire applies, the next
token and the hold-off, are written once in :mod:`celery_leader.stores.rules`.
"""

from __future__ import annotations

import enum
import os
import socket
import uuid
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable

from celery_leader.exceptions import StoreError


class Capability(enum.Enum):
    """What a store can do; the contract suite (tests/stores/test_contract.py) checks each claim."""

    #: Followers are told at once when a lease is released (no waiting for expiry).
    RELEASE_NOTIFICATION = "release-notification"
    #: Expiry is measured on the store's clock, not the clients'.
    SERVER_TIME = "server-time"
    #: Fencing tokens keep increasing after the store lost its data.
    FENCING_SURVIVES_DATA_LOSS = "fencing-survives-data-loss"
    #: Workers on different hosts can share the store.
    MULTI_HOST = "multi-host"
    #: The server drops something of a holder's process when the process dies (a
    #: connection, a lock the kernel releases), and followers can see it end: a dead
    #: leader is replaced within a fraction of a second (:class:`Lifelines`).
    LIFELINE = "lifeline"


@dataclass(frozen=True)
class Holder:
    """Who asks for the lease. ``lease_id`` is secret to the holder's manager."""

    lease_id: str
    nodename: str
    hostname: str
    pid: int
    lifeline: str = ""
    """The key of this process's lifeline (:class:`Lifeline`) the term is tied to; empty: none."""

    @classmethod
    def for_this_process(cls, nodename: str | None = None) -> Holder:
        """A holder with a fresh random lease id for the current process."""
        hostname = socket.gethostname()
        return cls(
            lease_id=uuid.uuid4().hex,
            nodename=nodename or f"{os.getpid()}@{hostname}",
            hostname=hostname,
            pid=os.getpid(),
        )


@dataclass(frozen=True)
class LeaseRecord:
    """The lease as the store holds it, readable by anyone."""

    nodename: str
    hostname: str
    pid: int
    token: int
    acquired_at: float
    """Unix time of the acquisition, on the store's clock where it has one."""
    expires_in: float
    """Seconds until the lease ends unless renewed."""
    hold_off: float = 0.0
    """Seconds left before the holder may act (after the store lost its data)."""
    renewed_ago: float | None = None
    """Seconds since the holder's last acquire or renewal landed, on the store's clock.

    A holder renews about every renew interval; a much longer gap means it
    stopped (killed, paused, cut off from the store) and its lease ends
    within ``expires_in`` unless renewed. None when the store cannot tell:
    the lease was taken by a version that did not record it.
    """
    expires_in_exact: bool = True
    """False when ``expires_in`` is only an upper bound (Azure says no time left)."""
    lifeline: str = ""
    """The key of the holder's lifeline the term is tied to (:class:`Lifelines`); empty: none."""


class MissingExtraError(ImportError):
    """A store module cannot be imported because the extra that installs its SDK is missing.

    The message is the whole hint, said once: ``the azureblob:// store needs
    the azure extra: pip install 'celery-leader[azure]'``. The registry
    passes it on as it is, where any other import failure is wrapped in
    "cannot be loaded".
    """

    def __init__(self, url_start: str, extra: str) -> None:
        super().__init__(
            f"the {url_start} store needs the {extra} extra: pip install 'celery-leader[{extra}]'"
        )
        self.url_start = url_start
        self.extra = extra


@runtime_checkable
class Presence(Protocol):
    """An optional part a store may offer: who takes part in a group, each announced with a ttl.

    Workers announce themselves once per renew interval; the balancer of
    named elections (:mod:`celery_leader.elections.balance`) reads the live
    members from the same call, so it costs one store round trip per
    interval. A member that stops announcing is gone *ttl* seconds after its
    last announcement, measured on the store's clock where the store has one.
    A store without it still elects; it does not balance.
    """

    def announce(self, group: str, member: str, payload: str, ttl: float) -> dict[str, str]:
        """Record *member* of *group* with *payload* for *ttl* seconds; every live member's payload.

        The answer includes *member* itself.
        """

    def withdraw(self, group: str, member: str) -> None:
        """Remove *member* from *group* now (a worker that stops)."""


class LifelineEndedError(StoreError):
    """The connection or lock of a :class:`Lifeline` is gone: the server no longer keeps it."""

    kind = "unreachable"


@runtime_checkable
class Lifeline(Protocol):
    """Something the store's server keeps for one process and drops when the process dies.

    A connection of its own (PostgreSQL: a session advisory lock; Redis: a
    subscription) or a lock the kernel releases (SQLite: ``flock``). The
    server ends it when the kernel closes the process's socket or file, which
    happens at once when the process dies, whatever killed it. It may also
    end while the process lives (a server restart, an admin killing the
    connection, a timeout): :mod:`celery_leader.lease.lifeline` holds the
    rule that keeps both safe. A key is never used again once its lifeline
    ended: a new lifeline has a new key.
    """

    #: Random, unique to this lifeline; followers ask the store about it by this key.
    key: str

    def confirm(self, timeout: float) -> None:
        """One round trip on the lifeline itself; returns once the server answered on it.

        The answer proves the server kept the lifeline at some moment after
        the call was sent. Raises :class:`LifelineEndedError` when it is
        gone for good (closed, broken, lost), and
        :class:`~celery_leader.exceptions.StoreError` when no answer came
        within *timeout* seconds.
        """

    def fileno(self) -> int:
        """The descriptor a forked child must not keep (it drops its copy at fork)."""

    def close(self) -> None:
        """End the lifeline now (the server drops it)."""


class LifelineReading(NamedTuple):
    """Which lifelines a store's server keeps, as one connection of a follower saw it."""

    session: str
    """Names the server process and connection the reading came through. Two readings
    of one session come from one server process, in order: a key seen alive, then
    absent in the same session, ended in between. Readings of different sessions
    prove nothing about each other."""
    alive: frozenset[str]
    """The keys asked about that the server keeps now."""


@runtime_checkable
class Lifelines(Protocol):
    """An optional part a store may offer (:attr:`Capability.LIFELINE`): lifelines and takeovers.

    A holder opens one :class:`Lifeline` per process and ties its terms to
    it (:attr:`Holder.lifeline`, written into the lease record); a follower
    reads whether the holder's lifeline is still kept, and once it saw it
    end (and waited out the holder's grace, see
    :mod:`celery_leader.lease.lifeline`) takes the lease over at once
    instead of waiting for it to expire.
    """

    def open_lifeline(self) -> Lifeline:
        """A new lifeline of this process, with a new key; raises StoreError when it cannot."""

    def read_lifelines(self, keys: Collection[str]) -> LifelineReading:
        """Which of *keys* the server keeps now: one round trip, whatever the number of keys."""

    def take_over(
        self, name: str, holder: Holder, ttl: float, dead: LeaseRecord, min_token: int = 0
    ) -> AcquireResult:
        """Acquire the lease of *name* although it is held, only from the term of *dead*.

        Compare-and-set on the term (its token and lifeline key, as *dead*
        read them): when the lease is free, or held by any other term, it
        answers as :meth:`LeaseStore.acquire` would. The token and hold-off
        rules of an acquire apply, and the new term also keeps what is left
        of the dead term's hold-off: that term held off for a holder the
        store forgot, who may still act.
        """


@runtime_checkable
class ServerLimits(Protocol):
    """An optional part a store may offer: the lease server's own limits, asked at start.

    A server may keep a lease longer than asked (etcd raises a TTL below its
    minimum to it): the holder still stops by its own ttl, but a follower then
    waits for the server's. Asked once at worker and beat start
    (:func:`celery_leader.stores.server_limits.check_server_limits`).
    """

    def check_ttl(self, ttl: float) -> None:
        """Raise ConfigurationError when the server would keep a *ttl* lease too long.

        Too long: longer than the store documents. The message names
        ``leader_lease_ttl``, *ttl* and the smallest allowed value. Raises
        :class:`~celery_leader.exceptions.StoreError` when the server cannot be asked.
        """


@runtime_checkable
class BrokerOptions(Protocol):
    """An optional part a store class may offer: options it takes from the broker's settings.

    Celery's broker on the same servers may already say what the store
    needs (a Sentinel broker's ``master_name``); the settings ask the store
    class for those values when its own keys are not set.
    """

    def options_from_broker(
        self, url: str, broker_url: str, transport_options: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The store options *url* takes from the broker (``broker_url``, its transport options).

        Keyed by setting name; empty when the broker is not on the store's
        servers, so that no credential travels to servers it was not meant for.
        """


class AcquireRequest(NamedTuple):
    """One :meth:`LeaseStore.acquire` inside a :meth:`BatchCalls.call_many`."""

    name: str
    holder: Holder
    min_token: int = 0


@runtime_checkable
class BatchCalls(Protocol):
    """An optional call a store may offer: many renewals and acquires in one round trip.

    A worker in many elections renews the leases it holds and tries those it
    follows on one grid of its clock; with this call it sends all of them at
    once, so its store load stays flat in the number of elections.
    """

    def call_many(
        self, renewals: list[tuple[str, str]], acquires: list[AcquireRequest], ttl: float
    ) -> tuple[list[bool], list[AcquireResult | StoreError]]:
        """:meth:`LeaseStore.renew` of each ``(name, lease_id)`` and ``acquire`` of each request.

        Each answer is what the single call would have answered for that lease
        (an acquire that would have raised answers its
        :class:`~celery_leader.exceptions.StoreError` in its place); a failure of
        the whole call raises for all of them.
        """


@runtime_checkable
class TokenHistory(Protocol):
    """An optional read a store may offer beside :class:`LeaseStore`: whether a term ever began.

    ``celery leader status`` uses it to tell "nobody holds the lease now"
    from "nobody ever held it" (no worker runs with the election step). A
    store without it is read as "cannot tell".
    """

    def last_token(self, name: str) -> int | None:
        """The fencing token of the latest term of *name*; None when no term was ever granted.

        None too after the store lost its data (a new or emptied store
        cannot tell either). Reads only; anyone may call it.
        """


@dataclass(frozen=True)
class AcquireResult:
    """The outcome of one acquire call."""

    acquired: bool
    token: int | None = None
    """The new fencing token when acquired."""
    hold_off: float = 0.0
    """Seconds the new holder must wait before acting (store lost its data)."""
    holder: LeaseRecord | None = None
    """The current holder when not acquired, if it could be read."""
    retry_in: float | None = None
    """Seconds until the current lease ends; None when it never will by itself."""
    foreign: bool = False
    """The lease slot holds a value that no celery-leader store wrote."""
    restarted_ago: float | None = None
    """Seconds since the store's server started, when a restart of it that kept the
    identity of its data is all that changed since the last term (PostgreSQL): the
    hold-off, if any, then ends one ttl after that start. None otherwise."""


class Watch(Protocol):
    """A subscription to release notifications; close it when done."""

    def close(self) -> None:
        """Stop watching; the callback is not called after this returns."""


@dataclass
class NullWatch:
    """The watch of a store that cannot notify: followers wait for expiry."""

    closed: bool = field(default=False)

    def close(self) -> None:
        """Nothing to stop."""
        self.closed = True


@runtime_checkable
class LeaseStore(Protocol):
    """What the lease manager needs from a store. One instance per election client.

    Every method may raise :class:`~celery_leader.exceptions.StoreError` (or
    :class:`~celery_leader.exceptions.StoreAuthError`) and must return or
    raise within the ``timeout`` the store was opened with, so that no call can
    outlive the lease it renews.
    """

    #: The store's URL with secrets masked, safe to print.
    url: str

    def acquire(self, name: str, holder: Holder, ttl: float, min_token: int = 0) -> AcquireResult:
        """Take the lease if it is free or already ours; never take another holder's.

        On success the token is greater than every earlier token of *name* and
        than *min_token* (the highest token the caller has seen).
        """

    def renew(self, name: str, lease_id: str, ttl: float) -> bool:
        """Extend our lease to *ttl* from now; False when it is no longer ours."""

    def release(self, name: str, lease_id: str) -> bool:
        """End our lease at once and notify watchers; False when it was not ours."""

    def read(self, name: str) -> LeaseRecord | None:
        """The current holder, or None when nobody holds the lease."""

    def get_state(self, name: str) -> dict[str, str]:
        """The small key/value state kept beside the lease of *name* (anyone may read)."""

    def set_state(self, name: str, lease_id: str, key: str, value: str) -> bool:
        """Set one state *key*, only while *lease_id* holds the lease; False otherwise.

        Fenced by the lease: a holder that lost it cannot write.
        """

    def watch(self, name: str, callback: Callable[[], None]) -> Watch:
        """Call *callback* (from any thread) when the lease of *name* may be free.

        Spurious calls are allowed; missed ones are not, while the watch is up.
        A watch calls back once as soon as it is up if the lease may be free
        then, since a release before that moment reached no one.
        Stores without :attr:`Capability.RELEASE_NOTIFICATION` return a
        :class:`NullWatch`.
        """

    def close(self) -> None:
        """Release connections and threads."""


class LeaseStoreClass(Protocol):
    """What a store class declares, read before any store is opened.

    The registry builds its messages from it, the settings check the ttl and
    the store's own keys with it, and the contract suite checks every
    capability claimed. A class registered in the ``celery_leader.stores``
    entry-point group must declare all of it.
    """

    #: The URL beginnings the store serves, as users write them (``"sqlite:///"``);
    #: the scheme is the part before ``:``.
    schemes: tuple[str, ...]
    #: The extra that installs what the store needs (``pip install
    #: 'celery-leader[<extra>]'``), None when a plain install has it.
    extra: str | None
    capabilities: frozenset[Capability]
    #: Allowed ttl range in seconds (inclusive); None means no bound.
    ttl_range: tuple[float | None, float | None]
    #: The renew interval, as a fraction of the ttl, when ``leader_renew_interval`` is unset.
    default_renew_fraction: float
    #: The ``leader_*`` setting keys the store reads from its options. Each is
    #: declared, with its parser and documentation, as a catalogue entry in the
    #: store's module (:class:`celery_leader._catalogue.Setting`, owner ``STORE``).
    option_keys: frozenset[str]

    def validate_options(self, options: Mapping[str, Any]) -> None:
        """Raise :class:`~celery_leader.exceptions.ConfigurationError` for a bad value of its keys.

        *options* maps keys to the values given (absent keys are left out).
        Each message is one line naming the key; secrets are never echoed.
        """

    def from_url(
        self, url: str, *, timeout: float, options: Mapping[str, Any] | None = None
    ) -> LeaseStore:
        """Open a store on *url*; every call on it is bounded by about *timeout* seconds."""
