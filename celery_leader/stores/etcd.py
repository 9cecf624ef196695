"""The lease store on etcd (``etcd://[user:password@]host:port[,host:port...]/<prefix>``).

Install with ``pip install 'celery-leader[etcd]'``. ``etcds://`` speaks TLS;
the query names its files as etcdctl does (``?cacert=/ca.pem&cert=/c.pem&key=/k.pem``).
Without a path the prefix is ``celery-leader``. Every member given is used: a
call that finds one down, paused or without a leader tries the next.

How, per election under the prefix: ``lease/<name>`` holds the holder and
is attached to an etcd lease of the term (TTL = the lease ttl rounded up to
whole seconds: it only lengthens the lease on the server, never the holder's
own reckoning of it). etcd raises a TTL below its minimum, ``ceil(1.5 x
election timeout)``, to it: a ttl below that minimum is refused at worker and
beat start (:meth:`EtcdLeaseStore.check_ttl`), so a follower waits at most
``ceil(ttl)`` after the last renewal, plus etcd's half-second expiry sweep.
``term/<name>`` keeps the last token and the cluster it was granted on,
``end/<name>`` the earliest end of the last term.
An acquire reads them, then one transaction takes the lease only if
``lease/<name>`` is absent (or still the caller's own) and ``term/<name>``
is unchanged since the read; a renewal keeps the term's etcd lease alive,
then checks that ``lease/<name>`` is still attached to it; a release
deletes the key (compare-and-set on the etcd lease) and revokes the lease.
Followers watch the keys of every election in one stream per process: a
release and an expiry both delete the key, so both wake them at once.

Expiry is measured by etcd (the leader's clock). Tokens are
``max(last + 1, server clock in us, min + 1)`` (:mod:`celery_leader.stores.rules`),
``last`` being the token ``term/<name>`` holds (not the lease key's create
revision: that is known only once the transaction has committed, and the
token must be written by that very transaction),
the server clock being the ``Date`` header of the member that answered
(whole seconds): they keep rising after a restore from an older snapshot,
provided it comes more than a second after the last acquisition and the
members' clocks agree to within the time between two acquisitions.

When the data may have gone back, the next acquire holds the new holder off
one ttl: no term record (a new or emptied store), a term record granted on
another cluster (its id changes when the cluster is recreated), a lease key
gone before the earliest end of its term (deleted or revoked by hand), or a
revision lower than one this process saw before. That last one catches a
snapshot restored under running workers: every worker that saw a revision
later than the snapshot's (each follower's watch sees every term begin)
holds off. Not told apart: a restore that keeps the cluster id, acquired
first by a worker that saw nothing later than the snapshot (started after
the restore, or cut off from etcd before the lost term began). Restore with
a new ``--initial-cluster-token`` (a new cluster id: always noticed), or
start the workers one ttl after etcd. (``--bump-revision`` alone would hide
the restore from the revision check.)

A client stopped (SIGSTOP, a paused container) or cut off between two of
its requests holds nothing the others wait on: etcd has no locks, every
request (a transaction too) is applied whole or not at all, and what a
client does hold is an etcd lease, which ends at its TTL once nobody keeps
it alive (a lease granted for an acquire that never followed, or the term of
a holder that stopped).

Members (for balancing named elections) are keys attached to an etcd lease
of the announcing process; their expiry is judged on the readers' wall
clocks (an etcd TTL cannot be shorter than a second), which only decides
who balances, never who leads.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar, Concatenate, ParamSpec, TypeVar
from urllib.parse import quote, unquote

from celery_leader._masking import mask_text
from celery_leader.exceptions import ConfigurationError, StoreError
from celery_leader.stores import rules
from celery_leader.stores.base import (
    AcquireResult,
    Capability,
    Holder,
    LeaseRecord,
    LeaseStoreClass,
    Watch,
)
from celery_leader.stores.etcd_gateway import (
    Deadline,
    EtcdURL,
    Reply,
    b64,
    prefix_end,
    shared_gateway,
    unb64,
)
from celery_leader.stores.watch import Fanout, shared_fanout

logger = logging.getLogger(__name__)

#: Longest silence of a watch stream before it is opened again (on the next member if
#: need be): a member that stopped answering delays a release notification by this much.
WATCH_IDLE = 5.0
#: Microseconds a ``Date`` reading may stand for beyond itself (it reads whole seconds).
_DATE_STEP_US = 999_999


def _whole_seconds(ttl: float) -> int:
    """The etcd lease TTL for a lease of *ttl* seconds: rounded up (never shorter)."""
    return max(1, math.ceil(ttl - 1e-9))


#: A ttl below etcd's minimum lease TTL (etcd would keep the lease longer).
ERR_TTL_BELOW_MINIMUM = (
    "leader_lease_ttl={ttl:g} is not allowed with the etcd store {url}: etcd grants leases of "
    "at least {granted} s (its minimum TTL, ceil(1.5 x its election timeout)), so a follower "
    "would wait that long after a crash; use leader_lease_ttl >= {granted} (etcd counts "
    "whole seconds: it keeps a lease of ttl seconds for ceil(ttl) seconds)"
)


#: The stores (masked URLs) whose raised ttl this process has logged.
_ttl_raised: set[str] = set()


def _too_short(ttl: float, granted: int, url: str) -> str:
    return ERR_TTL_BELOW_MINIMUM.format(ttl=ttl, granted=granted, url=url)


def _range(key: str) -> dict[str, Any]:
    return {"request_range": {"key": b64(key)}}


def _put(key: str, value: str, lease: str | None = None) -> dict[str, Any]:
    put: dict[str, Any] = {"key": b64(key), "value": b64(value)}
    if lease is not None:
        put["lease"] = lease
    return {"request_put": put}


def _delete(key: str) -> dict[str, Any]:
    return {"request_delete_range": {"key": b64(key)}}


def _compare(key: str, target: str, value: str) -> dict[str, Any]:
    """``target`` of *key* equals *value* (``CREATE``/``MOD``: a revision; ``LEASE``: an id)."""
    field = {"CREATE": "create_revision", "MOD": "mod_revision", "LEASE": "lease"}[target]
    return {"key": b64(key), "target": target, "result": "EQUAL", field: value}


def _kv(reply: Reply, index: int) -> dict[str, Any] | None:
    """The key-value of the *index*-th range of a transaction, None when absent."""
    responses = reply.body.get("responses") or []
    kvs = (
        (responses[index].get("response_range") or {}).get("kvs") if index < len(responses) else []
    )
    return kvs[0] if kvs else None


def _int(value: object, default: Any = 0) -> Any:
    """*value* as an int (etcd sends int64 as strings); *default* for anything else."""
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return default


def _value(kv: dict[str, Any]) -> dict[str, Any]:
    try:
        value = json.loads(unb64(kv.get("value", "")))
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class _Witness:
    """What this process saw of a cluster's revision: enough to notice data that went back.

    Revisions only grow while a cluster keeps its data. A reply to a call
    sent after another reply arrived that carries a lower revision (or
    another cluster id) means the data was replaced: every term record
    written up to that revision may be older than a term that was granted
    and forgotten.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cluster: str | None = None
        self._highest = 0
        self._highest_at = 0.0
        self.replaced_up_to = 0

    def see(self, reply: Reply, sent_at: float) -> str:
        """Take in *reply* of a call sent at monotonic *sent_at*; the cluster id."""
        header = reply.body.get("header") or {}
        cluster = str(header.get("cluster_id", ""))
        revision = int(header.get("revision", 0) or 0)
        with self._lock:
            other = self._cluster is not None and cluster != self._cluster
            back = revision < self._highest and sent_at > self._highest_at
            if other or back:
                logger.warning(
                    "etcd revision went from %d to %d%s: its data was replaced (a snapshot"
                    " restored?); the next term of each election holds off one ttl",
                    self._highest,
                    revision,
                    " on another cluster" if other else "",
                )
                self.replaced_up_to = max(self.replaced_up_to, revision)
                self._highest, self._highest_at = revision, time.monotonic()
            elif revision > self._highest:
                # Only a rise moves the time: a slow reply of an earlier call must not make
                # a later call's lower revision look concurrent with the highest.
                self._highest, self._highest_at = revision, time.monotonic()
            self._cluster = cluster
        return cluster

    def saw(self, revision: int) -> None:
        """A revision known committed (a watch event's): raises the mark, never detects."""
        with self._lock:
            if revision > self._highest:
                self._highest, self._highest_at = revision, time.monotonic()


_witnesses: dict[tuple[str, ...], _Witness] = {}
_witnesses_lock = threading.Lock()


def _witness_for(target: EtcdURL) -> _Witness:
    with _witnesses_lock:
        key = (*target.endpoints, target.prefix)
        witness = _witnesses.get(key)
        if witness is None:
            witness = _witnesses[key] = _Witness()
        return witness


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _one_deadline(
    method: Callable[Concatenate[EtcdLeaseStore, _P], _R],
) -> Callable[Concatenate[EtcdLeaseStore, _P], _R]:
    """Bound every call *method* makes by one deadline: the store's timeout for the whole."""

    def bounded(self: EtcdLeaseStore, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with self._operation():
            return method(self, *args, **kwargs)

    bounded.__name__, bounded.__doc__ = method.__name__, method.__doc__
    return bounded


class EtcdLeaseStore:
    """Leases on etcd; see the module docstring for the guarantees and their limits."""

    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {
            Capability.RELEASE_NOTIFICATION,
            Capability.SERVER_TIME,
            Capability.FENCING_SURVIVES_DATA_LOSS,
            Capability.MULTI_HOST,
        }
    )
    schemes: ClassVar[tuple[str, ...]] = ("etcd://", "etcds://")
    extra: ClassVar[str | None] = "etcd"
    ttl_range: ClassVar[tuple[float | None, float | None]] = (None, None)
    default_renew_fraction: ClassVar[float] = 1 / 3
    option_keys: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> None:
        """No options of its own."""

    @classmethod
    def from_url(
        cls, url: str, *, timeout: float, options: Mapping[str, Any] | None = None
    ) -> EtcdLeaseStore:
        """Open a store on *url*; a call gives up after about *timeout* seconds."""
        return cls(url, timeout)

    def __init__(self, url: str, timeout: float) -> None:
        self._gateway = shared_gateway(url, timeout)
        self._address = url
        self.url = self._gateway.url
        self._timeout = timeout
        self._prefix = self._gateway.target.prefix
        self._witness = _witness_for(self._gateway.target)
        self._lock = threading.Lock()
        #: name -> (our lease id, the term's etcd lease): the terms this object took.
        self._terms: dict[str, tuple[str, str]] = {}
        #: (group, member) -> the etcd lease its announcements hang on.
        self._members: dict[tuple[str, str], str] = {}
        self._closed = False
        self._local = threading.local()

    @contextmanager
    def _operation(self) -> Iterator[None]:
        """One deadline (the store's timeout) for every call of one store operation."""
        if getattr(self._local, "deadline", None) is not None:
            yield  # nested in an operation: its deadline holds
            return
        self._local.deadline = Deadline(self._timeout)
        try:
            yield
        finally:
            self._local.deadline = None

    # -- calls -------------------------------------------------------------------

    def _key(self, kind: str, name: str) -> str:
        return f"{self._prefix}/{kind}/{quote(name, safe='')}"

    def _call(self, what: str, path: str, body: dict[str, Any]) -> Reply:
        if self._closed:
            raise StoreError(f"lease store {self.url}: {what} after close()")
        sent = time.monotonic()
        deadline = getattr(self._local, "deadline", None)
        reply = self._gateway.call(path, body, what=what, deadline=deadline)
        if path.startswith("kv/"):
            # Only linearizable reads and writes: a member answers a lease call with its own
            # applied revision, which may lag one seen before on another member.
            self._witness.see(reply, sent)
        return reply

    def _txn(
        self,
        what: str,
        compare: list[dict[str, Any]],
        success: list[dict[str, Any]],
        failure: list[dict[str, Any]] | None = None,
    ) -> Reply:
        body = {"compare": compare, "success": success, "failure": failure or []}
        return self._call(what, "kv/txn", body)

    def _grant(self, ttl: float, what: str = "acquire") -> str:
        asked = _whole_seconds(ttl)
        reply = self._call(what, "lease/grant", {"TTL": str(asked)})
        granted = _int(reply.body.get("TTL"), asked)
        if granted > asked and what == "acquire" and self.url not in _ttl_raised:
            # Not checked at start (etcd was down then): said once, the lease still works.
            _ttl_raised.add(self.url)
            logger.error("celery-leader: %s", _too_short(ttl, granted, self.url))
        return str(reply.body["ID"])

    @_one_deadline
    def check_ttl(self, ttl: float) -> None:
        """Refuse a *ttl* below etcd's minimum lease TTL (see :class:`~.base.ServerLimits`).

        Grants a lease of one second (the least etcd counts), reads the TTL
        etcd granted (its minimum, when that is more) and revokes it at once.
        A *ttl* at or above it is kept by etcd for ``ceil(ttl)`` seconds.
        """
        reply = self._call("check", "lease/grant", {"TTL": "1"})
        minimum = _int(reply.body.get("TTL"), 1)
        if reply.body.get("ID"):
            self._revoke(str(reply.body["ID"]))
        if ttl < minimum:
            raise ConfigurationError(_too_short(ttl, minimum, self.url))

    def _keepalive(self, lease: str, what: str) -> Reply | None:
        """Keep *lease* alive: the reply, or None when etcd no longer has it."""
        reply = self._call(what, "lease/keepalive", {"ID": lease})
        return reply if _int(reply.body.get("TTL")) > 0 else None

    def _revoke(self, lease: str) -> None:
        """End *lease* now; an error only lets it run out on its own."""
        try:
            self._call("release", "lease/revoke", {"ID": lease})
        except StoreError as exc:
            logger.debug("revoking an etcd lease failed (it runs out by itself): %s", exc)

    def _time_to_live(self, lease: str | None) -> tuple[float, float | None]:
        """Seconds left of *lease* (whole, as etcd counts them); seconds since its renewal."""
        if not lease:
            return 0.0, None
        reply = self._call("read", "lease/timetolive", {"ID": lease})
        left = float(reply.body.get("TTL", 0) or 0)
        granted = float(reply.body.get("grantedTTL", 0) or 0)
        if left < 0:
            return 0.0, None
        # etcd answers whole seconds, rounded down: the last renewal is half a second off.
        return left, max(0.0, granted - left - 0.5) if granted else None

    def _our_lease(self, name: str, lease_id: str) -> str | None:
        """The etcd lease of our term of *name*, if ``lease/<name>`` is ours; None otherwise."""
        with self._lock:
            known = self._terms.get(name)
        if known is not None and known[0] == lease_id:
            return known[1]
        # A term this object did not take (another store object of the same holder).
        reply = self._txn("renew", [], [_range(self._key("lease", name))])
        kv = _kv(reply, 0)
        if kv is None or _value(kv).get("lease_id") != lease_id or not kv.get("lease"):
            return None
        return str(kv["lease"])

    def _forget_term(self, name: str) -> None:
        with self._lock:
            self._terms.pop(name, None)

    # -- the lease ---------------------------------------------------------------

    @_one_deadline
    def acquire(self, name: str, holder: Holder, ttl: float, min_token: int = 0) -> AcquireResult:
        """Take the lease when free or ours, with a new token; never another holder's."""
        lease_key, term_key, end_key = (self._key(k, name) for k in ("lease", "term", "end"))
        look = self._txn("acquire", [], [_range(lease_key), _range(term_key), _range(end_key)])
        lease_kv, term_kv, end_kv = _kv(look, 0), _kv(look, 1), _kv(look, 2)
        now_us = int(look.date * 1e6)
        latest_us = now_us + _DATE_STEP_US
        ttl_us = int(ttl * 1e6)
        own_hold_until = 0
        granted: str | None = None
        if lease_kv is not None:
            value = _value(lease_kv)
            if value.get("lease_id") != holder.lease_id:
                return self._refused(lease_kv, now_us)
            # Our own term (the reply of an earlier acquire was lost): keep its etcd lease.
            etcd_lease = str(lease_kv.get("lease", ""))
            if not etcd_lease or self._keepalive(etcd_lease, "acquire") is None:
                return AcquireResult(acquired=False, retry_in=0.0)  # it just ran out: try again
            own_hold_until = int(value.get("hold_until_us", 0) or 0)
            lease_compare = _compare(lease_key, "MOD", str(lease_kv.get("mod_revision", 0)))
        else:
            etcd_lease = granted = self._grant(ttl)
            lease_compare = _compare(lease_key, "CREATE", "0")
        term = _value(term_kv) if term_kv is not None else None
        cluster = str((look.body.get("header") or {}).get("cluster_id", ""))
        end_us = _int(unb64(end_kv.get("value", ""))) if end_kv is not None else 0
        last = _int(term.get("token"), None) if term is not None else None
        forgot = rules.store_forgot(
            counter_missing=last is None,  # no term record, or one nothing of ours wrote
            data_replaced=term is not None
            and (
                term.get("cluster") != cluster
                or _int((term_kv or {}).get("mod_revision")) <= self._witness.replaced_up_to
            ),
            # On the answering member's clock, whole seconds: a lease that ran out by itself
            # ended at or after the end recorded at its last renewal.
            vanished_early=rules.lease_vanished_early(lease_kv is not None, end_us, now_us),
        )
        hold_until, wait_us = rules.hold_off(
            now=now_us,
            ttl=ttl_us,
            own_hold_until=own_hold_until,
            forgot=forgot,
            now_latest=latest_us,
        )
        # The latest time the Date header may stand for, also with a counter: a counter
        # restored from an older snapshot may lag tokens that ran up to a second ahead.
        token = rules.next_token(last, latest_us, min_token)
        record = {
            "lease_id": holder.lease_id,
            "nodename": holder.nodename,
            "hostname": holder.hostname,
            "pid": holder.pid,
            "token": token,
            "acquired_at": now_us / 1e6,
            "hold_until_us": hold_until,
        }
        term_compare = _compare(term_key, "MOD", str((term_kv or {}).get("mod_revision", 0)))
        taken = self._txn(
            "acquire",
            [lease_compare, term_compare],
            [
                _put(lease_key, json.dumps(record), etcd_lease),
                _put(term_key, json.dumps({"token": token, "cluster": cluster})),
                _put(end_key, str(now_us + ttl_us)),
            ],
            [_range(lease_key)],
        )
        if not taken.body.get("succeeded"):
            other = _kv(taken, 0)
            ours = other is not None and _value(other).get("lease_id") == holder.lease_id
            if ours and other is not None and str(other.get("lease")) == etcd_lease:
                # This very transaction landed on a member whose reply was lost, and the
                # gateway sent it again: the term is ours as written.
                with self._lock:
                    self._terms[name] = (holder.lease_id, etcd_lease)
                token = _int(_value(other).get("token"))
                return AcquireResult(acquired=True, token=token, hold_off=wait_us / 1e6)
            if granted is not None:
                self._revoke(granted)
            if other is not None and not ours:
                return self._refused(other, now_us)
            return AcquireResult(acquired=False, retry_in=0.0)  # raced another acquire: again
        with self._lock:
            self._terms[name] = (holder.lease_id, etcd_lease)
        return AcquireResult(acquired=True, token=token, hold_off=wait_us / 1e6)

    def _refused(self, lease_kv: dict[str, Any], now_us: int) -> AcquireResult:
        """Not acquired: the holder of *lease_kv*, and when to try again without a notification."""
        record = self._record(lease_kv, now_us)
        # etcd counts whole seconds down: the lease may last up to a second more. The
        # watch wakes the follower at the expiry itself (it deletes the key).
        return AcquireResult(acquired=False, holder=record, retry_in=record.expires_in + 1.0)

    def _record(self, lease_kv: dict[str, Any], now_us: int) -> LeaseRecord:
        value = _value(lease_kv)
        left, renewed_ago = self._time_to_live(lease_kv.get("lease"))
        return LeaseRecord(
            nodename=str(value.get("nodename", "")),
            hostname=str(value.get("hostname", "")),
            pid=int(value.get("pid", 0) or 0),
            token=int(value.get("token", 0) or 0),
            acquired_at=float(value.get("acquired_at", 0.0) or 0.0),
            expires_in=left,
            hold_off=max(0.0, (int(value.get("hold_until_us", 0) or 0) - now_us) / 1e6),
            renewed_ago=renewed_ago,
        )

    @_one_deadline
    def renew(self, name: str, lease_id: str, ttl: float) -> bool:
        """Keep the term's etcd lease alive, then check the key still hangs on it."""
        etcd_lease = self._our_lease(name, lease_id)
        kept = self._keepalive(etcd_lease, "renew") if etcd_lease is not None else None
        if etcd_lease is None or kept is None:
            self._forget_term(name)
            return False
        # After the keep-alive: the key was ours when it ended, and stays as long as the
        # lease (a key deleted by hand and taken by another is found here). The term's
        # earliest end moves with it: a key deleted by hand before it holds the next off.
        lease_key = self._key("lease", name)
        end_us = int(kept.date * 1e6) + int(ttl * 1e6)
        checked = self._txn(
            "renew",
            [_compare(lease_key, "LEASE", etcd_lease)],
            [_put(self._key("end", name), str(end_us))],
        )
        if not checked.body.get("succeeded"):
            self._forget_term(name)
            return False
        return True

    @_one_deadline
    def release(self, name: str, lease_id: str) -> bool:
        """Delete our key (compare-and-set on the term's etcd lease), then revoke the lease."""
        etcd_lease = self._our_lease(name, lease_id)
        self._forget_term(name)
        if etcd_lease is None:
            return False
        lease_key = self._key("lease", name)
        released = self._txn(
            "release",
            [_compare(lease_key, "LEASE", etcd_lease)],
            # The term ended on purpose: its end is no longer ahead (no hold-off next).
            [_delete(lease_key), _put(self._key("end", name), "0")],
        )
        self._revoke(etcd_lease)
        return bool(released.body.get("succeeded"))

    @_one_deadline
    def read(self, name: str) -> LeaseRecord | None:
        """The live lease of *name*, or None."""
        reply = self._txn("read", [], [_range(self._key("lease", name))])
        kv = _kv(reply, 0)
        if kv is None:
            return None
        return self._record(kv, int(reply.date * 1e6))

    @_one_deadline
    def last_token(self, name: str) -> int | None:
        """The token of the last term of *name*, or None when it never had one."""
        kv = _kv(self._txn("read", [], [_range(self._key("term", name))]), 0)
        term = _value(kv) if kv is not None else {}
        return int(term["token"]) if "token" in term else None

    # -- state beside the lease ----------------------------------------------------

    @_one_deadline
    def get_state(self, name: str) -> dict[str, str]:
        """Every key stored for *name*."""
        prefix = self._key("state", name) + "/"
        reply = self._call(
            "get_state", "kv/range", {"key": b64(prefix), "range_end": prefix_end(prefix)}
        )
        return {
            unquote(unb64(kv["key"])[len(prefix) :]): unb64(kv.get("value", ""))
            for kv in reply.body.get("kvs") or []
        }

    @_one_deadline
    def set_state(self, name: str, lease_id: str, key: str, value: str) -> bool:
        """Set *key* while *lease_id* holds the lease (one transaction); False otherwise."""
        etcd_lease = self._our_lease(name, lease_id)
        if etcd_lease is None:
            return False
        state_key = f"{self._key('state', name)}/{quote(key, safe='')}"
        written = self._txn(
            "set_state",
            [_compare(self._key("lease", name), "LEASE", etcd_lease)],
            [_put(state_key, value)],
        )
        return bool(written.body.get("succeeded"))

    # -- members (balancing) -----------------------------------------------------

    @_one_deadline
    def announce(self, group: str, member: str, payload: str, ttl: float) -> dict[str, str]:
        """See :class:`~celery_leader.stores.base.Presence` (expiry on the readers' clocks)."""
        with self._lock:
            etcd_lease = self._members.get((group, member))
        if etcd_lease is None or self._keepalive(etcd_lease, "presence") is None:
            # The key outlives its announced end by a second or more: readers judge the end.
            etcd_lease = self._grant(ttl + 1, "presence")
            with self._lock:
                self._members[group, member] = etcd_lease
        prefix = self._key("member", group) + "/"
        entry = json.dumps({"payload": payload, "until": time.time() + ttl})
        reply = self._txn(
            "presence",
            [],
            [
                _put(prefix + quote(member, safe=""), entry, etcd_lease),
                {"request_range": {"key": b64(prefix), "range_end": prefix_end(prefix)}},
            ],
        )
        responses = reply.body.get("responses") or [{}, {}]
        now = time.time()
        members = {}
        for kv in (responses[1].get("response_range") or {}).get("kvs") or []:
            value = _value(kv)
            if float(value.get("until", 0) or 0) > now:
                members[unquote(unb64(kv["key"])[len(prefix) :])] = str(value.get("payload", ""))
        return members

    @_one_deadline
    def withdraw(self, group: str, member: str) -> None:
        """See :class:`~celery_leader.stores.base.Presence`."""
        with self._lock:
            etcd_lease = self._members.pop((group, member), None)
        key = f"{self._key('member', group)}/{quote(member, safe='')}"
        self._txn("presence", [], [_delete(key)])
        if etcd_lease is not None:
            self._revoke(etcd_lease)

    # -- release notifications ---------------------------------------------------

    def watch(self, name: str, callback: Callable[[], None]) -> Watch:
        """Call back when the key of *name* is deleted (release or expiry), and once when up."""
        fanout = shared_fanout(
            ("etcd", self._address, str(self._timeout)),
            lambda: Fanout("etcd", _watch_stream(self._address, self._timeout)),
        )
        return fanout.add(name, callback)

    def close(self) -> None:
        """Nothing is held open that the process's other stores do not share."""
        self._closed = True


def _watch_stream(url: str, timeout: float) -> Callable[[Fanout], None]:
    """The body of the process's watch thread for the cluster and prefix of *url*.

    It watches every ``lease/`` key under the prefix: a deletion (a release
    or an expiry) calls back the watches of that election, and every event's
    revision goes to the process's witness (:class:`_Witness`), so that a
    follower knows how far the data went before a restore winds it back. It
    resumes a broken stream from the revision after the last event it
    delivered, so nothing is missed across a reconnect; when it cannot (the
    first connection, history compacted, a revision that went back, another
    cluster) it calls every watch back once instead. A stream silent for
    :data:`WATCH_IDLE` seconds is opened again, on the next member if the
    one it used went quiet.
    """
    gateway = shared_gateway(url, timeout)
    witness = _witness_for(gateway.target)
    prefix = f"{gateway.target.prefix}/lease/"
    key, end = b64(prefix), prefix_end(prefix)

    def body(fanout: Fanout) -> None:
        start: int | None = None  # the revision to watch from; None: call everyone back
        cluster: object = None
        failures = 0
        while fanout.keep_running():
            try:
                now = gateway.call(
                    "kv/range", {"key": key, "range_end": end, "count_only": True}, what="watch"
                )
                header = now.body.get("header") or {}
                current = int(header.get("revision", 0) or 0)
                if start is None or current + 1 < start or header.get("cluster_id") != cluster:
                    # First time, history lost, or data that went back: anything may be free.
                    start, cluster = current + 1, header.get("cluster_id")
                    fanout.notify(None)
                # Puts too: each is a term beginning, and its revision tells this process's
                # witness how far the data went (a restore behind it is then noticed).
                create = {"key": key, "range_end": end, "start_revision": str(start)}
                for message in gateway.stream("watch", {"create_request": create}, idle=WATCH_IDLE):
                    result = message.get("result") or {}
                    if "error" in message:
                        raise StoreError(f"watch failed: {message['error']}")  # noqa: TRY301
                    if result.get("canceled") or _int(result.get("compact_revision")):
                        # Its history is gone (or it was refused): begin again from now,
                        # after a back-off like any failure (a refusal must not spin).
                        start = None
                        raise StoreError("watch canceled")  # noqa: TRY301
                    failures = 0
                    for event in result.get("events") or []:
                        kv = event.get("kv") or {}
                        revision = int(kv.get("mod_revision", 0) or 0)
                        start = max(start or 0, revision + 1)
                        witness.saw(revision)
                        if event.get("type") == "DELETE":
                            fanout.notify(unquote(unb64(kv["key"])[len(prefix) :]))
                    if not fanout.watching():
                        break
            except Exception as exc:  # noqa: BLE001 - the watch must outlive any failure
                failures += 1
                logger.debug("release watch interrupted: %s", mask_text(str(exc)))
                # A stream that was up and went silent reconnects at once; failures back off.
                threading.Event().wait(0 if failures == 1 else min(0.1 * 2**failures, 2.0))

    return body


def _forget_after_fork() -> None:
    global _witnesses_lock  # noqa: PLW0603 - the child's own registry
    _witnesses_lock = threading.Lock()
    for witness in _witnesses.values():  # a lock a parent's thread held stays held
        witness._lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


#: The class declares what the registry, the settings and the tests read (checked by mypy).
_DECLARES: LeaseStoreClass = EtcdLeaseStore
