"""The idempotency outcomes: what entering, completing or replaying a call raises (all are
:class:`~fastlease.FastleaseError`, with ``.key``)."""

from __future__ import annotations

from typing import Optional

from ..exceptions import FastleaseError

__all__ = [
    "IdempotencyError",
    "IdempotencyInProgress",
    "IdempotencyKeyMismatch",
    "IdempotencyResultNotSerializable",
    "IdempotencyResultTooLarge",
    "IdempotentCallFailed",
    "IdempotentCallNotCompleted",
]


class IdempotencyError(FastleaseError):
    """Root of the idempotency outcomes."""


class IdempotencyInProgress(IdempotencyError):
    """Another call with this key is running. ``retry_after`` (seconds) is when to try again."""

    def __init__(self, message: str, *, key: str, retry_after: float) -> None:
        super().__init__(message, key=key)
        self.retry_after = retry_after


class IdempotencyKeyMismatch(IdempotencyError):
    """The key was used before with a different payload (fingerprints differ)."""


class IdempotencyResultTooLarge(IdempotencyError, ValueError):
    """The serialised result exceeds what the store can keep in one record. Nothing was stored; the
    key is released, so a retry runs the call again."""


class IdempotentCallFailed(IdempotencyError):
    """Replay of a call that failed terminally: ``error_type`` and ``error_message`` of its exception."""

    def __init__(self, message: str, *, key: str, error_type: str, error_message: str) -> None:
        super().__init__(message, key=key)
        self.error_type = error_type
        self.error_message = error_message


#: ``error_type`` of the FAILED record that an unserialisable result leaves (the class below).
NOT_SERIALIZABLE = f"{__name__}.IdempotencyResultNotSerializable"


class IdempotencyResultNotSerializable(IdempotentCallFailed, TypeError):
    """The serializer refused the call's result (``result_type`` names its type). The call is recorded
    as FAILED with this reason, so it and every duplicate within the ttl raise this instead of running
    the handler again."""

    def __init__(self, message: str, *, key: str, result_type: str, error_message: Optional[str] = None) -> None:
        super().__init__(message, key=key, error_type=NOT_SERIALIZABLE,
                         error_message=message if error_message is None else error_message)
        self.result_type = result_type


class IdempotentCallNotCompleted(IdempotencyError, RuntimeError):
    """An ``IdempotentCall`` block was left normally without ``complete(result)``. Nothing was stored
    and the key is released, so the next call runs again."""
