"""Azure Blob lease store (``azureblob://<container>/<prefix>``).

Each election is one blob, ``<prefix>/<election name>``, leased with Azure's
blob leases (the same primitive as Azure's BlobDistributedMutex sample and
node-cerulean's LeaseManager). The holder's record (nodename, hostname, pid,
token, acquired-at) and the fencing counter are the blob's content, written
under the lease, so anyone can read who leads without holding it.

Safety statement
----------------
Azure enforces the lease: while it is held, only requests carrying its id can
renew, release or write the blob. Expiry runs on Azure's clock. Lease ids are
GUIDs (Azure rejects anything else; the emulator does not, so the code keeps
to Azure's rule).

Azure's rules, and what follows from them:

* **Lease length 15..60 s** (whole seconds): other ``leader_lease_ttl`` values
  are refused at worker start. The lease is renewed every ttl/4 by default.
* **Slow takeover after an expiry**: Azure documents that once a lease expires
  (rather than being released) a new acquire can take up to a minute to
  succeed on the real service. So the failover bound after a crash on Azure is
  ttl + up to 60 s; a release (shutdown, step-down) is seen by standbys at
  their next look, ``leader_azure_watch_interval`` (0.5 s) later.
* **No notifications**: Azure has no pub/sub for leases, so standbys look at
  the blob's lease state (one HEAD request) every watch interval.
* **No time left**: Azure does not say how long a lease has left;
  ``expires_in`` reports the lease duration, an upper bound.
* **Fencing after data loss**: a blob that was deleted (or a new container)
  restarts the counter from the clock in microseconds, and the first holder
  holds off one ttl.

Every call carries a timeout bounded by the store timeout, and the SDK's own
retries are off: the lease manager retries, within the lease (the SDK's
defaults would keep one call going for more than a minute).
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
from typing import Any
from urllib.parse import urlsplit

from celery_leader._masking import mask_text, mask_url
from celery_leader.exceptions import ConfigurationError, StoreAuthError, StoreError
from celery_leader.stores.base import AcquireResult, Capability, Holder, LeaseRecord, Watch

try:
    from azure.core.exceptions import (
        AzureError,
        ClientAuthenticationError,
        HttpResponseError,
        ResourceExistsError,
    )
    from azure.identity import DefaultAzureCredential
    from azure.storage.blob import BlobClient, BlobLeaseClient, BlobServiceClient
except ImportError as exc:  # pragma: no cover - the extra is not installed
    raise ImportError(
        "the azureblob:// store needs the azure extra: pip install 'celery-leader[azure]'"
    ) from exc

logger = logging.getLogger(__name__)

#: Azure's allowed lease lengths, seconds.
AZURE_TTL_RANGE = (15.0, 60.0)
DEFAULT_WATCH_INTERVAL = 0.5

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
_AUTH = frozenset(
    {
        "AuthenticationFailed",
        "AuthorizationFailure",
        "AuthorizationPermissionMismatch",
        "InvalidAuthenticationInfo",
        "NoAuthenticationInformation",
    }
)


def lease_guid(lease_id: str) -> str:
    """The GUID form Azure requires for a holder's lease id."""
    try:
        return str(uuid.UUID(lease_id))
    except ValueError:
        return str(uuid.uuid5(uuid.NAMESPACE_URL, lease_id))


class _NotOursError(Exception):
    """Internal: Azure said the lease is not ours."""


class AzureBlobLeaseStore:
    """Leases as Azure blob leases; see the module docstring."""

    capabilities = frozenset(
        {
            Capability.RELEASE_NOTIFICATION,  # by polling the lease state, see watch()
            Capability.SERVER_TIME,
            Capability.FENCING_SURVIVES_DATA_LOSS,
            Capability.MULTI_HOST,
        }
    )
    ttl_range: tuple[float | None, float | None] = AZURE_TTL_RANGE
    default_renew_fraction = 0.25

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
        self._ready: set[str] = set()
        self._lock = threading.Lock()

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
        connection_string = options.get("leader_azure_connection_string") or os.environ.get(
            "AZURE_STORAGE_CONNECTION_STRING"
        )
        account_url = options.get("leader_azure_account_url")
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
        interval = float(options.get("leader_azure_watch_interval") or DEFAULT_WATCH_INTERVAL)
        return cls(service, container, prefix, url, timeout=timeout, watch_interval=interval)

    # -- plumbing -------------------------------------------------------------

    def _blob_name(self, name: str) -> str:
        return f"{self._prefix}/{name}" if self._prefix else name

    def _blob(self, name: str) -> BlobClient:
        return self._service.get_blob_client(self._container, self._blob_name(name))

    def _server_timeout(self) -> int:
        return max(1, math.ceil(self._timeout))

    @contextmanager
    def _translated(self, what: str) -> Iterator[None]:
        try:
            yield
        except _NotOursError:
            raise
        except ClientAuthenticationError as exc:
            raise StoreAuthError(self._message(what, exc)) from None
        except HttpResponseError as exc:
            code = getattr(exc, "error_code", None) or ""
            if code in _AUTH or exc.status_code == 403:  # noqa: PLR2004 - HTTP Forbidden
                raise StoreAuthError(self._message(what, exc, code)) from None
            if code in _NOT_OURS:
                raise _NotOursError(code) from None
            raise StoreError(self._message(what, exc, code)) from None
        except (AzureError, OSError, ValueError) as exc:
            raise StoreError(self._message(what, exc)) from None

    def _message(self, what: str, exc: BaseException, code: str = "") -> str:
        detail = code or type(exc).__name__
        first_line = mask_text(str(exc)).splitlines()[0] if str(exc) else ""
        return f"lease store {self.url}: {what} failed: {detail}: {first_line}"[:500]

    def _ensure_blob(self, name: str) -> None:
        """Create the container and the blob when missing (racing creators are fine)."""
        if name in self._ready:
            return
        timeout = self._server_timeout()
        with suppress(ResourceExistsError):
            self._service.get_container_client(self._container).create_container(timeout=timeout)
        try:
            self._blob(name).upload_blob(b"", overwrite=False, timeout=timeout)
        except ResourceExistsError:
            pass
        except HttpResponseError as exc:
            if (getattr(exc, "error_code", "") or "") not in (
                "LeaseIdMissing",
                "BlobAlreadyExists",
            ):
                raise
        self._ready.add(name)

    def _read_content(self, blob: BlobClient, lease: str | None = None) -> dict[str, Any]:
        raw = blob.download_blob(lease=lease, timeout=self._server_timeout()).readall()
        if not raw:
            return {}
        try:
            data = json.loads(raw)
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}

    # -- the contract ---------------------------------------------------------

    def acquire(self, name: str, holder: Holder, ttl: float, min_token: int = 0) -> AcquireResult:
        """Acquire the blob lease (or re-acquire our own), then write a new token under it."""
        guid = lease_guid(holder.lease_id)
        duration = min(int(AZURE_TTL_RANGE[1]), math.ceil(ttl))
        with self._translated("acquire"):
            self._ensure_blob(name)
            blob = self._blob(name)
            lease = BlobLeaseClient(blob, lease_id=guid)
            try:
                lease.acquire(lease_duration=duration, timeout=self._server_timeout())
            except HttpResponseError as exc:
                code = getattr(exc, "error_code", "") or ""
                if code in _HELD or code.startswith("LeaseIsBreaking"):
                    return AcquireResult(
                        acquired=False, holder=self._record(name), retry_in=ttl / 4
                    )
                if code in ("BlobNotFound", "ContainerNotFound"):
                    self._ready.discard(name)  # deleted under us: create it again next time
                    raise StoreError(self._message("acquire", exc, code)) from None
                raise
            content = self._read_content(blob, lease=guid)
            now_us = time.time_ns() // 1000
            last = content.get("last_token")
            found = content.get("holder")
            previous: dict[str, Any] = found if isinstance(found, dict) else {}
            hold_off = 0.0
            if previous.get("lease") == guid:
                # Our own acquire whose reply was lost: its hold-off still runs.
                hold_off = max(0.0, float(previous.get("hold_until", 0)) - time.time())
            if not isinstance(last, int):
                last, hold_off = max(now_us, min_token), float(ttl)
            token = max(int(last), int(min_token)) + 1
            content.update(
                {
                    "last_token": token,
                    "holder": {
                        "lease": guid,
                        "nodename": holder.nodename,
                        "hostname": holder.hostname,
                        "pid": holder.pid,
                        "token": token,
                        "acquired_at": time.time(),
                        "ttl": duration,
                        "hold_until": time.time() + hold_off,
                    },
                }
            )
            blob.upload_blob(
                json.dumps(content).encode(),
                overwrite=True,
                lease=guid,  # type: ignore[arg-type]  # the SDK takes a lease id string too
                timeout=self._server_timeout(),
            )
        return AcquireResult(acquired=True, token=token, hold_off=hold_off)

    def renew(self, name: str, lease_id: str, ttl: float) -> bool:
        """Renew our blob lease; False when Azure says it is not ours."""
        try:
            with self._translated("renew"):
                BlobLeaseClient(self._blob(name), lease_id=lease_guid(lease_id)).renew(
                    timeout=self._server_timeout()
                )
        except _NotOursError:
            return False
        return True

    def release(self, name: str, lease_id: str) -> bool:
        """Release our blob lease; False when it was not ours."""
        try:
            with self._translated("release"):
                BlobLeaseClient(self._blob(name), lease_id=lease_guid(lease_id)).release(
                    timeout=self._server_timeout()
                )
        except _NotOursError:
            return False
        return True

    def _record(self, name: str) -> LeaseRecord | None:
        blob = self._blob(name)
        properties = blob.get_blob_properties(timeout=self._server_timeout())
        if properties.lease.state != "leased":
            return None
        holder = self._read_content(blob).get("holder")
        if not isinstance(holder, dict):
            return None
        try:
            return LeaseRecord(
                nodename=str(holder["nodename"]),
                hostname=str(holder["hostname"]),
                pid=int(holder["pid"]),
                token=int(holder["token"]),
                acquired_at=float(holder["acquired_at"]),
                expires_in=float(holder.get("ttl", 0)),
                hold_off=max(0.0, float(holder.get("hold_until", 0)) - time.time()),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def read(self, name: str) -> LeaseRecord | None:
        """The holder written in the blob, while the blob is leased."""
        try:
            with self._translated("read"):
                return self._record(name)
        except _NotOursError:  # no blob, no lease
            return None

    def get_state(self, name: str) -> dict[str, str]:
        """The state kept in the blob's content."""
        try:
            with self._translated("read state"):
                state = self._read_content(self._blob(name)).get("state") or {}
        except _NotOursError:  # no blob yet
            return {}
        return {str(k): str(v) for k, v in state.items()}

    def set_state(self, name: str, lease_id: str, key: str, value: str) -> bool:
        """Write one state key into the blob, under our lease (Azure refuses others)."""
        guid = lease_guid(lease_id)
        try:
            with self._translated("write state"):
                blob = self._blob(name)
                content = self._read_content(blob, lease=guid)
                content.setdefault("state", {})[key] = value
                blob.upload_blob(
                    json.dumps(content).encode(),
                    overwrite=True,
                    lease=guid,  # type: ignore[arg-type]  # the SDK takes a lease id string too
                    timeout=self._server_timeout(),
                )
        except _NotOursError:
            return False
        return True

    def watch(self, name: str, callback: Callable[[], None]) -> Watch:
        """Look at the lease state every watch interval; call back when it is free."""
        return _LeaseStateWatch(self, name, callback, self._watch_interval)

    def lease_is_free(self, name: str) -> bool:
        """True when the blob is not leased (one HEAD request)."""
        try:
            with self._translated("look"):
                properties = self._blob(name).get_blob_properties(timeout=self._server_timeout())
        except _NotOursError:  # no blob: nobody holds it
            return True
        return bool(properties.lease.state != "leased")

    def close(self) -> None:
        """Close the HTTP session."""
        self._service.close()


class _LeaseStateWatch:
    """Polls a blob's lease state; calls back when it turns free."""

    def __init__(
        self, store: AzureBlobLeaseStore, name: str, callback: Callable[[], None], interval: float
    ) -> None:
        self._store, self._name, self._callback = store, name, callback
        self._interval = interval
        self._closed = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"celery-leader-watch[{name}]", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        was_free = False
        while not self._closed.wait(self._interval):
            try:
                free = self._store.lease_is_free(self._name)
            except (StoreError, _NotOursError):
                continue
            if free and not was_free and not self._closed.is_set():
                try:
                    self._callback()
                except Exception:
                    logger.exception("release watch callback failed")
            was_free = free

    def close(self) -> None:
        """Stop polling."""
        self._closed.set()
