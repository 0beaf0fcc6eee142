"""``SyncDistributedLock``: the sync guard, and the one place where seconds become milliseconds.

The guard is a thin shell over the engine's ``Lease`` (``fastlease._engine``): the engine holds the
protocol, the wait policy and the state machine; this module validates the public arguments and
shapes the context-manager contract (single use, cleanup errors attached to the body's exception).
"""

from __future__ import annotations

import functools
import threading

from . import _impl
from ._typing import NamedTuple
from .client import LeaseClient
from .exceptions import FastleaseError, LockLost

TYPE_CHECKING = False  # typing is not imported at run time: see _typing.py
if TYPE_CHECKING:
    from types import TracebackType
    from typing import Any, Callable, Optional, Self, Type

    from ._engine import Lease  # type checkers read the engine's sources

__all__ = ["SyncDistributedLock", "LeaseView", "LeaseMetrics", "DEFAULT_LEASE_DURATION", "DEFAULT_WAIT_TIMEOUT"]

DEFAULT_LEASE_DURATION = 30.0
DEFAULT_WAIT_TIMEOUT = 35.0
MIN_LEASE_DURATION = _impl.core.MIN_LEASE_MS / 1000  # the engine's limits, in seconds
MAX_DURATION = _impl.core.MAX_DURATION_MS / 1000


#: The longest retention a duration may ask for (idempotency records' ``ttl``): a year.
MAX_RETENTION = 365 * 86_400.0


def seconds_to_ms(name: str, seconds: Any, minimum: float, maximum: float = MAX_DURATION) -> int:
    """The one rule for every duration of the public API, in seconds; ``name`` is the caller's own
    argument name, so the error names what they wrote. Not a number (a str, a bool, None): TypeError.
    Not finite, or outside ``minimum``-``maximum``: ValueError. Returns whole milliseconds."""
    kind = type(seconds)
    if kind is not float and kind is not int:
        if kind is bool or not isinstance(seconds, (int, float)):
            raise TypeError(f"{name} must be a number of seconds, got {kind.__name__}: {seconds!r:.80}")
        seconds = float(seconds)  # numpy scalars and other subclasses become plain numbers
    return _checked_ms(name, seconds, minimum, maximum)


@functools.lru_cache(maxsize=256, typed=True)
def _checked_ms(name: str, seconds: float, minimum: float, maximum: float) -> int:
    # Cached because the same few durations are converted on every guard; exceptions are not cached.
    # The bounds are finite, so this also refuses NaN (every comparison with it is false) and infinities,
    # without math.isfinite (importing math costs 0.3-0.5 ms, and it overflows on a huge int).
    if not minimum <= seconds <= maximum:
        raise ValueError(f"{name} must be finite and between {minimum:g} and {maximum:g} seconds, got {seconds!r:.80}")
    return max(int(round(seconds * 1000)), int(minimum * 1000))


class LeaseOptions(NamedTuple):
    """A lease's validated timing options, in the engine's units: made once by a guard, by the
    decorator or by ``@idempotent`` (at decoration, so bad values fail there), then used for every
    acquisition. Lock timings are finite seconds: the lease and ``max_hold`` 0.1-86,400, the wait
    0-86,400 (``docs/protocol.md``, "Limits")."""

    lease_ms: int
    wait_ms: int
    max_hold_ms: int  # 0: no limit
    on_lost: Optional[Callable[[LockLost], object]]

    @classmethod
    def from_seconds(
        cls,
        lease_duration: Any,
        wait: Any,
        max_hold: Any = None,
        on_lost: Any = None,
        *,
        wait_name: str = "wait_timeout",
    ) -> LeaseOptions:
        """Validate the public arguments (seconds) and convert them. ``wait_name`` is the name the
        caller's API gives the wait (``wait_timeout`` for guards, ``wait`` for ``@idempotent``)."""
        if on_lost is not None and not callable(on_lost):
            # The engine checks this too, per guard; the decorator needs it once, at decoration.
            raise TypeError(f"on_lost must be a callable taking a LockLost, got {type(on_lost).__name__}")
        return cls(
            seconds_to_ms("lease_duration", lease_duration, MIN_LEASE_DURATION),
            seconds_to_ms(wait_name, wait, 0.0),
            0 if max_hold is None else seconds_to_ms("max_hold", max_hold, MIN_LEASE_DURATION),
            on_lost,
        )


@functools.lru_cache(maxsize=256, typed=True)
def _options_without_callback(lease_duration: Any, wait_timeout: Any, max_hold: Any) -> LeaseOptions:
    return LeaseOptions.from_seconds(lease_duration, wait_timeout, max_hold)


def guard_options(lease_duration: Any, wait_timeout: Any, max_hold: Any, on_lost: Any) -> LeaseOptions:
    """A guard's options: the same few durations recur on every guard, so those without a callback
    are validated once and their LeaseOptions reused (it is immutable). Errors are never cached."""
    if on_lost is None:
        try:
            return _options_without_callback(lease_duration, wait_timeout, max_hold)
        except TypeError:
            pass  # an unhashable value (a list, say) or a bad type: the validator below names it
    return LeaseOptions.from_seconds(lease_duration, wait_timeout, max_hold, on_lost)


def check_cancel_on_lost(cancel_on_lost: object) -> bool:
    """Return ``cancel_on_lost`` if it is True or False, else raise TypeError (the async guard's and the
    decorator's option)."""
    if type(cancel_on_lost) is not bool:
        raise TypeError(f"cancel_on_lost must be True or False, got {cancel_on_lost!r:.80}")
    return cancel_on_lost


def check_client(client: object) -> LeaseClient:
    """Return ``client`` if it is a fastlease client (a ``LeaseClient``), else raise TypeError."""
    if not isinstance(client, LeaseClient):
        raise TypeError(f"client must be a fastlease client (MemoryClient, ...), got {type(client).__name__}")
    return client


class LeaseMetrics(NamedTuple):
    """A snapshot of one lease's requests and outcome (``lease.metrics``). ``wait_ms`` is the time spent
    acquiring, in milliseconds; ``consumed_rcu`` and ``consumed_wcu`` are DynamoDB capacity units (0 on
    the other stores); ``lost`` is whether ownership ended early."""

    write_requests: int
    read_requests: int
    renewals: int
    wait_ms: float
    conditional_failures: int
    request_failures: int
    wait_timeouts: int
    cleanup_failures: int
    lost: bool
    consumed_rcu: float
    consumed_wcu: float


def attach_cleanup_error(body_error: BaseException, cleanup_error: BaseException) -> None:
    """The body's exception wins; the cleanup failure rides along as a note on it."""
    body_error.add_note(f"fastlease: while releasing after this error: {type(cleanup_error).__name__}: {cleanup_error}")


class LeaseView:
    """What both guards share (``SyncDistributedLock`` and the async ``DistributedLock``): the lease's
    state, its local checks, ``check_in`` and ``metrics``, none of which blocks. Every member that
    reads or uses ownership raises RuntimeError in a forked child: the lease is its parent's."""

    __slots__ = ("_lease",)
    _lease: Lease  # the engine's state machine for this acquisition

    def cancel(self) -> None:
        """Give up an acquisition in progress, from any thread: its wait stops at its next step and it
        raises LockNotAcquired; a write confirmed after this is deleted, never held. No effect once the
        lease is held (release it instead)."""
        self._lease.cancel()

    @property
    def client(self) -> LeaseClient:
        """The client this lease belongs to."""
        client: LeaseClient = self._lease.client
        return client

    @property
    def key(self) -> str:
        """The resolved lease key."""
        return str(self._lease.key)

    @property
    def request_timeout(self) -> float:
        """The bound on each of this lease's requests, in seconds: min(lease/3, 5 s)."""
        return float(self._lease.request_timeout_s)

    @property
    def table(self) -> str:
        """The lock table the lease is in."""
        return str(self._lease.table)

    @property
    def lease_duration(self) -> float:
        """The lease's duration in seconds, as written to the store."""
        return float(self._lease.lease_ms / 1000)

    @property
    def state(self) -> str:
        """``new``, ``acquiring``, ``held``, ``releasing``, ``released``, ``lost`` or ``failed``."""
        return str(self._lease.state_name)

    @property
    def owner(self) -> Optional[str]:
        """This acquisition's owner id (a UUID4) once held."""
        self._lease.check_process()
        owner: Optional[str] = self._lease.owner
        return owner

    @property
    def fencing_token(self) -> Optional[int]:
        """This acquisition's fencing token once held: an int that every acquisition and takeover of
        the key increases, on stores that keep one (SQLite, PostgreSQL, Redis, memory, and DynamoDB with
        ``fencing=True``); None on DynamoDB without it.
        Pass it to whatever the lease protects and have that refuse a token lower than one it has seen."""
        self._lease.check_process()
        token: Optional[int] = self._lease.fencing_token
        return token

    @property
    def lost_cause(self) -> Optional[str]:
        """Why the lease was lost (``stolen``, ``expired``, ``unreachable``, ``cancelled``), or None."""
        cause: Optional[str] = self._lease.lost_cause
        return cause

    @property
    def lost(self) -> threading.Event:
        """An event set when the lease is lost (``lease.lost.wait(timeout)``); already set if it was."""
        event: threading.Event = self._lease.lost_event
        return event

    def is_valid(self) -> bool:
        """True while held and within local validity (90% of the lease since the last confirmed write);
        False before the acquisition and after the release."""
        return bool(self._lease.is_valid())

    def valid_until(self) -> Optional[float]:
        """When local validity ends, as a ``time.monotonic()`` reading, or None when the lease is not
        valid now (no request). ``lease.valid_until() - time.monotonic()`` is how long a side effect
        started now may take and still finish while the lease is valid; renewals move it on."""
        until_ns = self._lease.valid_until_ns()
        return until_ns / 1e9 if until_ns else None

    def remaining(self) -> float:
        """Seconds of local validity left, on the client's clock (no request): 0.0 when the lease is not
        valid now. Sync code, which cannot be interrupted safely, bounds its next step by it: start a
        step only if it fits, then check again (``raise_if_lost``); renewals move the end on."""
        until_ns = self._lease.valid_until_ns()
        if not until_ns:
            return 0.0
        now_ns: int = self._lease.client.clock.monotonic_ns()  # the client's clock, as validity's
        return max(0.0, (until_ns - now_ns) / 1e9)

    def raise_if_lost(self) -> None:
        """Raise :class:`~fastlease.exceptions.LockLost` unless ownership is still valid (no request):
        with the loss's cause, or ``not_held`` before the acquisition and after the release."""
        self._lease.raise_if_lost()

    def check_in(self, transaction: Any) -> None:
        """Add this lease's ownership check to ``transaction`` (a store transaction of the same client),
        so the transaction commits only while the lease is held. Raises LockLost if not valid now."""
        self._lease.raise_if_lost()
        self._lease.client._check_in(self._lease, transaction)

    def condition_check_item(self) -> dict[str, Any]:
        """The raw boto3 ``{"ConditionCheck": ...}`` entry for your own ``transact_write_items`` call
        (DynamoDB only). Raises LockLost if the lease is not valid now."""
        self._lease.raise_if_lost()
        item: dict[str, Any] = self._lease.client._condition_check_item(self._lease)
        return item

    @property
    def metrics(self) -> LeaseMetrics:
        """A snapshot of this lease's requests, renewals, waits and failures."""
        counters = self._lease.counters()
        return LeaseMetrics(
            counters[0], counters[1], counters[2], counters[3] / 1e6, *counters[4:]
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} table={self.table!r} key={self.key!r} state={self.state}>"


class SyncDistributedLock(LeaseView):
    """A distributed lease on one key, held for the duration of a ``with`` block.

    ``with SyncDistributedLock(client, table="locks", key="import:daily") as lease:`` acquires (waiting
    up to ``wait_timeout`` seconds, else ``LockNotAcquired``), renews in the background every
    lease/3 while the block runs, and releases on exit. Guards are single-use and not reentrant.

    ``lease_duration`` (seconds, 0.1-86,400) is the lease written to the store: a crashed holder's key
    is taken over once another client has seen it unchanged that long, and the holder counts its
    ownership as valid for 90% of it from just before each write it confirms. ``wait_timeout``
    (seconds, 0-86,400; 0 makes one attempt) bounds the wait for the key. ``max_hold`` (seconds) stops
    renewing after that long even if the block is still running: the lease then lapses (cause
    ``cancelled``) at most 90% of a lease later. ``on_lost`` is called once with the ``LockLost`` when
    ownership ends early, from the thread that found it (usually the renewal thread); its exceptions
    are logged, not raised. ``lease.lost`` is an event set at the same moment.

    Without ``with``: ``lease = guard.acquire()`` then ``guard.release()`` in a ``finally``, with the
    same outcomes. There is no ``extend()``: renewal is automatic, and ``max_hold`` bounds it.

    Raises TypeError or ValueError for bad arguments (client, table, key, durations) when constructed;
    ``LockNotAcquired`` on entry; on exit ``LockLost`` if ownership ended during the block: the row was
    no longer ours at the release (``stolen``), or validity lapsed (``expired``, ``unreachable``,
    ``cancelled``; the row is still deleted), since another owner may have run meanwhile; and
    ``LockReleaseError`` if the release stayed unconfirmed. When the block raised, its exception wins
    and a cleanup failure is attached to it as a note.
    """

    __slots__ = ()

    def __init__(
        self,
        client: LeaseClient,
        *,
        table: str,
        key: str,
        lease_duration: float = DEFAULT_LEASE_DURATION,
        wait_timeout: float = DEFAULT_WAIT_TIMEOUT,
        max_hold: Optional[float] = None,
        on_lost: Optional[Callable[[LockLost], object]] = None,
    ) -> None:
        options = guard_options(lease_duration, wait_timeout, max_hold, on_lost)
        self._lease = check_client(client).engine_module.Lease(client, table, key, *options)

    @classmethod
    def with_options(cls, client: LeaseClient, *, table: str, key: str, options: LeaseOptions) -> Self:
        """A guard from options validated once for many guards (the decorator's and idempotency's path)."""
        return cls._from_lease(client.engine_module.Lease(client, table, key, *options))

    @classmethod
    def _from_lease(cls, lease: Lease) -> Self:
        """Wrap an engine lease built from already-validated arguments (the decorator's path)."""
        guard = cls.__new__(cls)
        guard._lease = lease
        return guard

    def acquire(self) -> Self:
        """Acquire the lease, as entering the ``with`` block does, and return this guard, held. For
        code that cannot use ``with``: pair it with :meth:`release` in a ``finally``. Guards stay
        single-use. Raises LockNotAcquired (and bad-state RuntimeError) as entering does."""
        self._lease.acquire()
        return self

    def release(self) -> None:
        """Release the lease, as leaving the block without an exception does: LockLost if ownership
        ended before the release (the row was taken, or validity lapsed meanwhile), LockReleaseError
        if the release stayed unconfirmed; RuntimeError if the guard does not hold a lease to release."""
        self._lease.release()

    def __enter__(self) -> Self:
        self._lease.acquire()
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        if exc is None:
            self._lease.release()
            return
        try:
            self._lease.release()
        except (FastleaseError, RuntimeError) as cleanup_error:
            attach_cleanup_error(exc, cleanup_error)

    def release_by_write(self, write: Callable[[float], bool], landed: Callable[[float], bool]) -> None:
        """End the lease with your own atomic write, conditioned on this lease's owner, that also deletes
        the lease row (idempotency's completion does this). ``write(timeout_s)`` returns True if applied,
        False if the row was not ours; ``landed(timeout_s)`` says whether a write of unknown outcome did
        land. The engine sends it only while the lease is valid and retries it within the cleanup
        budget. LockLost if the lease is not ours (nothing may then be written)."""
        self._lease.release_by_write(write, landed)
