"""etcd's v3 JSON gateway, over requests: the calls of the etcd store, bounded, on every endpoint.

etcd serves its gRPC API as JSON on the client port (``POST /v3/kv/txn``,
``/v3/lease/keepalive``, ``/v3/watch``...): keys and values are base64,
64-bit numbers are JSON strings. This module knows that wire form and
nothing of leases: :mod:`celery_leader.stores.etcd` builds the store on it.

Why not an etcd client library: python-etcd3 (0.12, 2020) breaks on protobuf
4 and later; etcd3gw (the JSON gateway, used by tooz) talks to one endpoint,
has no authentication, gives every call the same timeout and hides the
response headers, and its watch thread drops a failed stream without a word,
so a follower would never hear of a release again. requests does the part
worth not writing (connection pools, TLS, streaming).

Guarantees: a call returns or raises :class:`~celery_leader.exceptions.StoreError`
within about the timeout it was given, whatever the members do (down,
paused, without quorum). It tries each endpoint at most once, each with half
of what is left of the timeout (the last with all of it), and the next call
starts on the endpoint that answered last. A call that timed out or lost its connection
may still have been applied; every caller in the store is written so that a
second attempt is harmless. Passwords never appear in a message.
"""

from __future__ import annotations

import base64
import email.utils
import importlib
import json
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any, NamedTuple
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from celery_leader._masking import mask_text, mask_url
from celery_leader.exceptions import (
    ConfigurationError,
    StoreAuthError,
    StoreCallTimeoutError,
    StoreError,
    StoreUnreachableError,
)
from celery_leader.stores.base import MissingExtraError

logger = logging.getLogger(__name__)

#: gRPC status codes the gateway puts in an error body.
_DEADLINE_EXCEEDED = 4
_PERMISSION_DENIED = 7
_UNAVAILABLE = 14
_UNAUTHENTICATED = 16
#: Codes after which another member may answer (no leader, leader changed, timed out).
_TRY_ANOTHER = frozenset({_DEADLINE_EXCEEDED, _UNAVAILABLE})

_OK = 200
#: What etcd says when it refuses a user (a wrong password, none given, no permission):
#: some of it comes as INVALID_ARGUMENT or FAILED_PRECONDITION, not as an auth code.
_AUTH_WORDS = ("authentication failed", "user name is empty", "permission denied")
#: A share of the timeout too small to try another member with.
_TOO_SHORT = 0.01
#: A password shorter than this is not masked inside messages (it would mask half of them).
_SHORTEST_SECRET = 3

#: Query keys of the URL: the TLS files, as etcdctl names its flags.
TLS_KEYS = ("cacert", "cert", "key")


def requests_module() -> Any:
    """requests, or the one-line hint naming the extra that installs it."""
    try:
        return importlib.import_module("requests")  # an optional extra
    except ImportError:
        raise MissingExtraError("etcd://", "etcd") from None


def b64(text: str) -> str:
    """A key or value as the gateway wants it."""
    return base64.b64encode(text.encode()).decode()


def unb64(text: str) -> str:
    """A key or value as the gateway sent it."""
    return base64.b64decode(text).decode()


def prefix_end(prefix: str) -> str:
    """The end of the key range of every key that starts with *prefix* (etcd's ``range_end``)."""
    raw = prefix.encode()
    return base64.b64encode(raw[:-1] + bytes([raw[-1] + 1])).decode()


class EtcdURL(NamedTuple):
    """What an ``etcd://`` or ``etcds://`` URL says."""

    endpoints: list[str]
    """``http(s)://host:port`` of each member given."""
    prefix: str
    """The key prefix every key of the store lives under (no trailing ``/``)."""
    user: str | None
    password: str | None
    tls: dict[str, str]
    """``cacert``, ``cert``, ``key``: the files given in the query."""

    def __repr__(self) -> str:
        """Everything but the password."""
        password = None if self.password is None else "***"
        return (
            f"EtcdURL(endpoints={self.endpoints!r}, prefix={self.prefix!r}, user={self.user!r},"
            f" password={password!r}, tls={self.tls!r})"
        )

    @classmethod
    def parse(cls, url: str) -> EtcdURL:
        """Parse *url*; a bad one raises ConfigurationError naming the setting (secrets masked)."""
        shown = mask_url(url)
        scheme, sep, rest = url.partition("://")
        if scheme not in ("etcd", "etcds") or not sep:
            raise ConfigurationError(
                f"leader_backend_url={shown}: an etcd store URL starts with etcd:// or etcds://"
            )
        # A password may hold "/", "?" or "@": the last "@" of the whole URL ends it.
        at = rest.rfind("@")
        userinfo, after = (rest[:at], rest[at + 1 :]) if at >= 0 else ("", rest)
        hosts_and_path, _, query = after.partition("?")
        hosts, _, path = hosts_and_path.partition("/")
        user, colon, password = userinfo.partition(":")
        endpoints = []
        protocol = "https" if scheme == "etcds" else "http"
        for host in filter(None, hosts.split(",")):
            try:
                port = urlsplit(f"//{host}").port
            except ValueError:
                port = None
            if port is None:
                raise ConfigurationError(
                    f"leader_backend_url={shown}: each etcd member is host:port"
                    f" (etcd://host:2379,host:2379/prefix), not {host!r}"
                )
            endpoints.append(f"{protocol}://{host}")
        if not endpoints:
            raise ConfigurationError(
                f"leader_backend_url={shown}: name at least one etcd member"
                " (etcd://host:2379[,host:2379...]/prefix)"
            )
        tls = {}
        for key, value in parse_qsl(query, keep_blank_values=True):
            if key not in TLS_KEYS:
                raise ConfigurationError(
                    f"leader_backend_url={shown}: unknown query key {key!r};"
                    f" allowed: {', '.join(TLS_KEYS)} (etcds:// only)"
                )
            tls[key] = value
        if tls and scheme != "etcds":
            raise ConfigurationError(
                f"leader_backend_url={shown}: cacert, cert and key need etcds:// (TLS)"
            )
        if ("cert" in tls) != ("key" in tls):
            raise ConfigurationError(
                f"leader_backend_url={shown}: a client certificate needs both cert and key"
            )
        prefix = unquote(path).strip("/") or "celery-leader"
        return cls(
            endpoints=endpoints,
            prefix=prefix,
            user=unquote(user) if user else None,
            password=unquote(password) if colon else None,
            tls=tls,
        )


class Reply(NamedTuple):
    """One answer of the gateway."""

    body: dict[str, Any]
    #: The answering member's clock (the HTTP ``Date`` header), Unix seconds, whole.
    date: float


class Deadline:
    """The monotonic time by which a whole store operation (several calls) must be over."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        """Seconds left (negative once passed)."""
        return self.end - time.monotonic()


class Gateway:
    """The JSON gateway of one etcd cluster, for one process (thread-safe).

    A forked child opens its own connections: it never reads an answer meant
    for its parent.
    """

    def __init__(self, url: str, timeout: float) -> None:
        self._requests = requests_module()
        self.target = EtcdURL.parse(url)
        self.url = mask_url(url)
        self.timeout = timeout
        self._lock = threading.Lock()
        self._current = 0
        self._token: str | None = None
        self._session: Any = None
        self._pid = -1
        _gateways.add(self)

    # -- connections -----------------------------------------------------------

    def session(self) -> Any:
        """The requests session of this process (TLS files and the auth token set on it)."""
        with self._lock:
            if self._session is None or self._pid != os.getpid():
                self._session, self._pid, self._token = self._new_session(), os.getpid(), None
            return self._session

    def _new_session(self) -> Any:
        session = self._requests.Session()
        # Not the environment's proxies, netrc or CA bundle: REQUESTS_CA_BUNDLE would
        # override the URL's cacert (requests reads it over Session.verify), and an
        # HTTP_PROXY meant for the web has no business between a worker and its etcd.
        session.trust_env = False
        tls = self.target.tls
        if "cacert" in tls:
            session.verify = tls["cacert"]
        if "cert" in tls:
            session.cert = (tls["cert"], tls["key"])
        return session

    def endpoints(self) -> list[str]:
        """Every endpoint, the one that answered last first."""
        with self._lock:
            first = self._current
        endpoints = self.target.endpoints
        return endpoints[first:] + endpoints[:first]

    def _answered(self, endpoint: str) -> None:
        with self._lock:
            self._current = self.target.endpoints.index(endpoint)

    def headers(self, deadline: Deadline | None = None) -> dict[str, str]:
        """The authorization header, when the store has a user (authenticating first if needed)."""
        if self.target.user is None:
            return {}
        if self._token is None or self._pid != os.getpid():
            self._authenticate(deadline or Deadline(self.timeout))
        return {"Authorization": self._token or ""}

    def _authenticate(self, deadline: Deadline) -> None:
        body = {"name": self.target.user, "password": self.target.password or ""}
        reply = self._post(
            "auth/authenticate", body, what="authenticate", auth=False, deadline=deadline
        )
        self._token = str(reply.body.get("token") or "")

    # -- calls -----------------------------------------------------------------

    def call(
        self, path: str, body: dict[str, Any], *, what: str, deadline: Deadline | None = None
    ) -> Reply:
        """POST *body* to ``/v3/<path>``; the answer, or StoreError by *deadline*.

        *deadline* bounds the whole store operation this call is part of (its
        other calls, a login included); None: this call alone, the timeout.
        """
        deadline = deadline or Deadline(self.timeout)
        try:
            return self._post(path, body, what=what, auth=True, deadline=deadline)
        except _ExpiredTokenError:
            self._token = None  # etcd's simple tokens expire (5 min by default): log in again
            return self._post(path, body, what=what, auth=True, deadline=deadline)

    def _post(
        self, path: str, body: dict[str, Any], *, what: str, auth: bool, deadline: Deadline
    ) -> Reply:
        requests = self._requests
        session = self.session()
        endpoints = self.endpoints()
        failure: StoreError | None = None
        for index, endpoint in enumerate(endpoints):
            # Half of what is left while other members remain: a busy member gets most of
            # the time, a silent one costs the others only half of it.
            budget = deadline.left() / (2 if index < len(endpoints) - 1 else 1)
            if budget <= _TOO_SHORT:
                break
            try:
                headers = self.headers(deadline) if auth else {}
                budget = min(budget, deadline.left())
                if budget <= _TOO_SHORT:
                    break
                response = session.post(
                    f"{endpoint}/v3/{path}", json=body, headers=headers, timeout=budget
                )
            except requests.Timeout:
                failure = StoreCallTimeoutError(self._message(what, f"no answer in {budget:.2g} s"))
                continue
            except requests.RequestException as exc:
                failure = StoreUnreachableError(self._message(what, _first_line(exc)))
                continue
            answer = _json(response)
            if response.status_code == _OK and "error" not in answer and "code" not in answer:
                self._answered(endpoint)
                return Reply(answer.get("result", answer), _date_of(response))
            code, text = _error_of(answer, response.reason)
            if code == _UNAUTHENTICATED and "invalid auth token" in text and auth:
                raise _ExpiredTokenError
            if (
                code in (_UNAUTHENTICATED, _PERMISSION_DENIED)
                or response.status_code in (401, 403)
                or any(words in text for words in _AUTH_WORDS)
            ):
                raise StoreAuthError(self._message(what, text))
            if code in _TRY_ANOTHER or response.status_code in (502, 503, 504):
                failure = StoreUnreachableError(self._message(what, text))
                continue
            raise StoreError(self._message(what, text))
        if failure is None:
            failure = StoreCallTimeoutError(self._message(what, f"no answer in {self.timeout:g} s"))
        raise failure

    def stream(self, path: str, body: dict[str, Any], *, idle: float) -> Iterator[dict[str, Any]]:
        """The messages of a streaming call (a watch), from the endpoint that answered last.

        Each read waits at most *idle* seconds: a member that went silent
        (paused, cut off) ends the stream with an error instead of holding
        it open forever.
        """
        requests = self._requests
        endpoint = self.endpoints()[0]
        try:
            response = self.session().post(
                f"{endpoint}/v3/{path}",
                json=body,
                headers=self.headers(),
                stream=True,
                timeout=(self.timeout, idle),
            )
        except requests.RequestException as exc:
            self._skip(endpoint)
            raise StoreUnreachableError(self._message("watch", _first_line(exc))) from None
        with response:
            if response.status_code != _OK:
                self._skip(endpoint)
                raise StoreError(self._message("watch", f"HTTP {response.status_code}"))
            try:
                for line in response.iter_lines():
                    if line.strip():
                        yield json.loads(line)
            except (requests.RequestException, ValueError) as exc:
                raise StoreUnreachableError(self._message("watch", _first_line(exc))) from None

    def _skip(self, endpoint: str) -> None:
        """The next call starts on the endpoint after *endpoint*."""
        with self._lock:
            endpoints = self.target.endpoints
            if endpoints[self._current] == endpoint:
                self._current = (self._current + 1) % len(endpoints)

    def _message(self, what: str, detail: str) -> str:
        password = self.target.password
        if password and len(password) >= _SHORTEST_SECRET:
            detail = detail.replace(password, "***").replace(quote(password), "***")
        return f"lease store {self.url}: {what} failed: {mask_text(detail)}"


class _ExpiredTokenError(Exception):
    """The auth token expired: authenticate again and repeat the call once."""


def _json(response: Any) -> dict[str, Any]:
    try:
        answer = response.json()
    except ValueError:
        return {"error": f"HTTP {response.status_code}: {response.text[:120]!r}"}
    return answer if isinstance(answer, dict) else {"error": "an answer that is not an object"}


def _error_of(answer: dict[str, Any], reason: str) -> tuple[int, str]:
    """The gRPC code and message of an error answer (unary and streaming calls word it apart)."""
    error = answer.get("error")
    if isinstance(error, dict):  # a streaming call (lease/keepalive): {"error": {...}}
        # etcd 3.4/3.5 (grpc-gateway v1) say grpc_code; 3.6 (v2) says code.
        code = error.get("grpc_code", error.get("code", 0))
        return int(code or 0), str(error.get("message") or reason)
    return int(answer.get("code", 0) or 0), str(answer.get("message") or error or reason)


def _date_of(response: Any) -> float:
    """The answering member's clock, from the Date header (whole seconds)."""
    header = response.headers.get("Date")
    if header:
        try:
            return email.utils.parsedate_to_datetime(header).timestamp()
        except (TypeError, ValueError):
            pass
    return float(int(time.time()))  # a proxy that stripped it: the client's clock stands in


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


#: Every gateway of this process, for the fork handler.
_gateways: weakref.WeakSet[Gateway] = weakref.WeakSet()
#: The gateway of each address (URL and timeout) in this process: its store objects and its
#: watch share one connection pool and one login, whatever the number of elections.
_shared: dict[tuple[str, float], Gateway] = {}
_shared_lock = threading.Lock()


def shared_gateway(url: str, timeout: float) -> Gateway:
    """The :class:`Gateway` of this process for *url* and *timeout*, made on first use."""
    with _shared_lock:
        gateway = _shared.get((url, timeout))
        if gateway is None:
            gateway = _shared[url, timeout] = Gateway(url, timeout)
        return gateway


def _after_fork_in_child() -> None:
    """A lock a parent's thread held at the fork stays held in the child: new ones."""
    global _shared_lock  # noqa: PLW0603 - the child's own registry
    _shared_lock = threading.Lock()
    for gateway in list(_gateways):
        gateway._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
