"""Azure Blob lease store (``azureblob://<container>/<prefix>``).

Each election is one blob, ``<prefix>/<election name>``, leased with Azure's
blob leases (the same primitive as Azure's BlobDistributedMutex sample and
node-cerulean's LeaseManager). The holder's record (nodename, hostname, pid,
token, acquired-at, hold-off) and the fencing counter are the blob's content,
written under the lease, so anyone can read who leads without holding it.

Safety statement
----------------
What this store guarantees:

* **Mutual exclusion** under the lease manager's timing assumptions. Azure
  enforces the lease: while it is held, only requests carrying its id can
  renew, release or write the blob, and expiry runs on Azure's clock. Lease
  ids are GUIDs (Azure rejects anything else; the emulator does not, so the
  code keeps to Azure's rule). Workers may run on any number of hosts.
* **Fencing tokens rise on every acquire**: each token is
  ``max(last + 1, Azure's clock in microseconds, min_token + 1)``, where
  Azure's clock is the ``Date`` header of the acquire's response (whole
  seconds). When the counter is missing (a new, deleted or overwritten blob,
  a deleted container) the counter starts at the next second, ``(Date + 1 s)``
  in microseconds, above every token handed out up to that second, whatever
  the acquiring client's clock says. Provided Azure's clock does not go back,
  a token repeats only if the store loses its data twice within one second,
  or a counter restored behind (an older copy of the blob) is used within the
  second of the newest token.
* **A lease that ended early makes the next holder hold off one ttl**, since
  its holder may still trust its local validity that long. Before acquiring,
  the store looks at the blob's lease state (one HEAD request); the next
  holder holds off when the counter is missing (see above), when the state is
  ``broken`` or ``breaking`` (someone called Break Lease: Azure ends the lease
  at once, the holder learns it only at its next renewal), and when the state
  was ``leased`` by another holder whose lease ended between that look and the
  acquire (released, expired or broken: the store cannot tell which, so it
  assumes the worst). The hold-off end is recorded in the blob on Azure's
  clock (``Date + 1 s + ttl``), so readers on other hosts, and the holder
  itself after a lost reply, see the same hold-off whatever their clocks say.
* **The look and the acquire are two requests, so the acquire is conditional
  on the look**: it carries the blob's ETag from the look, and fails (not
  acquired) when another client acquired and wrote its record in between.
  What remains between the two requests is harmless: a lease granted and
  broken there whose holder never wrote its record never led (its write under
  the lease fails, and so does its acquire).

What it assumes, and what happens when that does not hold:

* **A Date header** on Azure's responses. If a proxy strips it, the client's
  wall clock is used instead (logged once as a warning), and tokens after a
  loss then rise only as far as the clients' clocks agree.
* **A release during a hold-off would pass nothing on** (the next holder
  would not wait out the rest), so the lease manager never releases a term
  in its hold-off: it leaves the lease to expire (celery_leader/lease.py).
* **Nobody else writes the blobs.** A foreign blob or content is never
  overwritten while leased; a lease this store did not take blocks the
  election until it ends.

Azure's rules, and what follows from them:

* **Lease length 15..60 s** (whole seconds): other ``leader_lease_ttl`` values
  are refused at worker start. The lease is renewed every ttl/4 by default.
* **Slow takeover after an expiry**: Azure documents that once a lease expires
  (rather than being released) a new acquire can take up to a minute to
  succeed on the real service. So the failover bound after a crash on Azure is
  ttl + up to 60 s; a release (shutdown, step-down) is seen by standbys at
  their next look, ``leader_azure_watch_interval`` (0.5 s) later.
* **A stopped or cut-off client holds a blob lease at most its duration**:
  the only thing Azure keeps for a client between its requests is a lease,
  and Azure ends it on its own clock. A client stopped after acquiring a
  free blob (before writing its record) holds the election until its lease
  runs out, 15..60 s, as any holder that stopped; its write after that
  fails. It never holds anything that a live holder's renewal waits on.
* **No notifications**: Azure has no pub/sub for leases, so standbys look at
  the blob's lease state (one HEAD request) every watch interval.
* **No time left**: Azure does not say how long a lease has left;
  ``expires_in`` reports the lease duration, an upper bound.
* **Nor when it was last renewed**: so after each renewal the holder writes
  the renewal's time (Azure's ``Date``) into the blob's metadata, under its
  lease, from a thread of its own so that the renewal itself stays one
  request. Readers get ``renewed_ago`` from it, to about a second. That is
  one more write request per renewal; a write that fails is dropped, and
  the record then shows the renewal before it.

Every call carries a timeout bounded by the store timeout, and the SDK's own
retries are off: the lease manager retries, within the lease (the SDK's
defaults would keep one call going for more than a minute). Every method
raises only :class:`~celery_leader.exceptions.StoreError` (or
:class:`~celery_leader.exceptions.StoreAuthError`), with secrets masked.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from email.utils import parsedate_to_datetime
from typing import Any, ClassVar
from urllib.parse import urlsplit

from celery_leader._catalogue import Owner, Setting, check, names_of, register
from celery_leader._masking import mask_text, mask_url
from celery_leader._values import positive_seconds
from celery_leader.exceptions import (
    ConfigurationError,
    StoreAuthError,
    StoreCallTimeoutError,
    StoreError,
    StoreUnreachableError,
)
from celery_leader.stores import rules
from celery_leader.stores.base import (
    AcquireResult,
    Capability,
    Holder,
    LeaseRecord,
    LeaseStoreClass,
    MissingExtraError,
    Watch,
)
from celery_leader.stores.watch import poll

#: The URL beginning this store serves, and the extra that installs the Azure SDK.
SCHEMES = ("azureblob://",)
EXTRA = "azure"
DEFAULT_WATCH_INTERVAL = 0.5


# The store's settings are declared before the SDK is imported: a project that sets them
# without the extra installed still has them known (and checked) as settings.
def _connection_string(name: str, value: Any) -> str:
    # Named by type only: the connection string holds the account key.
    if not isinstance(value, str):
        raise ConfigurationError(
            f"{name} ({type(value).__name__}) is not allowed: it must be an Azure Storage "
            "connection string"
        )
    return value


def _is_http_url(value: object) -> bool:
    return isinstance(value, str) and urlsplit(value).scheme in ("https", "http")


def _account_url(name: str, value: Any) -> str:
    if not _is_http_url(value):
        raise ConfigurationError(
            f"{name}={mask_url(str(value))!r} is not allowed: it must be the account's blob "
            "endpoint, https://<account>.blob.core.windows.net"
        )
    return str(value)


CONNECTION_STRING: Setting[str] = Setting(
    "leader_azure_connection_string",
    Owner.STORE,
    default="the `AZURE_STORAGE_CONNECTION_STRING` environment variable",
    allowed="an Azure Storage connection string (a secret: never printed)",
    description="The Azure Storage account that holds the lease blobs.",
    parse=_connection_string,
    store=SCHEMES[0],
)
ACCOUNT_URL: Setting[str] = Setting(
    "leader_azure_account_url",
    Owner.STORE,
    default="none",
    allowed="`https://<account>.blob.core.windows.net`",
    description=(
        "The account's blob endpoint, used with `DefaultAzureCredential` (azure-identity) when "
        "no connection string is given."
    ),
    parse=_account_url,
    store=SCHEMES[0],
)
WATCH_INTERVAL: Setting[float] = Setting(
    "leader_azure_watch_interval",
    Owner.STORE,
    default=f"{DEFAULT_WATCH_INTERVAL:g} seconds",
    allowed="a number of seconds > 0",
    description=(
        "How often standbys look for a released lease (Azure has no notifications): a "
        "release is seen within about this long."
    ),
    parse=positive_seconds,
    store=SCHEMES[0],
)
SETTINGS = register(CONNECTION_STRING, ACCOUNT_URL, WATCH_INTERVAL)

try:
    from azure.core import MatchConditions
    from azure.core.exceptions import (
        AzureError,
        ClientAuthenticationError,
        HttpResponseError,
        ResourceExistsError,
        ServiceRequestError,
        ServiceRequestTimeoutError,
        ServiceResponseTimeoutError,
    )
    from azure.identity import DefaultAzureCredential
    from azure.storage.blob import BlobClient, BlobLeaseClient, BlobServiceClient
except ImportError as exc:  # pragma: no cover - the extra is not installed
    raise MissingExtraError(SCHEMES[0], EXTRA) from exc

logger = logging.getLogger(__name__)

#: Azure's allowed lease lengths, seconds.
AZURE_TTL_RANGE = (15.0, 60.0)
#: The blob metadata key that holds the time of the holder's last acquire or renewal
#: (Azure's clock, unix seconds): Azure keeps no such time for a lease.
RENEWED_KEY = "renewed_at"

#: Error codes meaning "the lease is held by someone else".
_HELD = frozenset({"LeaseAlreadyPresent"})
#: Error codes meaning "this is not (or no longer) our lease".
_NOT_OURS = frozenset(
    {
        "LeaseIdMismatchWithLeaseOperation",
        "LeaseIdMismatchWithBlobOperation",
        "LeaseNotPresentWithLeaseOperation",
        "LeaseNotPresentWithBlobOperation",
        "LeaseIsBrokenAndCannotBeRenewed",
        "LeaseIsBreakingAndCannotBeAcquired",
        "LeaseIsBreakingAndCannotBeChanged",
        "LeaseLost",
        "LeaseIdMissing",
        "ConditionNotMet",
        # The blob or its container is gone: whatever lease there was is not ours.
        "BlobNotFound",
        "ContainerNotFound",
    }
)
#: Error codes meaning "the blob (or its container) does not exist".
_GONE = frozenset({"BlobNotFound", "ContainerNotFound"})
_AUTH = frozenset(
    {
        "AuthenticationFailed",
        "AuthorizationFailure",
        "AuthorizationPermissionMismatch",
        "InvalidAuthenticationInfo",
        "NoAuthenticationInformation",
    }
)
#: Lease states after which the last holder may still trust its validity.
_ENDED_EARLY = frozenset({"broken", "breaking"})


def lease_guid(lease_id: str) -> str:
    """The GUID form Azure requires for a holder's lease id."""
    try:
        return str(uuid.UUID(lease_id))
    except ValueError:
        return str(uuid.uuid5(uuid.NAMESPACE_URL, lease_id))


def _code(exc: HttpResponseError) -> str:
    """Azure's error code as plain text (the SDK gives a str enum or a str)."""
    code = getattr(exc, "error_code", None) or ""
    return str(getattr(code, "value", code))


class _NotOursError(Exception):
    """Internal: Azure said the lease is not ours. Never leaves the store."""


class _AzureClock:
    """Azure's clock, read from the ``Date`` header of a call's response (whole seconds).

    Pass :meth:`hook` as the call's ``raw_response_hook``.
    """

    _warned = False

    def __init__(self) -> None:
        self._date: float | None = None

    def hook(self, response: Any) -> None:
        value = response.http_response.headers.get("Date")
        if value:
            with suppress(TypeError, ValueError, IndexError, OverflowError):
                self._date = parsedate_to_datetime(value).timestamp()

    def now(self, url: str) -> float:
        """Azure's time of the response (truncated to the second), else the client's clock."""
        if self._date is not None:
            return self._date
        if not _AzureClock._warned:
            _AzureClock._warned = True
            logger.warning(
                "celery-leader: %s answered without a Date header; using this host's clock "
                "for fencing tokens and hold-offs",
                url,
            )
        return time.time()


def _as_dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _float_or_none(value: object) -> float | None:
    """A number written as text (blob metadata), or None."""
    try:
        return float(str(value)) if value is not None else None
    except ValueError:
        return None


def _as_number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0.0
    return float(value)


class _RenewalStamps:
    """Writes the time of each renewal into its blob's metadata, off the renewal's own path.

    A renewal must answer within the store timeout, and a second request in
    it would make a slow renewal that succeeded look failed. So ``renew()``
    hands the time over to this one thread, which writes the latest time per
    blob under the renewing holder's lease: Azure refuses the write once the
    lease is no longer that holder's, so it never lands on another term. A
    write that fails is dropped; the record then shows an earlier renewal,
    never a later one than happened.
    """

    def __init__(self, write: Callable[[str, str, float], None]) -> None:
        self._write = write
        self._pending: dict[str, tuple[str, float]] = {}
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def submit(self, name: str, guid: str, at: float) -> None:
        """Record that the lease *guid* of *name* was renewed at *at* (Azure's clock)."""
        with self._cond:
            if self._closed:
                return
            self._pending[name] = (guid, at)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="celery-leader-azure-renewals", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                name, (guid, at) = self._pending.popitem()
            try:
                self._write(name, guid, at)
            except Exception as exc:  # noqa: BLE001 - only a record of the renewal, which landed
                logger.debug("could not record the renewal of %s: %s", name, mask_text(str(exc)))

    def close(self) -> None:
        """Stop; a write in flight may still finish (its failure is dropped)."""
        with self._cond:
            self._closed = True
            self._cond.notify()


class AzureBlobLeaseStore:
    """Leases as Azure blob leases; see the module docstring."""

    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {
            Capability.RELEASE_NOTIFICATION,  # by polling the lease state, see watch()
            Capability.SERVER_TIME,
            Capability.FENCING_SURVIVES_DATA_LOSS,
            Capability.MULTI_HOST,
        }
    )
    schemes: ClassVar[tuple[str, ...]] = SCHEMES
    extra: ClassVar[str | None] = EXTRA
    ttl_range: ClassVar[tuple[float | None, float | None]] = AZURE_TTL_RANGE
    default_renew_fraction: ClassVar[float] = 0.25
    option_keys: ClassVar[frozenset[str]] = names_of(SETTINGS)

    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> None:
        """Check the ``leader_azure_*`` keys: one line per problem, naming the key.

        The connection string is never echoed: it holds the account key.
        """
        check(SETTINGS, options)

    def __init__(
        self,
        service: BlobServiceClient,
        container: str,
        prefix: str,
        url: str,
        *,
        timeout: float,
        watch_interval: float = DEFAULT_WATCH_INTERVAL,
    ) -> None:
        self._service = service
        self._container = container
        self._prefix = prefix.strip("/")
        self.url = mask_url(url)
        self._timeout = timeout
        self._watch_interval = watch_interval
        self._lock = threading.Lock()
        self._renewals = _RenewalStamps(self._stamp_renewal)

    @classmethod
    def from_url(
        cls, url: str, *, timeout: float, options: Mapping[str, Any] | None = None
    ) -> AzureBlobLeaseStore:
        """Open the store; the account comes from *options* or the environment.

        Options: ``leader_azure_connection_string`` (else the
        ``AZURE_STORAGE_CONNECTION_STRING`` environment variable), or
        ``leader_azure_account_url`` with ``DefaultAzureCredential``.
        """
        options = dict(options or {})
        parts = urlsplit(url)
        container, prefix = parts.netloc, parts.path.strip("/")
        if not container:
            raise ConfigurationError(
                f"leader_backend_url={mask_url(url)!r} is not allowed: use "
                "azureblob://<container>/<prefix>"
            )
        client_options: dict[str, Any] = {
            "retry_total": 0,
            "connection_timeout": timeout,
            "read_timeout": timeout,
        }
        connection_string = CONNECTION_STRING.read(options) or os.environ.get(
            "AZURE_STORAGE_CONNECTION_STRING"
        )
        account_url = ACCOUNT_URL.read(options)
        try:
            if connection_string:
                service = BlobServiceClient.from_connection_string(
                    connection_string, **client_options
                )
            elif account_url:
                service = BlobServiceClient(
                    account_url, credential=DefaultAzureCredential(), **client_options
                )
            else:
                raise ConfigurationError(
                    "the azureblob:// store needs an account: set leader_azure_connection_string, "
                    "the AZURE_STORAGE_CONNECTION_STRING environment variable, or "
                    "leader_azure_account_url (with DefaultAzureCredential)"
                )
        except (ValueError, AzureError) as exc:
            raise ConfigurationError(
                f"leader_azure_connection_string is not usable: {mask_text(str(exc))}"
            ) from None
        interval = WATCH_INTERVAL.read_or(options, DEFAULT_WATCH_INTERVAL)
        return cls(service, container, prefix, url, timeout=timeout, watch_interval=interval)

    # -- plumbing -------------------------------------------------------------

    def _blob_name(self, name: str) -> str:
        return f"{self._prefix}/{name}" if self._prefix else name

    def _blob(self, name: str) -> BlobClient:
        return self._service.get_blob_client(self._container, self._blob_name(name))

    def _server_timeout(self) -> int:
        return max(1, math.ceil(self._timeout))

    @contextmanager
    def _translated(self, what: str, *, not_ours: bool = False) -> Iterator[None]:
        """Turn every failure into StoreError / StoreAuthError.

        With *not_ours*, Azure's "not your lease" and "no such blob" answers
        raise :class:`_NotOursError` instead, for the caller to turn into a
        False or an empty answer; without it they are store errors too, so
        the internal exception can never leave the store.
        """
        try:
            yield
        except _NotOursError as exc:
            if not_ours:
                raise
            raise StoreError(self._message(what, exc, str(exc))) from None
        except ClientAuthenticationError as exc:
            raise StoreAuthError(self._message(what, exc)) from None
        except HttpResponseError as exc:
            code = _code(exc)
            if code in _AUTH or exc.status_code == 403:  # noqa: PLR2004 - HTTP Forbidden
                raise StoreAuthError(self._message(what, exc, code)) from None
            if not_ours and code in _NOT_OURS:
                raise _NotOursError(code) from None
            raise StoreError(self._message(what, exc, code)) from None
        except (ServiceRequestTimeoutError, ServiceResponseTimeoutError) as exc:
            raise StoreCallTimeoutError(self._message(what, exc)) from None
        except ServiceRequestError as exc:  # the request never reached the service
            raise StoreUnreachableError(self._message(what, exc)) from None
        except (AzureError, OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            raise StoreError(self._message(what, exc)) from None

    def _message(self, what: str, exc: BaseException, code: str = "") -> str:
        detail = code or type(exc).__name__
        first_line = mask_text(str(exc)).splitlines()[0] if str(exc) else ""
        return f"lease store {self.url}: {what} failed: {detail}: {first_line}"[:500]

    def _ensure_blob(self, name: str) -> None:
        """Create the container and the blob when missing (racing creators are fine)."""
        timeout = self._server_timeout()
        with suppress(ResourceExistsError):
            self._service.get_container_client(self._container).create_container(timeout=timeout)
        try:
            self._blob(name).upload_blob(b"", overwrite=False, timeout=timeout)
        except ResourceExistsError:
            pass
        except HttpResponseError as exc:
            if _code(exc) not in ("LeaseIdMissing", "BlobAlreadyExists"):
                raise

    def _properties(self, name: str, blob: BlobClient) -> Any:
        """The blob's properties (one HEAD request), creating the blob when it is missing."""
        try:
            return blob.get_blob_properties(timeout=self._server_timeout())
        except HttpResponseError as exc:
            if _code(exc) not in _GONE and exc.status_code != 404:  # noqa: PLR2004 - Not Found
                raise
        self._ensure_blob(name)
        return blob.get_blob_properties(timeout=self._server_timeout())

    def _read_content(self, blob: BlobClient, lease: str | None = None) -> dict[str, Any]:
        return self._download(blob, lease)[0]

    def _download(
        self, blob: BlobClient, lease: str | None = None
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """The blob's JSON content and its metadata (one GET request)."""
        downloader = blob.download_blob(lease=lease, timeout=self._server_timeout())
        metadata = dict(getattr(downloader.properties, "metadata", None) or {})
        raw = downloader.readall()
        if not raw:
            return {}, metadata
        try:
            data = json.loads(raw)
        except ValueError:
            return {}, metadata
        return _as_dict(data), metadata

    # -- the contract ---------------------------------------------------------

    def acquire(self, name: str, holder: Holder, ttl: float, min_token: int = 0) -> AcquireResult:
        """Look at the lease state, acquire the blob lease on that look, write a new token.

        See the module docstring for the hold-off rules and the races left.
        """
        guid = lease_guid(holder.lease_id)
        duration = min(int(AZURE_TTL_RANGE[1]), math.ceil(ttl))
        with self._translated("acquire"):
            blob = self._blob(name)
            properties = self._properties(name, blob)
            state = str(properties.lease.state or "")
            clock = _AzureClock()
            try:
                BlobLeaseClient(blob, lease_id=guid).acquire(
                    lease_duration=duration,
                    etag=properties.etag,
                    match_condition=MatchConditions.IfNotModified,
                    timeout=self._server_timeout(),
                    raw_response_hook=clock.hook,
                )
            except HttpResponseError as exc:
                code = _code(exc)
                if code in _HELD or code.startswith("LeaseIsBreaking") or code == "ConditionNotMet":
                    # Held, or taken (and written) by another since our look.
                    record = self._record_if_any(name)
                    return AcquireResult(
                        acquired=False,
                        holder=record,
                        retry_in=ttl / 4 if record is not None else self._watch_interval,
                    )
                raise
            now = clock.now(self.url)
            content = self._read_content(blob, lease=guid)
            token, hold_until, hold_off = self._next_term(
                content, guid, state=state, now=now, ttl=ttl, min_token=min_token
            )
            content.update(
                {
                    "last_token": token,
                    "holder": {
                        "lease": guid,
                        "nodename": holder.nodename,
                        "hostname": holder.hostname,
                        "pid": holder.pid,
                        "token": token,
                        "acquired_at": now,
                        "ttl": duration,
                        "hold_until": hold_until,
                    },
                }
            )
            blob.upload_blob(
                json.dumps(content).encode(),
                overwrite=True,
                lease=guid,  # type: ignore[arg-type]  # the SDK takes a lease id string too
                # Replaces any earlier term's metadata: the renewal time is this term's.
                metadata={RENEWED_KEY: repr(now)},
                timeout=self._server_timeout(),
            )
        return AcquireResult(acquired=True, token=token, hold_off=hold_off)

    @staticmethod
    def _next_term(
        content: dict[str, Any], guid: str, *, state: str, now: float, ttl: float, min_token: int
    ) -> tuple[int, float, float]:
        """The new term's token, hold-off end (Azure's clock) and hold-off (seconds from now).

        *content* is the blob we now lease, *state* the lease state seen
        before acquiring, *now* Azure's (whole-second) time of the acquire.
        """
        previous = _as_dict(content.get("holder"))
        raw_last = content.get("last_token")
        last = raw_last if isinstance(raw_last, int) and not isinstance(raw_last, bool) else None
        ours = previous.get("lease") == guid
        # Our own acquire whose reply was lost: its hold-off still runs.
        own_hold_until = _as_number(previous.get("hold_until")) if ours else 0.0
        forgot = rules.store_forgot(
            counter_missing=last is None,
            # Broken, or leased by another at our look and ours now: released, expired
            # or broken in between, and the store cannot tell which.
            ended_early=state in _ENDED_EARLY or (state == "leased" and not ours),
        )
        # Azure's clock reads whole seconds: the grant may be up to the end of that
        # second. The recorded end counts from there; the wait counts from the reply.
        hold_until, hold_off = rules.hold_off(
            now=now,
            ttl=float(ttl),
            own_hold_until=own_hold_until,
            forgot=forgot,
            now_latest=float(int(now) + 1),
        )
        now_us = int(now) * 1_000_000
        token = rules.next_token(last, now_us, min_token, clock_latest=now_us + 1_000_000)
        return token, hold_until, hold_off

    def renew(self, name: str, lease_id: str, ttl: float) -> bool:
        """Renew our blob lease; False when Azure says it is not ours.

        The renewal's time is written into the blob's metadata afterwards, by
        another thread (see :class:`_RenewalStamps`): one request per
        renewal here, whatever that write does.
        """
        guid = lease_guid(lease_id)
        clock = _AzureClock()
        try:
            with self._translated("renew", not_ours=True):
                BlobLeaseClient(self._blob(name), lease_id=guid).renew(
                    timeout=self._server_timeout(), raw_response_hook=clock.hook
                )
        except _NotOursError:
            return False
        self._renewals.submit(name, guid, clock.now(self.url))
        return True

    def _stamp_renewal(self, name: str, guid: str, at: float) -> None:
        """Write *at* as the lease's last renewal, under the lease *guid* (Azure checks it)."""
        self._blob(name).set_blob_metadata(
            metadata={RENEWED_KEY: repr(at)},
            lease=guid,
            timeout=self._server_timeout(),
        )

    def release(self, name: str, lease_id: str) -> bool:
        """Release our blob lease; False when it was not ours."""
        try:
            with self._translated("release", not_ours=True):
                BlobLeaseClient(self._blob(name), lease_id=lease_guid(lease_id)).release(
                    timeout=self._server_timeout()
                )
        except _NotOursError:
            return False
        return True

    def _record(self, name: str) -> LeaseRecord | None:
        blob = self._blob(name)
        clock = _AzureClock()
        properties = blob.get_blob_properties(
            timeout=self._server_timeout(), raw_response_hook=clock.hook
        )
        if properties.lease.state != "leased":
            return None
        holder = _as_dict(self._read_content(blob).get("holder"))
        now = clock.now(self.url)
        renewed_at = _as_number(_float_or_none((properties.metadata or {}).get(RENEWED_KEY)))
        try:
            return LeaseRecord(
                nodename=str(holder["nodename"]),
                hostname=str(holder["hostname"]),
                pid=int(holder["pid"]),
                token=int(holder["token"]),
                acquired_at=float(holder["acquired_at"]),
                expires_in=_as_number(holder.get("ttl")),
                hold_off=max(0.0, _as_number(holder.get("hold_until")) - now),
                # Both times are Azure's whole-second Date headers: about a second either way.
                renewed_ago=max(0.0, now - renewed_at) if renewed_at > 0 else None,
                expires_in_exact=False,
            )
        except (KeyError, TypeError, ValueError):
            return None

    def _record_if_any(self, name: str) -> LeaseRecord | None:
        """The holder's record, or None when the blob vanished meanwhile."""
        try:
            with self._translated("read", not_ours=True):
                return self._record(name)
        except _NotOursError:
            return None

    def read(self, name: str) -> LeaseRecord | None:
        """The holder written in the blob, while the blob is leased."""
        return self._record_if_any(name)

    def last_token(self, name: str) -> int | None:
        """The fencing counter kept in the blob; None when the blob or the counter is missing."""
        try:
            with self._translated("read", not_ours=True):
                raw = self._read_content(self._blob(name)).get("last_token")
        except _NotOursError:  # no blob yet
            return None
        return raw if isinstance(raw, int) and not isinstance(raw, bool) else None

    def get_state(self, name: str) -> dict[str, str]:
        """The state kept in the blob's content."""
        try:
            with self._translated("read state", not_ours=True):
                state = _as_dict(self._read_content(self._blob(name)).get("state"))
        except _NotOursError:  # no blob yet
            return {}
        return {str(k): str(v) for k, v in state.items()}

    def set_state(self, name: str, lease_id: str, key: str, value: str) -> bool:
        """Write one state key into the blob, under our lease (Azure refuses others)."""
        guid = lease_guid(lease_id)
        try:
            with self._translated("write state", not_ours=True):
                blob = self._blob(name)
                content, metadata = self._download(blob, lease=guid)
                state = _as_dict(content.get("state"))
                state[key] = value
                content["state"] = state
                blob.upload_blob(
                    json.dumps(content).encode(),
                    overwrite=True,
                    lease=guid,  # type: ignore[arg-type]  # the SDK takes a lease id string too
                    metadata=metadata,  # an upload replaces the metadata: keep the renewal time
                    timeout=self._server_timeout(),
                )
        except _NotOursError:
            return False
        return True

    def watch(self, name: str, callback: Callable[[], None]) -> Watch:
        """Look at the lease state every watch interval; call back when it turns free."""
        was_free = False

        def freed() -> bool:
            nonlocal was_free
            free = self.lease_is_free(name)
            turned_free = free and not was_free
            was_free = free
            return turned_free

        return poll(
            name,
            callback,
            interval=self._watch_interval,
            freed=freed,
            expected=(StoreError, _NotOursError),
        )

    def lease_is_free(self, name: str) -> bool:
        """True when the blob is not leased (one HEAD request)."""
        try:
            with self._translated("look", not_ours=True):
                properties = self._blob(name).get_blob_properties(timeout=self._server_timeout())
        except _NotOursError:  # no blob: nobody holds it
            return True
        return bool(properties.lease.state != "leased")

    def close(self) -> None:
        """Close the HTTP session."""
        self._renewals.close()
        self._service.close()


#: The class declares what the registry, the settings and the tests read (checked by mypy).
_DECLARES: LeaseStoreClass = AzureBlobLeaseStore
