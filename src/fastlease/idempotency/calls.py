"""One idempotent call as a ``with`` or ``async with`` block: :class:`IdempotentCall` and
:class:`AsyncIdempotentCall`, and ``_CallSpec``, the validated options that the decorator and the
FastAPI routes share between their calls."""

from __future__ import annotations

import asyncio
import json
import logging
from types import TracebackType
from typing import TYPE_CHECKING, Any, Optional, Self, Type, Union, cast

from ..client import LeaseClient, idempotency_lock_table
from ..exceptions import LockLost, LockNotAcquired
from ..lock import DEFAULT_LEASE_DURATION, MAX_RETENTION, LeaseOptions, SyncDistributedLock, check_client, seconds_to_ms
from ..stores.base import check_table
from .exceptions import (
    NOT_SERIALIZABLE,
    IdempotencyError,
    IdempotencyInProgress,
    IdempotencyKeyMismatch,
    IdempotencyResultNotSerializable,
    IdempotencyResultTooLarge,
    IdempotentCallFailed,
    IdempotentCallNotCompleted,
)
from .records import COMPLETED, DEFAULT_TTL, FAILED, RETRY_AFTER_S, Record
from .serialization import JSON, Serializer, payload_fingerprint

if TYPE_CHECKING:
    from concurrent.futures import Future

__all__ = ["AsyncIdempotentCall", "IdempotentCall", "RetryOn"]

# The package's one logger, named for the package (docs/operations.md lists it under that name).
_log = logging.getLogger("fastlease.idempotency")

#: ``retry_on``: an exception class, or a tuple of them.
RetryOn = Union[type[BaseException], tuple[type[BaseException], ...]]


def _check_retry_on(retry_on: Any) -> tuple[type[BaseException], ...]:
    if isinstance(retry_on, type):
        retry_on = (retry_on,)
    if not isinstance(retry_on, tuple) or not all(isinstance(t, type) and issubclass(t, BaseException)
                                                  for t in retry_on):
        raise TypeError(f"retry_on must be an exception class or a tuple of them, got {retry_on!r}")
    return retry_on


_NO_PAYLOAD = object()


class _CallSpec:
    """What every call of one idempotent operation shares (validated once)."""

    __slots__ = ("client", "engine", "store", "table", "lock_table", "lease", "ttl_ms", "serializer", "retry_on")

    def __init__(self, client: LeaseClient, table: str, lock_table: Optional[str], lease_duration: float,
                 wait: float, ttl: Optional[float], serializer: Serializer, retry_on: RetryOn) -> None:
        check_client(client)
        self.client = client
        self.engine = client.engine  # its ``observer`` (fastlease.otel) is told each call's outcome
        self.store = client.store
        if not hasattr(self.store, "finish_if_owner"):
            raise TypeError(f"{type(client).__name__} has no idempotency records")
        self.table, self.lock_table, self.lease, self.ttl_ms, self.serializer, self.retry_on = _CallSpec.checked(
            client.engine_module, table, lock_table, lease_duration, wait, ttl, serializer, retry_on)

    @staticmethod
    def checked(core: Any, table: str, lock_table: Optional[str], lease_duration: float, wait: float,
                ttl: Optional[float], serializer: Serializer, retry_on: RetryOn
                ) -> tuple[str, str, LeaseOptions, Optional[int], Serializer, tuple[type[BaseException], ...]]:
        """The options of ``__init__`` but the client, checked (TypeError or ValueError) and converted.
        fastlease.celery checks them with it when a task is decorated, before any client exists."""
        table = check_table(table)
        lock_table = idempotency_lock_table(core, table, lock_table)
        # Lock timings follow the guards' rule, under this API's names; ttl is a retention (up to a year).
        lease = LeaseOptions.from_seconds(lease_duration, wait, wait_name="wait")
        ttl_ms = None if ttl is None else seconds_to_ms("ttl", ttl, 0.001, MAX_RETENTION)
        if not (callable(getattr(serializer, "dumps", None)) and callable(getattr(serializer, "loads", None))):
            raise TypeError(f"serializer needs dumps(value) -> bytes and loads(bytes) -> value, got {serializer!r}")
        return table, lock_table, lease, ttl_ms, serializer, _check_retry_on(retry_on)


class IdempotentCall:
    """One idempotent call, as a ``with`` block (the decorator is built on it)::

        with IdempotentCall(client, table="payments", key=f"payment:{key}", payload=body) as call:
            if call.replayed:
                return call.result              # the first call's result (or its failure, raised)
            receipt = charge(body)
            call.complete(receipt)              # stored only while our lease is still valid
            return receipt

    Leaving the block normally without ``complete`` stores nothing, releases the key (the next call
    runs) and raises :class:`IdempotentCallNotCompleted`; leaving it with an exception applies the
    failure policy (``retry_on``). On DynamoDB the completion can join your own
    transaction: ``call.check_in(tx)`` then ``call.complete_in(tx, result)``.

    Options: ``payload`` (bytes or JSON data) is fingerprinted, or pass your own ``fingerprint`` (a str
    of at most 256 characters), so that a key reused for another request is refused; ``lock_table``
    holds the in-flight leases (default ``<table>_locks``); ``lease_duration`` (seconds) is their
    lease; ``wait`` (seconds, 0 by default) is how long a duplicate waits for an in-flight call to end
    (then replays its result, or runs if it stored none) before raising; ``ttl`` (seconds; None keeps
    them) is how long records are kept; ``serializer`` turns results into bytes and back;
    ``retry_on`` (an exception class or a tuple of them) are the failures that store nothing, so the
    next call runs again.

    Bad options raise TypeError or ValueError. Entering raises :class:`IdempotencyInProgress` (another
    call with the key is running), :class:`IdempotencyKeyMismatch` (the key was used with another
    payload) or :class:`IdempotentCallFailed` (a replayed terminal failure); storing the result raises
    :class:`IdempotencyResultTooLarge`, or ``LockLost`` if the lease was taken over first (nothing is
    stored then, and the call may run again). A result the serializer refuses is recorded as a
    failure: ``complete`` and every duplicate raise :class:`IdempotencyResultNotSerializable`.
    """

    def __init__(
        self,
        client: LeaseClient,
        *,
        table: str,
        key: str,
        payload: Any = _NO_PAYLOAD,
        fingerprint: Optional[str] = None,
        lock_table: Optional[str] = None,
        lease_duration: float = DEFAULT_LEASE_DURATION,
        wait: float = 0.0,
        ttl: Optional[float] = DEFAULT_TTL,
        serializer: Serializer = JSON,
        retry_on: RetryOn = (Exception,),
    ) -> None:
        spec = _CallSpec(client, table, lock_table, lease_duration, wait, ttl, serializer, retry_on)
        self._init(spec, key, _fingerprint(payload, fingerprint))

    @classmethod
    def _from_spec(cls, spec: _CallSpec, key: str, fingerprint: str) -> Self:
        call = cls.__new__(cls)
        call._init(spec, key, fingerprint)
        return call

    def _init(self, spec: _CallSpec, key: str, fingerprint: str) -> None:
        self._spec = spec
        self.key = spec.client.engine_module.check_key(key)
        self.fingerprint = fingerprint
        self._lock = SyncDistributedLock.with_options(spec.client, table=spec.lock_table, key=key, options=spec.lease)
        self.replayed = False
        self.result: Any = None
        self.state = "NEW"  # NEW -> PROCESSING -> COMPLETED | FAILED | RELEASED; or REPLAYED

    def __repr__(self) -> str:
        return f"<IdempotentCall table={self._spec.table!r} key={self.key!r} state={self.state.lower()}>"

    # ---- steps (shared by the sync and async forms) --------------------------------------------
    def _now_ms(self) -> int:
        return int(self._spec.client.clock.time_ns() // 1_000_000)

    def _lookup(self) -> bool:
        """Read the record; True (and the call replayed) if there is a live one."""
        spec = self._spec
        record = spec.store.read_record(spec.table, self.key, self._timeout_s())
        if record is None or (record.expires_at_ms and record.expires_at_ms <= self._now_ms()):
            return False
        if record.fingerprint and self.fingerprint and record.fingerprint != self.fingerprint:
            if spec.engine.observer is not None:
                spec.engine.observer.idempotent_call(spec.table, "mismatch")
            raise IdempotencyKeyMismatch(
                f"idempotency key {self.key!r} was used with a different payload", key=self.key
            )
        if spec.engine.observer is not None and record.state in (COMPLETED, FAILED):
            spec.engine.observer.idempotent_call(spec.table, "hit")  # a replayed failure is a hit too
        if record.state == COMPLETED:
            self.result = spec.serializer.loads(record.result)
        elif record.state == FAILED:
            failure = json.loads(record.result.decode("utf-8"))
            self.state = "REPLAYED"
            self.replayed = True
            if failure["type"] == NOT_SERIALIZABLE:
                raise IdempotencyResultNotSerializable(
                    f"the call with idempotency key {self.key!r} failed before: {failure['message']}",
                    key=self.key, result_type=failure["result_type"], error_message=failure["message"],
                )
            raise IdempotentCallFailed(
                f"the call with idempotency key {self.key!r} failed before: {failure['type']}: {failure['message']}",
                key=self.key, error_type=failure["type"], error_message=failure["message"],
            )
        else:
            raise IdempotencyError(f"idempotency record of {self.key!r} has unknown state {record.state!r}",
                                   key=self.key)
        self.state = "REPLAYED"
        self.replayed = True
        return True

    def _in_progress(self) -> IdempotencyInProgress:
        if self._spec.engine.observer is not None:
            self._spec.engine.observer.idempotent_call(self._spec.table, "in_flight")
        return IdempotencyInProgress(
            f"a call with idempotency key {self.key!r} is in progress", key=self.key, retry_after=RETRY_AFTER_S
        )

    def _timeout_s(self) -> float:
        return self._lock.request_timeout

    def _record(self, state: str, data: bytes) -> Record:
        """The record this call stores: refused before anything is written if the store cannot hold it."""
        spec = self._spec
        limit = spec.store.max_result_bytes
        if limit is not None and len(data) > limit:
            raise IdempotencyResultTooLarge(
                f"the result of {self.key!r} is {len(data):,} bytes serialised; {type(spec.client).__name__} "
                f"records hold at most {limit:,}. Nothing was stored and the key is released",
                key=self.key,
            )
        expires = self._now_ms() + spec.ttl_ms if spec.ttl_ms is not None else 0
        owner = cast(str, self._lock.owner)  # only called while the lease is held, so it has an owner
        return Record(state, self.fingerprint, data, expires, owner)

    def _write(self, state: str, data: bytes) -> None:
        """Store the record and release the lease, in one atomic request conditioned on our lease. The
        engine sends it only while the lease is valid, retries it and reconciles an unknown outcome;
        LockLost if the lease is no longer ours (a successor may be running: nothing is stored)."""
        spec = self._spec
        record = self._record(state, data)

        def write(timeout_s: float) -> bool:
            return bool(spec.store.finish_if_owner(spec.lock_table, self.key, spec.table, record,
                                                   self._now_ms(), timeout_s))

        def landed(timeout_s: float) -> bool:
            # The completion is atomic: our record stored means our row is gone too.
            stored = spec.store.read_record(spec.table, self.key, timeout_s)
            return stored is not None and stored.owner == record.owner

        self._lock.release_by_write(write, landed)
        self.state = state

    def complete(self, result: Any) -> None:
        """Store ``result`` as this call's outcome and release the key, in one atomic request made only
        while the lease is ours. RuntimeError unless the call is in progress (once only);
        IdempotencyResultTooLarge; LockLost if the lease was lost. If the serializer refuses ``result``,
        the call is stored as FAILED instead and IdempotencyResultNotSerializable is raised: the
        handler has run, so its duplicates must not run it again."""
        if self.state != "PROCESSING":
            raise RuntimeError(f"complete() needs a call in progress, this one is {self.state.lower()}")
        try:
            data = self._spec.serializer.dumps(result)
        except Exception as refusal:  # the Serializer contract says TypeError; custom ones raise others
            raise self._store_not_serializable(result, refusal) from refusal
        self._write(COMPLETED, data)
        self.result = result

    def _store_not_serializable(self, result: Any, refusal: Exception) -> IdempotencyResultNotSerializable:
        """Record the refused result as this call's failure; return the error to raise."""
        result_type = type(result).__qualname__
        if type(result).__module__ != "builtins":
            result_type = f"{type(result).__module__}.{result_type}"
        error = IdempotencyResultNotSerializable(
            f"{type(self._spec.serializer).__name__} cannot serialise the result of idempotency key "
            f"{self.key!r}, a {result_type}: {str(refusal)[:1000]}. The call is stored as FAILED, so its duplicates "
            f"raise this error instead of running it again",
            key=self.key, result_type=result_type,
        )
        failure = {"type": NOT_SERIALIZABLE, "message": str(error), "result_type": result_type}
        self._write(FAILED, json.dumps(failure).encode("utf-8"))
        return error

    def check_in(self, transaction: Any) -> None:
        """Add this call's ownership check to your DynamoDB transaction (see ``complete_in``)."""
        self._lock.check_in(transaction)

    def complete_in(self, transaction: Any, result: Any) -> None:
        """Add the COMPLETED record to your DynamoDB transaction, so that your writes and the
        completion commit together (call ``check_in(transaction)`` too). Once the transaction has
        committed, leaving the block only releases the lease."""
        if self.state != "PROCESSING":
            raise RuntimeError(f"complete_in() needs a call in progress, this one is {self.state.lower()}")
        record = self._record(COMPLETED, self._spec.serializer.dumps(result))
        self._spec.client._record_in(transaction, self._spec.table, self.key, record)
        self._transaction = transaction
        self.result = result
        self.state = "COMPLETING"

    def _finish(self, exc: Optional[BaseException]) -> None:
        """The block is over: record the outcome per the failure policy (the lease is still held)."""
        if self.state == "COMPLETING":
            if exc is None and getattr(self._transaction, "committed", False):
                self.state = COMPLETED
            return
        if self.state != "PROCESSING":
            return
        if isinstance(exc, Exception) and not isinstance(exc, self._spec.retry_on):
            failure = {"type": f"{type(exc).__module__}.{type(exc).__qualname__}", "message": str(exc)}
            self._write(FAILED, json.dumps(failure).encode("utf-8"))

    # ---- the sync form ----------------------------------------------------------------------
    def __enter__(self) -> Self:
        if self.state != "NEW":
            raise RuntimeError("idempotent calls are single-use: create one per call")
        if self._lookup():
            return self
        try:
            self._lock.__enter__()
        except LockNotAcquired:
            if self._spec.lease.wait_ms and self._lookup():  # the first call finished while we waited
                return self
            raise self._in_progress() from None
        try:
            if self._lookup():  # completed between our read and our lease
                self._lock.__exit__(None, None, None)
                return self
        except BaseException:
            self._lock.__exit__(None, None, None)
            raise
        self.state = "PROCESSING"
        if self._spec.engine.observer is not None:
            self._spec.engine.observer.idempotent_call(self._spec.table, "miss")
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        if self.replayed:
            return
        if exc is None and self.state == "PROCESSING":
            # Storing None here would make every duplicate replay None: store nothing, free the key.
            not_completed = IdempotentCallNotCompleted(
                f"the IdempotentCall block of idempotency key {self.key!r} ended without complete(result): "
                f"nothing was stored and the key is released, so the next call runs again. Call "
                f"complete(result) before the block ends, or leave it with an exception",
                key=self.key,
            )
            self._release(not_completed)  # a failed release is attached to it as a note
            raise not_completed
        try:
            self._finish(exc)
        finally:
            self._release(exc)

    def _release(self, exc: Optional[BaseException]) -> None:
        if self.state in (COMPLETED, FAILED) and self._lock.state == "released":
            return  # the record's write released the lease too
        recorded = self.state in (COMPLETED, FAILED)
        if self.state == "PROCESSING" or self.state == "COMPLETING":
            self.state = "RELEASED"
        try:
            self._lock.__exit__(type(exc) if exc else None, exc, None)
        except LockLost:
            if not recorded:
                raise
            # The outcome is stored: whoever holds the key now reads it and replays it.
            _log.debug("lease on %r lost after its record was stored", self.key)


class AsyncIdempotentCall:
    """``async with`` form of :class:`IdempotentCall`, with the same arguments: each step runs on the
    client's worker threads (as the async lock's do); ``await call.complete(result)``. Cancelled
    while entering, the call is abandoned: a lease it may have taken meanwhile is released."""

    def __init__(self, client: LeaseClient, **options: Any) -> None:
        self._call = IdempotentCall(client, **options)

    @classmethod
    def _wrap(cls, call: IdempotentCall) -> Self:
        wrapper = cls.__new__(cls)
        wrapper._call = call
        return wrapper

    def __getattr__(self, name: str) -> Any:
        return getattr(self._call, name)

    def _client(self) -> LeaseClient:
        return self._call._spec.client

    async def __aenter__(self) -> Self:
        from .._offloop import run, shielded

        entering = run(self._client(), self._call.__enter__)
        try:
            await shielded(entering)
        except asyncio.CancelledError:
            self._call._lock.cancel()
            entering.add_done_callback(self._abandon)
            raise
        return self

    def _abandon(self, entering: Future[IdempotentCall]) -> None:
        """A cancelled entry finished anyway: release what it took, storing nothing."""
        from .._offloop import consume, run

        if entering.cancelled() or entering.exception() is not None or self._call.replayed:
            return
        cancelled = asyncio.CancelledError()
        run(self._client(), self._call.__exit__, type(cancelled), cancelled, None, short=True).add_done_callback(
            consume)

    async def __aexit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                        tb: Optional[TracebackType]) -> None:
        from .._offloop import run_to_completion

        await run_to_completion(self._client(), self._call.__exit__, exc_type, exc, tb, short=True)

    async def complete(self, result: Any) -> None:
        """Store ``result`` as this call's outcome, as :meth:`IdempotentCall.complete` does (on a worker
        thread; a cancellation does not interrupt the write)."""
        from .._offloop import run_to_completion

        await run_to_completion(self._client(), self._call.complete, result, short=True)


def _fingerprint(payload: Any, fingerprint: Optional[str]) -> str:
    if fingerprint is not None:
        if payload is not _NO_PAYLOAD:
            raise TypeError("pass payload= or fingerprint=, not both")
        if not isinstance(fingerprint, str) or len(fingerprint) > 256:
            raise TypeError(f"fingerprint must be a str of at most 256 characters, got {fingerprint!r:.80}")
        return fingerprint
    return "" if payload is _NO_PAYLOAD else payload_fingerprint(payload)
