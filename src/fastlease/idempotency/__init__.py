"""Idempotency keys on the lease engine: a call runs once per key, and its duplicates get its result.

A call with key K goes through three states:

* **PROCESSING** while it runs. That is a real lease on K in the *lock table*: claimed atomically,
  renewed in the background while the handler runs, and taken over after one lease if the handler's
  process dies, exactly like a lock. Nothing else is written while a call is in flight.
* **COMPLETED**: the serialised result, written to the *record table* (never the lock table) only
  while the lease is still ours, atomically with that check (a DynamoDB transaction, one SQLite
  ``BEGIN IMMEDIATE``, one Redis script, one critical section in memory). A call whose lease was
  taken over can never overwrite its successor's record.
* **FAILED**: a terminal failure (an exception outside ``retry_on``), stored the same way and replayed
  as :class:`IdempotentCallFailed`. Exceptions in ``retry_on`` (by default every ``Exception``) store
  nothing: the key is released and the next call runs again. A result the serializer refuses is a
  terminal failure too (the handler has run): the call and its duplicates raise
  :class:`IdempotencyResultNotSerializable`, a subclass of :class:`IdempotentCallFailed`.

A ``with`` block left normally without ``complete(result)`` stores nothing, releases the key and
raises :class:`IdempotentCallNotCompleted` (``@idempotent`` completes with the function's result).

A duplicate reads the record first (one read: that is the whole cost of a replay). If there is none
and the lease is held, it raises :class:`IdempotencyInProgress` with a ``retry_after`` estimate, or
with ``wait=`` waits for the lease and then replays the result. A payload whose fingerprint differs
from the completed call's raises :class:`IdempotencyKeyMismatch`.

Records expire ``ttl`` seconds after completion (the DynamoDB TTL attribute ``expires_at``, Redis PX,
an expiry column on SQLite and in memory; an expired record is ignored even before the store drops it).

The package is split by job, each module importing only those listed before it: ``exceptions``
(the outcomes above), ``records`` (the states, ``DEFAULT_TTL``, ``RETRY_AFTER_S``),
``serialization`` (:class:`Serializer`, :class:`JSONSerializer`, :func:`payload_fingerprint`),
``calls`` (:class:`IdempotentCall` and :class:`AsyncIdempotentCall`), ``decorator``
(:func:`idempotent`), ``http`` (what the HTTP integrations share: the ``Idempotency-Key`` syntax,
fingerprints, problem answers, stored responses; no web framework imported), and ``fastapi``
(``idempotent_route``, imported only on request: it needs ``fastlease[fastapi]``). The Django views
are ``fastlease.django.idempotency``, on the same ``http`` module.
"""

from __future__ import annotations

from .calls import AsyncIdempotentCall, IdempotentCall
from .calls import RetryOn as RetryOn
from .decorator import idempotent
from .exceptions import (
    IdempotencyError,
    IdempotencyInProgress,
    IdempotencyKeyMismatch,
    IdempotencyResultNotSerializable,
    IdempotencyResultTooLarge,
    IdempotentCallFailed,
    IdempotentCallNotCompleted,
)
from .records import COMPLETED as COMPLETED
from .records import DEFAULT_TTL as DEFAULT_TTL
from .records import FAILED as FAILED
from .records import RETRY_AFTER_S as RETRY_AFTER_S
from .records import Record as Record
from .serialization import JSON as JSON
from .serialization import JSONSerializer, Serializer, payload_fingerprint

__all__ = [
    "AsyncIdempotentCall",
    "IdempotencyError",
    "IdempotencyInProgress",
    "IdempotencyKeyMismatch",
    "IdempotencyResultNotSerializable",
    "IdempotencyResultTooLarge",
    "IdempotentCall",
    "IdempotentCallFailed",
    "IdempotentCallNotCompleted",
    "JSONSerializer",
    "Serializer",
    "idempotent",
    "payload_fingerprint",
]
# The names imported ``as`` themselves are not in __all__ but stay importable from here, as they were
# when this package was one module (the explicit form tells type checkers they are re-exported).
