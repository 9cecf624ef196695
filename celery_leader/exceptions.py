"""The error family of celery-leader.

Three kinds, kept apart on purpose:

* :class:`ConfigurationError`: you misconfigured it. Raised at start, never at
  run time; the message names the setting, the value and what is allowed.
* :class:`StoreError` (and :class:`StoreAuthError`): the lease store could not
  be reached or refused us. The lease manager catches these, treats them as
  "not leader" and retries; they never escape its thread.
* :class:`LeaseLost`: you lost it. Raised inside a leader-only task by
  ``check_leadership()`` once the lease this run held has ended.

Messages never contain secrets: URLs are masked before they reach a message.
"""

from __future__ import annotations


class LeaseError(Exception):
    """Base class of every error celery-leader raises."""


class ConfigurationError(LeaseError, ValueError):
    """A setting has a value that is not allowed.

    The message names the setting, the value given and the allowed values.
    """


class StoreError(LeaseError):
    """The lease store failed: unreachable, timed out, or answered nonsense.

    :attr:`kind` names the failure for metrics: ``error`` here, and
    ``timeout``, ``unreachable`` or ``auth`` in the subclasses.
    """

    kind = "error"


class StoreAuthError(StoreError):
    """The lease store rejected our credentials."""

    kind = "auth"


class StoreUnreachableError(StoreError):
    """The lease store could not be reached (connection refused or reset, no route)."""

    kind = "unreachable"


#: Every :attr:`StoreError.kind`, for metrics that start at zero.
STORE_ERROR_KINDS = ("timeout", "unreachable", "auth", "error")


class StoreCallTimeoutError(StoreError):
    """A store call did not return within its bound."""

    kind = "timeout"


class LeaseLost(LeaseError):  # noqa: N818 - the public name is fixed by the API contract
    """The lease under which this code ran has ended.

    Carries the election name and the fencing token of the term that ended.
    """

    def __init__(self, name: str, token: int | None = None) -> None:
        self.name = name
        self.token = token
        term = f" (token {token})" if token is not None else ""
        super().__init__(f"leadership of election {name!r}{term} was lost")


class StaleTokenError(LeaseError):
    """A fenced write carried a token older than one already accepted."""

    def __init__(self, resource: str, token: int) -> None:
        self.resource = resource
        self.token = token
        super().__init__(f"fenced write to {resource!r} refused: token {token} is stale")
