"""Every exception fastlease raises on purpose, under one root: :class:`FastleaseError`.

Bad arguments (durations, keys, templates, table names) raise the builtin ``ValueError`` or
``TypeError`` with the offending value in the message; they are programming errors, not lease
outcomes, so they do not live under ``FastleaseError``.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not imported at run time: see _typing.py
if TYPE_CHECKING:
    from typing import Optional

__all__ = [
    "FastleaseError",
    "LockNotAcquired",
    "LockLost",
    "LockReleaseError",
    "MalformedLockRow",
    "KeyKindMismatch",
    "StoreError",
    "StoreRequestRejected",
    "StoreConfigurationError",
    "TransactionCanceled",
    "LOST_CAUSES",
]

#: The values ``LockLost.cause`` can take.
#: ``stolen``: the row changed owner or vanished under us;
#: ``expired``: local validity ran out without a failed request (a stalled process or renewal thread);
#: ``unreachable``: renewal requests kept failing until validity ran out;
#: ``cancelled``: the holder gave up the lease on purpose (for example when ``max_hold`` elapsed);
#: ``not_held``: ``raise_if_lost()`` on a guard that does not hold the lease, because it was never
#: acquired (not yet, or the acquisition failed) or was already released.
LOST_CAUSES = ("stolen", "expired", "unreachable", "cancelled", "not_held")


class FastleaseError(Exception):
    """Root of every lease outcome fastlease reports; ``.key`` names the lease key when known."""

    def __init__(self, message: str, *, key: Optional[str] = None) -> None:
        super().__init__(message)
        self.key = key


class LockNotAcquired(FastleaseError, TimeoutError):
    """The wait budget ran out (or acquisition was cancelled) before the lease was held."""


class LockLost(FastleaseError):
    """Ownership is no longer valid; ``.cause`` is one of :data:`LOST_CAUSES`."""

    def __init__(self, message: str, *, key: Optional[str] = None, cause: str = "expired") -> None:
        super().__init__(message, key=key)
        self.cause = cause


class LockReleaseError(FastleaseError):
    """The release could not be confirmed within the cleanup budget; the row may remain until taken over."""


class MalformedLockRow(FastleaseError, ValueError):
    """A stored lock row is not a valid protocol row; it is never taken over (fail closed)."""


class KeyKindMismatch(FastleaseError, ValueError):
    """The key is held under another use of it: a lock where a semaphore was asked for (or the
    reverse), or a semaphore of another limit. Never waited out or taken over: the message names both
    uses, and one of them must change its key or its limit."""


class StoreError(FastleaseError):
    """A store request failed; ``.maybe_committed`` says whether a write could have been applied."""

    def __init__(self, message: str, *, key: Optional[str] = None, maybe_committed: bool = False) -> None:
        super().__init__(message, key=key)
        self.maybe_committed = maybe_committed


class StoreRequestRejected(FastleaseError):
    """The store refused a request for a reason waiting cannot fix (missing table, access denied, ...)."""


class StoreConfigurationError(StoreRequestRejected):
    """A store client cannot be made from the settings it found (no AWS Region, no credentials, ...):
    the message names what is missing and how to set it. Raised when the client is constructed."""


class TransactionCanceled(FastleaseError):
    """A transaction was rejected; ``.failed_items`` lists (index, operation, table, key, reason code)."""

    def __init__(self, message: str, *, failed_items: list[tuple[int, str, str, object, str]]) -> None:
        super().__init__(message)
        self.failed_items = failed_items
