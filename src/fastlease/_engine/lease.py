# cython: language_level=3, embedsignature=True, freethreading_compatible=True, annotation_typing=False
"""The lease engine: the protocol, written once.

This one source is both engines. Imported as it is, it is the pure-Python engine; ``cythonize``
compiles it (with the augmenting declarations in ``_engine.pxd``: ``cdef class`` layouts, typed
attributes and locals) into the compiled one. ``_impl.py`` picks which one a process uses.

Everything that is protocol lives here: clocks and validity, key templates, the observation cache,
the lease state machine (acquire, take over, renew, reconcile, release), the renewal scheduler and
the per-client engine state. Stores below this layer are single atomic operations; the public API
above it converts seconds to milliseconds and shapes the guards. The rules are stated in
``docs/protocol.md``; the map of the layers is ``docs/architecture.md``.

Units: integers carry their unit in their name (``lease_ms``, ``deadline_ns``); every clock reading is
an ``int`` of nanoseconds.
"""

from __future__ import annotations

import heapq
import os
import random
import threading
import time

from ._logging import get_logger
from ._typing import Protocol, cast
from .exceptions import LockLost, LockNotAcquired, LockReleaseError, MalformedLockRow, StoreError
from .stores.base import check_table

TYPE_CHECKING = False  # typing is not imported at run time: see _typing.py
if TYPE_CHECKING:  # annotations only
    from concurrent.futures import ThreadPoolExecutor
    from typing import Any, Callable, Optional

#: "c" when this module runs compiled (its file is the extension module), "py" when interpreted.
IMPLEMENTATION = "py" if __file__.endswith((".py", ".pyc")) else "c"

if IMPLEMENTATION == "c":
    #: The CRC-32 of the _engine.py this was compiled from (a C constant from setup.py, declared in
    #: _engine.pxd): fastlease._impl compares it with the file beside it. Interpreted: "".
    BUILT_FROM = FASTLEASE_SOURCE_CRC.decode("ascii")  # type: ignore[name-defined]  # noqa: F821
    # The compiled engine takes its tokens (pooled urandom, formatted in C) and its critical sections'
    # lock from the native core.
    from ._core import Mutex as _new_mutex
    from ._core import new_token
else:
    BUILT_FROM = ""
    from ._core_fallback import Mutex as _new_mutex  # type: ignore[assignment]  # threading.Lock: same methods
    from ._core_fallback import new_token

__all__ = ["check_table", "new_token"]  # re-exported for the layers above; the rest is by name

_log = get_logger("fastlease.engine")

# ---------------------------------------------------------------------------------------------
# Limits and timing rules (docs/protocol.md, "Limits" and "Timeouts and budgets"). All derived
# timings are here.
# ---------------------------------------------------------------------------------------------
PROTOCOL_V1 = 1
MIN_LEASE_MS = 100
MAX_DURATION_MS = 86_400_000
MAX_KEY_BYTES = 2048
OBSERVATION_CACHE_SIZE = 4096
#: Contended waiters poll the store about this often (jittered 50%..150%), whatever their own lease:
#: it bounds cross-process handoff, while same-process waiters are woken at once on release.
POLL_INTERVAL_MS = 125
#: After releasing a key that others are waiting for, a client gives them the next turn if it comes
#: back for the same key within this window (see ReleaseSignals).
YIELD_WINDOW_MS = 2 * POLL_INTERVAL_MS
#: A contender that has waited this long marks the holder's row ``waiting`` (once per hold): the
#: holder, wherever it runs, then yields the next turn on release.
WAITING_MARK_AFTER_MS = 2 * POLL_INTERVAL_MS
#: First back-off after a transient store error while waiting; doubles up to POLL_INTERVAL_MS * 5.
ERROR_BACKOFF_MS = 25
#: A renewal thread with nothing to renew for this long exits; the next acquisition starts another.
SCHEDULER_IDLE_EXIT_MS = 30_000
#: Renewal requests run on up to this many worker threads per client, so one slow request (up to its
#: timeout) delays no other lease's renewal; the scheduler thread itself only waits and dispatches.
#: With the scheduler thread and the native pulse thread (``_renewal_link``), the renewal path of a
#: client runs four threads at most, however many leases it holds.
RENEWAL_WORKERS = 2
#: Leases at least this long are renewed by the client's renewal process (``_renewal_link``), which
#: keeps renewing while this process's GIL is held; its first renewal, lease/3 after the acquisition,
#: comes well after the registration reaches it (within one pulse, 100 ms). Shorter leases renew here.
DELEGATE_MIN_LEASE_MS = 1000

_NS_PER_MS = 1_000_000


def validity_ns(lease_ms: int) -> int:
    """Ownership stays valid for 90% of the lease, counted from the stamp taken before the write."""
    return lease_ms * 900_000


def renew_interval_ns(lease_ms: int) -> int:
    """Renewal runs every lease/3."""
    return lease_ms * _NS_PER_MS // 3


def renew_retry_ns(lease_ms: int) -> int:
    """After an unconfirmed renewal the retry comes after min(lease/12, 1 s)."""
    return min(lease_ms * _NS_PER_MS // 12, 1_000_000_000)


def request_timeout_ns(lease_ms: int) -> int:
    """Each request is bounded by min(lease/3, 5 s)."""
    return min(lease_ms * _NS_PER_MS // 3, 5_000_000_000)


def cleanup_budget_ns(lease_ms: int) -> int:
    """Release, reconciliation included, has a total budget of min(0.6 * lease, 10 s)."""
    return min(lease_ms * 600_000, 10_000_000_000)


def seconds_text(duration_ns: int) -> str:
    """A duration for messages, in seconds ("0.5s", "35s"). Declared nowhere in _engine.pxd, so its
    argument stays a Python int when compiled: the division is never a C integer division."""
    return f"{duration_ns / 1e9:g}s"


def next_backoff_ns(backoff_ns: int) -> int:
    """After another transient store error the back-off doubles, up to five poll intervals."""
    return min(backoff_ns * 2, POLL_INTERVAL_MS * 5 * _NS_PER_MS)


# ---------------------------------------------------------------------------------------------
# Clocks
# ---------------------------------------------------------------------------------------------
class Clock(Protocol):
    """What a client's ``clock`` argument provides (:class:`fastlease.testing.FakeClock` is one). Every
    reading is an int of nanoseconds; the default is the process's own clocks."""

    def monotonic_ns(self) -> int:
        """A monotonic reading (ns): validity, waits and observations of other holders count on it."""

    def time_ns(self) -> int:
        """The wall clock (ns since the epoch): a jump backwards ends the validity of held leases."""

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for ``event``; return whether it is set."""

    def attach_scheduler(self, scheduler: Any) -> bool:
        """Called once by each client's renewal scheduler: True if this clock runs the scheduler's due
        renewals itself (``scheduler.run_due()`` as time moves), False to have it start a thread."""


class SystemClock:
    """The process's monotonic and wall clocks; waits are real waits on an event."""

    monotonic_ns = staticmethod(time.monotonic_ns)
    time_ns = staticmethod(time.time_ns)

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for ``event``; return whether it is set."""
        return event.wait(timeout_s)

    def attach_scheduler(self, scheduler: RenewalScheduler) -> bool:
        """Return True if this clock drives the scheduler itself (fake clocks do); False starts a thread."""
        return False


SYSTEM_CLOCK = SystemClock()


# ---------------------------------------------------------------------------------------------
# Observer: told of each lease's events (fastlease.otel provides one)
# ---------------------------------------------------------------------------------------------
class Observer(Protocol):
    """What a client's ``engine.observer`` is told, if it is set (``fastlease.otel.instrument`` sets
    one). ``None``, the default, costs one attribute check per event. Each hook runs in the thread of
    its event, outside the lease's mutex, and must not raise. A lease takes the observer when it is
    made, so setting or clearing it changes leases made afterwards."""

    def acquired(self, lease: Lease, wait_ns: int) -> Any:
        """The caller's thread: the acquisition is confirmed after ``wait_ns`` on the client's clock.
        Returns this hold's record (not None), handed to the hooks below until the hold ends."""

    def acquire_failed(self, lease: Lease, wait_ns: int, error: Optional[BaseException]) -> None:
        """The caller's thread: the acquisition was abandoned after ``wait_ns``; ``error`` is None when
        the wait budget ran out or it was cancelled (it raises LockNotAcquired), else what ended it."""

    def renewed(self, lease: Lease, hold: Any, renewals: int) -> None:
        """``renewals`` more confirmed renewals of the hold: one at a time from this process's renewal
        thread, or as many as a report of the renewal process applies (in the thread that applied it).
        Together they are the hold's ``metrics.renewals``."""

    def lost(self, lease: Lease, hold: Any, cause: str) -> None:
        """The lease was lost (``stolen``, ``expired``, ``unreachable``, ``cancelled``), once per
        lease, in the thread that found the loss (usually the renewal thread)."""

    def released(self, lease: Lease, hold: Any, error: Optional[BaseException]) -> None:
        """The hold is over (the caller's thread): released, with ``error`` None, or the release
        raised ``error`` (LockLost with the cause, LockReleaseError). Once per hold."""

    def idempotent_call(self, table: str, outcome: str) -> None:
        """The idempotency layer: a call on record table ``table`` was entered as ``hit`` (replays a
        stored outcome) or ``miss`` (runs), or refused as ``in_flight`` or ``mismatch``."""


# ---------------------------------------------------------------------------------------------
# Fork detection: clients and guards record the PID they were made in
# ---------------------------------------------------------------------------------------------
_process_id = os.getpid()


def _note_fork() -> None:
    global _process_id
    _process_id = os.getpid()


os.register_at_fork(after_in_child=_note_fork)


def current_pid() -> int:
    """This process's id, kept current across fork without a system call per use."""
    return _process_id


def check_not_forked(pid: int) -> None:
    """Raise RuntimeError if an object made in process ``pid`` is used in a forked child."""
    if pid != _process_id:
        raise RuntimeError(
            "fastlease client or guard used in a forked child process: its renewal thread and "
            "observations belong to the parent. Create the client in the worker process "
            "(after fork, or use the multiprocessing 'spawn' start method)."
        )


# ---------------------------------------------------------------------------------------------
# Input checks
# ---------------------------------------------------------------------------------------------
def check_key(key: object) -> str:
    """Return ``key`` if it is a str of 1-2,048 UTF-8 bytes, else raise TypeError/ValueError."""
    if type(key) is not str:  # str subclasses too: their str() may not be the value stored
        raise TypeError(f"lock key must be a str, got {type(key).__name__}: {key!r:.80}")
    if key.isascii():
        size = len(key)
    else:
        try:
            size = len(key.encode("utf-8"))
        except UnicodeEncodeError:
            raise ValueError(f"lock key is not encodable as UTF-8 (lone surrogate?): {key!r:.80}") from None
    if not 1 <= size <= MAX_KEY_BYTES:
        raise ValueError(f"lock key must be 1-{MAX_KEY_BYTES} UTF-8 bytes, got {size}: {key!r:.80}")
    return key


def describe_store_error(error: BaseException) -> str:
    """``StoreError`` text for messages, led by the type of the failure under it when there is one
    (``ConnectionRefusedError: ...``), which is what a reader looks for first."""
    cause = error.__cause__ if error.__cause__ is not None else error
    return f"{type(cause).__name__}: {error}"


def check_row(row: Any, key: str) -> None:
    """Strict protocol v1 parsing of a row read from a store: anything unexpected fails closed."""
    owner, version, lease_ms, protocol, waiting, fence = row
    if type(waiting) is not bool:
        raise MalformedLockRow(f"lock row for {key!r} has a non-boolean waiting hint {waiting!r}", key=key)
    if fence is not None and (type(fence) is not int or fence < 1):
        raise MalformedLockRow(f"lock row for {key!r} has fencing token {fence!r}, not a positive int", key=key)
    if protocol != PROTOCOL_V1 or type(protocol) is not int:
        raise MalformedLockRow(f"lock row for {key!r} has unsupported protocol {protocol!r}", key=key)
    if type(owner) is not str or not owner or type(version) is not str or not version:
        raise MalformedLockRow(f"lock row for {key!r} has an invalid owner or version", key=key)
    if type(lease_ms) is not int or not MIN_LEASE_MS <= lease_ms <= MAX_DURATION_MS:
        raise MalformedLockRow(f"lock row for {key!r} has lease_ms {lease_ms!r} outside 100-86400000", key=key)


# ---------------------------------------------------------------------------------------------
# Key templates
# ---------------------------------------------------------------------------------------------
class KeyTemplate:
    """A lock key template, parsed once: literal text, ``{name}`` placeholders, ``{{``/``}}`` braces.

    One placeholder inserts its value as is; two or more prefix each value with its UTF-8 byte length
    and a colon, so ``"{tenant}:{id}"`` with ("acme", "123") is ``"4:acme:3:123"`` and no pair of values
    can collide by containing the separator.
    """

    def __init__(self, template: object) -> None:
        if type(template) is not str:
            raise TypeError(f"key template must be a str, got {type(template).__name__}: {template!r:.80}")
        literals: list[str] = []
        names: list[str] = []
        text: list[str] = []
        i, n = 0, len(template)
        while i < n:
            ch = template[i]
            if ch == "{":
                if template.startswith("{{", i):
                    text.append("{")
                    i += 2
                    continue
                end = template.find("}", i + 1)
                name = template[i + 1 : end] if end >= 0 else ""
                if end < 0 or not name.isidentifier():
                    raise ValueError(
                        f"key template {template!r:.200}: placeholder at offset {i} must be {{argument_name}}"
                    )
                literals.append("".join(text))
                text = []
                names.append(name)
                i = end + 1
            elif ch == "}":
                if not template.startswith("}}", i):
                    raise ValueError(f"key template {template!r:.200}: single '}}' at offset {i}; write '}}}}'")
                text.append("}")
                i += 2
            else:
                text.append(ch)
                i += 1
        literals.append("".join(text))
        self.template = template
        self.names = tuple(names)
        self._literals = tuple(literals)
        if not names:
            check_key(literals[0])

    def resolve(self, values: tuple[Any, ...]) -> str:
        """Resolve with one str value per placeholder, in order; TypeError/ValueError on bad values."""
        names = self.names
        literals = self._literals
        if len(values) != len(names):
            raise TypeError(f"key template {self.template!r:.200} takes {len(names)} values, got {len(values)}")
        if not names:
            return literals[0]
        for name, value in zip(names, values):
            if type(value) is not str:
                raise TypeError(
                    f"lock key argument {name!r} must be a str, got {type(value).__name__}: {value!r:.80}"
                )
        if len(names) == 1:
            key = literals[0] + values[0] + literals[1]
        else:
            parts = [literals[0]]
            for name, value, literal in zip(names, values, literals[1:]):
                try:
                    size = len(value.encode("utf-8"))
                except UnicodeEncodeError:
                    raise ValueError(
                        f"lock key argument {name!r} is not encodable as UTF-8: {value!r:.80}"
                    ) from None
                parts.append(f"{size}:{value}{literal}")
            key = "".join(parts)
        return check_key(key)


class CallKey:
    """A template bound to a function signature: resolves the key from one call's arguments.

    ``binder`` takes the call's arguments as the function does and returns the placeholders'
    values in order (the decorator builds it from the signature, once), so the key is resolved from
    Python's own binding of the call, and a call the function would reject fails here, before any
    request.
    """

    def __init__(self, template: KeyTemplate, binder: Callable[..., tuple[Any, ...]]) -> None:
        if not callable(binder):
            raise TypeError(f"binder must be callable, got {type(binder).__name__}")
        self.template = template
        self._binder = binder

    def resolve(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        return self.template.resolve(self._binder(*args, **kwargs))


# ---------------------------------------------------------------------------------------------
# Observation cache
# ---------------------------------------------------------------------------------------------
class ObservationCache:
    """When this client first saw each contended row unchanged, on its own monotonic clock.

    A takeover is allowed only after the same (owner, version, lease_ms) has been seen for the stored
    lease_ms: clocks of different machines are never compared. Bounded LRU; evicting an entry only
    restarts that row's observation, so it can delay recovery but never allow an early takeover.
    """

    def __init__(self, capacity: int = OBSERVATION_CACHE_SIZE) -> None:
        if type(capacity) is not int or capacity < 1:
            raise ValueError(f"observation cache capacity must be a positive int, got {capacity!r}")
        self.capacity = capacity
        # cache_key -> (owner, version, lease_ms, first seen ns); insertion order is the LRU order.
        self._entries: dict[tuple[str, str], tuple[str, str, int, int]] = {}
        self._mutex = _new_mutex()

    def observe(self, cache_key: tuple[str, str], owner: str, version: str, lease_ms: int, now_ns: int) -> int:
        """Record a sighting; return how long (ns) this exact row has been seen unchanged."""
        with self._mutex:
            entries = self._entries
            entry = entries.pop(cache_key, None)
            if entry is None or entry[0] != owner or entry[1] != version or entry[2] != lease_ms:
                entry = (owner, version, lease_ms, now_ns)
                if len(entries) >= self.capacity:
                    del entries[next(iter(entries))]
            entries[cache_key] = entry  # re-inserted last: the dict's order is the LRU order
            return now_ns - entry[3]

    def forget(self, cache_key: tuple[str, str]) -> None:
        with self._mutex:
            self._entries.pop(cache_key, None)

    def __len__(self) -> int:
        return len(self._entries)


# ---------------------------------------------------------------------------------------------
# Same-process wake-up on release
# ---------------------------------------------------------------------------------------------
class ReleaseSignals:
    """Handoff between this client's waiters and others: wake-ups on release, and turn-taking.

    * This client's waiters on a key queue up in arrival order (each with its own ticket, an Event).
      When this client releases the key, only the oldest waiter is woken, at once; the others sleep to
      their next poll. That makes handoff inside a process first-come first-served and keeps a herd
      of waiters from all reading the row on every release. A waiter that gives up passes a wake-up it
      did not use on to the next. A missed wake-up only leaves a waiter to its next poll; it can never
      admit one, since the waiter still has to win the conditional write.
    * Turn-taking: a releaser that loops straight back would always beat waiters asleep between
      polls. So a new acquisition within ``YIELD_WINDOW_MS`` of this client's release first yields
      (waits a little longer than the longest poll interval, queued behind this client's waiters)
      when there is present evidence that others want the key: this client has other threads queued
      for it, or the released row carried a ``waiting`` mark, or while waiting for that turn this
      client saw a mark it had not made. A contender (in any process) marks the holder's row once it
      has waited ``WAITING_MARK_AFTER_MS``. Only present evidence counts: remembering past
      contention would let every former holder yield at once and leave the key idle. (Measured, a
      winner that yields merely because its own wait was long does worse: the key idles while
      former holders sit out their courtesy waits, and whoever returns first takes a long run.)
    """

    def __init__(self) -> None:
        # cache_key -> [ticket, ...], oldest first; removed when empty
        self._queues: dict[tuple[str, str], list[threading.Event]] = {}
        self._mutex = _new_mutex()
        # cache_key -> this client's last release of a key that others wait for. Bounded; empty on
        # the uncontended path.
        self._contended: dict[tuple[str, str], int] = {}

    def wait(self, clock: Clock, cache_key: tuple[str, str], ticket: threading.Event, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` (or until woken), queued behind earlier waiters on the key."""
        with self._mutex:
            queue = self._queues.get(cache_key)
            if queue is None:
                queue = self._queues[cache_key] = []
            if ticket not in queue:
                queue.append(ticket)
        clock.wait(ticket, timeout_s)

    def leave(self, cache_key: tuple[str, str], ticket: threading.Event, acquired: bool) -> None:
        """The waiter's acquisition is over; without the lease, it hands an unused wake-up on."""
        with self._mutex:
            queue = self._queues.get(cache_key)
            if queue is None or ticket not in queue:
                return
            was_head = queue[0] is ticket
            queue.remove(ticket)
            if not queue:
                del self._queues[cache_key]
            elif was_head and ticket.is_set() and not acquired:
                queue[0].set()

    def notify(self, cache_key: tuple[str, str]) -> None:
        """This client released the key: wake its oldest waiter."""
        if self._queues:  # the uncontended release skips the mutex
            with self._mutex:
                queue = self._queues.get(cache_key)
                head = queue[0] if queue else None
            if head is not None:
                head.set()

    def released(self, cache_key: tuple[str, str], others_waiting: bool, now_ns: int) -> None:
        """This client released ``cache_key``; ``others_waiting`` if the row carried a waiting mark."""
        if others_waiting or self._contended:
            with self._mutex:
                self._contended.pop(cache_key, None)
                if others_waiting:
                    if len(self._contended) >= OBSERVATION_CACHE_SIZE:
                        del self._contended[next(iter(self._contended))]
                    self._contended[cache_key] = now_ns
        self.notify(cache_key)

    def should_yield(self, cache_key: tuple[str, str], now_ns: int) -> bool:
        """Should a new acquisition of ``cache_key`` let other contenders go first?"""
        if self._queues and cache_key in self._queues:
            return True
        released_ns = self._contended.get(cache_key)
        return released_ns is not None and now_ns - released_ns < YIELD_WINDOW_MS * _NS_PER_MS

    def __len__(self) -> int:
        """Keys with waiters queued."""
        return len(self._queues)


# ---------------------------------------------------------------------------------------------
# Lease states
# ---------------------------------------------------------------------------------------------
NEW = 0
ACQUIRING = 1
HELD = 2
RELEASING = 3
RELEASED = 4
LOST = 5  # ownership ended without a release: stolen, expired or unreachable
FAILED = 6  # acquisition gave up: budget spent, malformed row or store error
STATE_NAMES = ("new", "acquiring", "held", "releasing", "released", "lost", "failed")


class Lease:
    """One acquisition of one key: the protocol state machine. Single use.

    Thread ownership of fields: the caller's thread drives enter and exit; the client's renewal
    thread runs ``renew_step``. Fields both of them write are guarded by ``_mutex``; each thread has
    its own request counters so neither overwrites the other's increments.
    """

    def __init__(
        self,
        client: Any,
        table: str,
        key: str,
        lease_ms: int,
        wait_ms: int,
        max_hold_ms: int = 0,
        on_lost: Optional[Callable[[LockLost], object]] = None,
    ) -> None:
        if type(lease_ms) is not int or not MIN_LEASE_MS <= lease_ms <= MAX_DURATION_MS:
            raise ValueError(f"lease_ms must be an int in {MIN_LEASE_MS}-{MAX_DURATION_MS}, got {lease_ms!r}")
        if type(wait_ms) is not int or not 0 <= wait_ms <= MAX_DURATION_MS:
            raise ValueError(f"wait_ms must be an int in 0-{MAX_DURATION_MS}, got {wait_ms!r}")
        if type(max_hold_ms) is not int or not (max_hold_ms == 0 or MIN_LEASE_MS <= max_hold_ms <= MAX_DURATION_MS):
            raise ValueError(
                f"max_hold_ms must be 0 or an int in {MIN_LEASE_MS}-{MAX_DURATION_MS}, got {max_hold_ms!r}"
            )
        if on_lost is not None and not callable(on_lost):
            raise TypeError(f"on_lost must be a callable taking a LockLost, or None, got {type(on_lost).__name__}")
        self._bind(client.engine)
        self.table = check_table(table)
        self.key = check_key(key)
        self.lease_ms = lease_ms
        self.wait_ms = wait_ms
        self.max_hold_ms = max_hold_ms
        self._on_lost = on_lost  # taken (set to None) by the one call that announces the loss
        self._lost_event: Optional[threading.Event] = None  # made on first use; installed under _mutex
        self._hold_until_ns = 0  # written by the caller before renewal is scheduled; 0: no max_hold
        self._renewal_stopped = False  # max_hold reached; renewal thread only
        self._client = client  # handed back by the ``client`` property; the engine reads only ``engine``
        self._cache_key = (table, key)
        self._mutex = _new_mutex()
        # Written by the caller's thread, and by the renewal thread only to move HELD -> LOST.
        self.state = NEW
        self.lost_cause: Optional[str] = None
        # Written once by the caller's thread before renewal is scheduled; read-only afterwards.
        self.owner: Optional[str] = None
        # Written under _mutex by whichever thread confirms a write (acquire: caller; renew: renewal).
        self.version: Optional[str] = None
        # The store's fencing token of this acquisition (strictly increasing per key), where the store
        # keeps one; None otherwise. Written with owner.
        self.fencing_token: Optional[int] = None
        self._valid_until_mono_ns = 0
        self._wall_stamp_ns = 0
        self._valid_until_wall_ns = 0
        # An acquisition write whose outcome is unknown: (owner, version, mono_ns, wall_ns). Caller only.
        self._pending: Optional[tuple[str, str, int, int]] = None
        # A renewal write whose outcome is unknown: (version, mono_ns, wall_ns). Renewal thread only.
        self._renew_pending: Optional[tuple[str, int, int]] = None
        self._renew_errors = 0  # consecutive failed renewal requests; renewal thread only
        self._renew_at_ns = 0  # due time of the live heap entry; 0 when unscheduled (under scheduler lock)
        self._renewing = False  # a worker runs its renewal step now (under scheduler lock)
        # What this lease counted (renew writes, reads, conditional and request failures, renewals) before a
        # hand-back to a renewal process, whose reports count from 0: written under _mutex.
        self._delegation_base = (0, 0, 0, 0, 0)
        # The renewal process renews this lease: its registration id with the client's link, else 0.
        # Set by the caller's thread before renewal is scheduled; cleared once, under _mutex.
        self._link_id = 0
        self._hint_ns = 0  # how long the last failed attempt suggests waiting; caller only
        self._row_seen = False  # the last attempt found the key held; caller only
        # How long this client has seen that row unchanged, and the lease it stores (what a takeover
        # needs): for the message of a wait that ends before the takeover could come. Caller only.
        self._seen_unchanged_ns = 0
        self._seen_lease_ms = 0
        self._first_seen: Optional[tuple[str, str]] = None  # (owner, version) at this wait's first sighting
        self._last_seen: Optional[tuple[str, str]] = None  # and at its last; caller only
        self._acquire_start_ns = 0  # when acquire() began; caller only
        # Others wait for the key: our deleted row carried a waiting mark, or while waiting for this
        # turn we saw a mark we had not made. Caller only.
        self._others_waiting = False
        self._marked_owner: Optional[str] = None  # the holder whose row we marked; caller only
        # Set by cancel() from any thread (an async task was cancelled); read by the caller's thread.
        self._cancelled = False
        self._ticket: Optional[threading.Event] = None  # our place in the client's wait queue; caller
        self._watch: Any = None  # our watch on the store's release feed while waiting; caller only
        # Caller-thread counters.
        self._writes = 0
        self._reads = 0
        self._conditional_failures = 0
        self._request_failures = 0
        self._wait_timeouts = 0
        self._cleanup_failures = 0
        self._wait_ns = 0
        # Renewal-thread counters.
        self._renew_writes = 0
        self._renew_reads = 0
        self._renew_conditional_failures = 0
        self._renew_request_failures = 0
        self._renewals = 0
        # Capacity reported by stores from either thread; under _mutex.
        self._rcu = 0.0
        self._wcu = 0.0
        # The observer's record of this hold (what Observer.acquired returned), or None: set by the
        # caller's thread at the acquisition, taken (back to None) by the end of the hold.
        self._observed: object = None

    def _bind(self, engine: Engine) -> None:
        """Take the client's engine state: the only thing of the client that a lease reads."""
        check_not_forked(engine.pid)
        self._pid = engine.pid
        self._store = engine.store
        self._clock: Clock = engine.clock
        # The clock's readings as callables, looked up once: a lease reads them a dozen times a hold.
        self._mono: Callable[[], int] = engine.clock.monotonic_ns
        self._wall: Callable[[], int] = engine.clock.time_ns
        self._observations = engine.observations
        self._scheduler = engine.scheduler
        self._signals = engine.signals
        # The store's feed of releases made anywhere (Redis pub/sub), or None; our watch while waiting.
        self._feed = engine.release_feed
        # The client's renewal process (``_renewal_link.RenewalLink``), or None: renewals stay here.
        self._link = engine.link
        # Told of every confirmed renewal (the renewal process reports them to the holder), or None.
        self._listener = engine.renewal_listener
        # Told of this lease's events (an Observer), or None: each event checks it, or _observed, once.
        self._observer = engine.observer

    # ---- small helpers ---------------------------------------------------------------------
    def add_capacity(self, rcu: float, wcu: float) -> None:
        """Stores report consumed capacity of successful responses here."""
        with self._mutex:
            self._rcu += rcu
            self._wcu += wcu

    def _timeout_s(self, deadline_ns: int, now_ns: int) -> float:
        return max(min(request_timeout_ns(self.lease_ms), deadline_ns - now_ns), 1_000_000) / 1e9

    def _valid_at(self, mono_ns: int, wall_ns: int) -> bool:
        # A backwards wall jump (wall_ns < stamp) invalidates: we cannot tell how much time passed.
        return (
            mono_ns < self._valid_until_mono_ns
            and self._wall_stamp_ns <= wall_ns < self._valid_until_wall_ns
        )

    def _set_validity(self, mono_ns: int, wall_ns: int) -> None:
        span = validity_ns(self.lease_ms)
        self._valid_until_mono_ns = mono_ns + span
        self._wall_stamp_ns = wall_ns
        self._valid_until_wall_ns = wall_ns + span

    def _mark_lost(self, cause: str) -> bool:
        """HELD -> LOST once; returns True if this call made the transition."""
        with self._mutex:
            if self.state != HELD:
                return False
            self.state = LOST
            self.lost_cause = cause
        self._announce_lost(cause)
        return True

    def note_stolen(self) -> None:
        """The store proved another owner has the row (a failed release, a rejected check_in): the
        lease is lost with cause ``stolen``, even if it had already lapsed locally as ``expired``."""
        with self._mutex:
            first = self.lost_cause is None
            if self.state in (HELD, LOST, RELEASING, RELEASED):
                self.state = LOST
                self.lost_cause = "stolen"
        if first:
            self._announce_lost("stolen")

    def lost_to_store(self, detail: str) -> LockLost:
        """The one path for "the store says we lost it" (a rejected check_in, a cancelled transaction,
        a completion the store refused): the lease is lost with cause ``stolen``, and the LockLost to
        raise is returned (the caller raises it, ``from`` its store error where there is one)."""
        self.note_stolen()
        return LockLost(f"lease on {self.key!r} in table {self.table!r} was lost: stolen ({detail})",
                        key=self.key, cause="stolen")

    def _lapse_cause(self) -> str:
        """Why validity ran out without a conditional failure."""
        if self._renewal_stopped:
            return "cancelled"  # max_hold: renewal stopped on purpose
        return "unreachable" if self._renew_errors else "expired"

    def _announce_lost(self, cause: str) -> None:
        """Runs once per lease, in the thread that found the loss (usually the renewal thread): stop
        renewing, log, tell the observer, set the ``lost`` event, call ``on_lost`` (its exceptions are
        logged, not raised)."""
        self._scheduler.cancel(self)
        self._end_delegation()
        _log.warning("lease lost: table=%s key=%r cause=%s", self.table, self.key, cause)
        observed = self._observed
        if observed is not None:
            cast("Observer", self._observer).lost(self, observed, cause)
        with self._mutex:
            event = self._lost_event
            callback, self._on_lost = self._on_lost, None
        if event is not None:
            event.set()
        if callback is not None:
            try:
                callback(LockLost(f"lease on {self.key!r} was lost: {cause}", key=self.key, cause=cause))
            except BaseException:  # noqa: BLE001 - a callback must not break the renewal thread
                _log.warning("on_lost callback for %r raised", self.key, exc_info=True)

    @property
    def lost_event(self) -> threading.Event:
        """A ``threading.Event`` set when the lease is lost (already set if it has been)."""
        fresh = threading.Event()
        with self._mutex:
            if self._lost_event is None:
                self._lost_event = fresh
                if self.lost_cause is not None:
                    fresh.set()
            return self._lost_event

    # ---- public state ----------------------------------------------------------------------
    @property
    def client(self) -> Any:
        """The client this lease belongs to."""
        return self._client

    @property
    def renewal_link(self) -> Any:
        """The client's renewal link (``_renewal_link.RenewalLink``), or None: renewals stay here."""
        return self._link

    @property
    def request_timeout_s(self) -> float:
        """The bound on each request of this lease (s): the engine's rule, min(lease/3, 5 s)."""
        return request_timeout_ns(self.lease_ms) / 1e9

    @property
    def state_name(self) -> str:
        return STATE_NAMES[self.state]

    def check_process(self) -> None:
        """RuntimeError in a forked child: the lease, and any use of its ownership, is the parent's."""
        check_not_forked(self._pid)

    def is_valid(self) -> bool:
        """True while the lease is held and within its validity on both clocks. RuntimeError in a
        forked child: the lease is its parent's."""
        check_not_forked(self._pid)
        if self._link_id:
            self._link.sync()  # renewals the renewal process confirmed meanwhile count first
        with self._mutex:
            return self.state == HELD and self._valid_at(self._mono(), self._wall())

    def valid_until_ns(self) -> int:
        """The ``time.monotonic_ns()`` reading at which local validity ends (the earlier of its two
        clocks' ends), or 0 when the lease is not valid now. Reports of the renewal process are applied
        first, as for ``is_valid``. RuntimeError in a forked child: the lease is its parent's."""
        check_not_forked(self._pid)
        if self._link_id:
            self._link.sync()
        with self._mutex:
            mono_ns, wall_ns = self._mono(), self._wall()
            if self.state != HELD or not self._valid_at(mono_ns, wall_ns):
                return 0
            return mono_ns + min(self._valid_until_mono_ns - mono_ns, self._valid_until_wall_ns - wall_ns)

    def raise_if_lost(self) -> None:
        """Raise LockLost unless ownership is still valid now (a local check, no request): with the
        cause of the loss, or ``not_held`` before the acquisition and after a release. RuntimeError
        in a forked child: the lease is its parent's, whatever its state."""
        check_not_forked(self._pid)
        if self._link_id:
            self._link.sync()  # renewals the renewal process confirmed meanwhile count first
        with self._mutex:
            state = self.state
            if state == HELD:
                if self._valid_at(self._mono(), self._wall()):
                    return
        if state == HELD:
            self._mark_lost(self._lapse_cause())
        elif self.lost_cause is None:
            raise LockLost(f"lease on {self.key!r} in table {self.table!r} is not held (it is {STATE_NAMES[state]})",
                           key=self.key, cause="not_held")
        cause = self.lost_cause
        raise LockLost(f"lease on {self.key!r} was lost: {cause}", key=self.key, cause=cause or "expired")

    def counters(self) -> tuple[int, int, int, int, int, int, int, int, bool, float, float]:
        """(write_requests, read_requests, renewals, wait_ns, conditional_failures, request_failures,
        wait_timeouts, cleanup_failures, lost, consumed_rcu, consumed_wcu). RuntimeError in a forked
        child, as for every use of the lease there."""
        check_not_forked(self._pid)
        if self._link_id:
            self._link.sync()  # the renewal process's reports so far count
        with self._mutex:
            rcu, wcu = self._rcu, self._wcu
            lost = self.lost_cause is not None
        return (
            self._writes + self._renew_writes,
            self._reads + self._renew_reads,
            self._renewals,
            self._wait_ns,
            self._conditional_failures + self._renew_conditional_failures,
            self._request_failures + self._renew_request_failures,
            self._wait_timeouts,
            self._cleanup_failures,
            lost,
            rcu,
            wcu,
        )

    # ---- acquisition (caller's thread) -------------------------------------------------------
    def acquire(self) -> None:
        """NEW -> HELD, or raise LockNotAcquired / MalformedLockRow / StoreError (state FAILED).

        The wait policy: one attempt; while contended, wait for the shorter of the poll interval and
        the time until a takeover could be allowed, or until this client releases the key; transient
        store errors back off exponentially. Never beyond the wait budget.
        """
        check_not_forked(self._pid)
        self._scheduler.check_open()
        self._mutex.acquire()  # not `with`: on every hold's path, where it costs half as much compiled
        try:
            if self.state != NEW:
                raise RuntimeError("lease guards are single-use: create a new guard for each acquisition")
            self.state = ACQUIRING
        finally:
            self._mutex.release()
        start_ns = self._acquire_start_ns = self._mono()
        deadline_ns = start_ns + self.wait_ms * _NS_PER_MS
        backoff_ns = ERROR_BACKOFF_MS * _NS_PER_MS
        last_error: Optional[BaseException] = None  # the last attempt's store error; None once one got through
        reached = False  # some attempt got an answer from the store
        signals = self._signals
        acquired = False
        try:
            if self.wait_ms and signals.should_yield(self._cache_key, start_ns):
                # Others are waiting for this key: let one go first. The wait outlasts the longest
                # poll interval, so every waiter polls at least once meanwhile.
                courtesy_ns = int(POLL_INTERVAL_MS * _NS_PER_MS * (1.5 + 0.25 * random.random()))
                self._wait_turn(signals, min(courtesy_ns, self.wait_ms * _NS_PER_MS), False)
            while True:
                if self._ticket is not None:
                    self._ticket.clear()  # a wake-up from now on is for the next attempt
                try:
                    # Requests get their full timeout even when the wait budget is shorter (or 0):
                    # the budget limits waiting for contention, not the network.
                    if self._attempt(max(deadline_ns, self._mono() + request_timeout_ns(self.lease_ms))):
                        self._wait_ns = self._mono() - start_ns
                        if self._observer is not None:  # (inside the try: should it raise, nothing is held)
                            self._observed = self._observer.acquired(self, self._wait_ns)
                        acquired = True
                        return
                    delay_ns = min(self._hint_ns, int(POLL_INTERVAL_MS * _NS_PER_MS * (0.5 + random.random())))
                    backoff_ns = ERROR_BACKOFF_MS * _NS_PER_MS
                    last_error = None
                    reached = True
                except StoreError as error:
                    last_error = error
                    delay_ns = int(backoff_ns * (0.5 + random.random()))
                    backoff_ns = next_backoff_ns(backoff_ns)
                remaining_ns = deadline_ns - self._mono()
                if self.wait_ms == 0 or remaining_ns <= 0 or self._cancelled:
                    break
                # A wait that would cross the deadline is cut to it, then one last attempt is made.
                self._wait_turn(signals, min(delay_ns, remaining_ns), True)
                if self._cancelled:
                    break
        except BaseException as error:
            self._fail_acquisition(start_ns, error)
            raise
        finally:
            if self._ticket is not None:
                signals.leave(self._cache_key, self._ticket, acquired)
            if self._watch is not None:
                self._feed.unwatch(self._watch)
                self._watch = None
        self._fail_acquisition(start_ns, None)
        if self._cancelled:
            raise LockNotAcquired(f"acquisition of {self.key!r} in table {self.table!r} was cancelled", key=self.key)
        self._wait_timeouts += 1
        budget = seconds_text(self.wait_ms * _NS_PER_MS)
        message = f"lease on {self.key!r} in table {self.table!r} not acquired within {budget}"
        if last_error is not None:
            message += f"; last store error: {describe_store_error(last_error)}"
            if not reached:
                _log.warning("the store could not be reached for the whole wait: %s", message)
        elif self._scheduler.holds(self._cache_key, self):
            message += ("; this client already holds that key (guards are not reentrant: the holder may be "
                        "an outer block of this very thread)")
        elif self._row_seen and self.wait_ms < self._seen_lease_ms and self._first_seen == self._last_seen:
            message += self._takeover_advice()  # (the row never changed while we waited: its holder may be dead)
        raise LockNotAcquired(message, key=self.key) from last_error

    def _takeover_advice(self) -> str:
        """For a wait shorter than the holder's lease: how long the row was seen unchanged of what a
        takeover needs, and the wait that would take over a crashed holder's lease in one run."""
        return (f"; its row was seen unchanged for {self._seen_unchanged_ns / 1e9:.1f} s of the "
                f"{self._seen_lease_ms / 1000:g} s a takeover needs (one whole lease, on this client's clock): if its "
                f"holder crashed, a wait_timeout of at least {(self._seen_lease_ms + 2 * POLL_INTERVAL_MS) / 1000:g} s "
                "takes it over in one run, on any host")

    def cancel(self) -> None:
        """Give up an acquisition from any thread. The waiting stops at its next step, and a write
        confirmed after this is deleted rather than held: a late success never revives a cancelled
        guard. No effect once the lease is held (release it instead)."""
        self._cancelled = True
        ticket = self._ticket
        if ticket is not None:
            ticket.set()

    def _wait_turn(self, signals: ReleaseSignals, delay_ns: int, after_attempt: bool) -> None:
        """Sleep up to delay_ns in this client's queue for the key (woken early on our turn, or when
        the store's feed reports a release anywhere)."""
        if self._ticket is None:
            self._ticket = threading.Event()
        if self._watch is None and self._feed is not None:
            watch = self._watch = self._feed.watch(self.table, self.key, self._wake_on_release)
            if not watch.was_ready:
                # A new subscription: a release between our last read and the server's confirmation
                # would not reach us. Wait for the confirmation (briefly), then look again at once.
                self._clock.wait(watch.ready, delay_ns / 1e9)
                if after_attempt:
                    return
        signals.wait(self._clock, self._cache_key, self._ticket, delay_ns / 1e9)

    def _wake_on_release(self) -> None:
        """The feed saw the key released somewhere: wake this client's oldest waiter on it."""
        self._signals.notify(self._cache_key)

    def _fail_acquisition(self, start_ns: int, error: Optional[BaseException]) -> None:
        """The acquisition is abandoned (budget spent or cancelled: ``error`` None; an error, an
        interrupt): leave nothing behind."""
        with self._mutex:
            state = self.state
            if state in (ACQUIRING, HELD):
                self.state = FAILED
        self._wait_ns = self._mono() - start_ns
        pending, self._pending = self._pending, None
        if state == HELD:
            # Interrupted after the row was confirmed (say, KeyboardInterrupt while scheduling its
            # renewal): the caller never got the guard, so stop renewing and delete the row.
            self._scheduler.cancel(self)
            self._delete_owned(self.owner, cleanup_budget_ns(self.lease_ms))
        elif pending is not None:
            # A put that may have committed: remove it if it did, so nobody waits a lease for it.
            self._delete_owned(pending[0], cleanup_budget_ns(self.lease_ms))
        if self._observer is not None:
            self._observer.acquire_failed(self, self._wait_ns, error)

    def _attempt(self, deadline_ns: int) -> bool:
        """One acquisition step. True when held; False with ``_hint_ns`` set when contended."""
        if self._pending is not None:
            row = self._reconcile_acquisition(deadline_ns)
        elif self._row_seen:
            # Polling a held key costs a read, not a failed conditional write.
            row = self._read(deadline_ns)
        else:
            row = None
        if row is None:
            row = self._put_or_read(deadline_ns)
            if row is None:  # released between our put and our read: it earns one more put
                row = self._put_or_read(deadline_ns)
        if row is True:
            return True
        self._hint_ns = 0
        if row is None:
            return False
        check_row(row, self.key)
        self._row_seen = True
        owner, version, stored_lease_ms, _, waiting, _ = row
        now_ns = self._mono()
        seen_ns = self._observations.observe(self._cache_key, owner, version, stored_lease_ms, now_ns)
        self._seen_unchanged_ns, self._seen_lease_ms = seen_ns, stored_lease_ms
        self._last_seen = (owner, version)
        if self._first_seen is None:
            self._first_seen = self._last_seen
        remaining_ns = stored_lease_ms * _NS_PER_MS - seen_ns
        if remaining_ns > 0:
            self._hint_ns = remaining_ns
            if waiting:
                if owner != self._marked_owner:
                    # Another contender has waited a while too: after our turn, we yield to it.
                    self._others_waiting = True
            elif self.wait_ms and now_ns - self._acquire_start_ns >= WAITING_MARK_AFTER_MS * _NS_PER_MS:
                self._mark_waiting(owner, version, deadline_ns)
            return False
        return self._take_over(owner, version, deadline_ns)

    def _mark_waiting(self, owner: str, version: str, deadline_ns: int) -> None:
        """Tell the holder (in any process) that we have been waiting: it yields the next turn on
        release. Only a hint: any outcome is fine, and a failure never ends the wait."""
        self._writes += 1
        try:
            timeout_s = self._timeout_s(deadline_ns, self._mono())
            if not self._store.mark_waiting(self.table, self.key, owner, version, timeout_s, self):
                self._conditional_failures += 1  # renewed, marked or released meanwhile
            else:
                self._marked_owner = owner
                # The holder will yield its next turn: look again soon, so the contender that has
                # waited longest (only such a one marks) is the likeliest to take it.
                soon_ns = int(POLL_INTERVAL_MS * _NS_PER_MS * (0.0625 + 0.125 * random.random()))
                self._hint_ns = min(self._hint_ns, soon_ns)
        except StoreError as error:
            self._request_failures += 1
            _log.debug("waiting mark on %r failed: %s", self.key, error)

    def _put_or_read(self, deadline_ns: int) -> Any:
        """Put a fresh row; if the key is taken, read it. True when held, else the row (or None)."""
        if self._put(deadline_ns):
            return True
        if self._pending is not None:  # unknown outcome and the reconciling read failed: back off
            raise StoreError(f"acquisition of {self.key!r} unconfirmed", key=self.key, maybe_committed=True)
        return self._read(deadline_ns)

    def _read(self, deadline_ns: int) -> Any:
        now_ns = self._mono()
        self._reads += 1
        try:
            return self._store.read(self.table, self.key, self._timeout_s(deadline_ns, now_ns), self)
        except StoreError:
            self._request_failures += 1
            raise

    def _put(self, deadline_ns: int) -> bool:
        return self._acquisition_write(deadline_ns, None, None)

    def _take_over(self, seen_owner: str, seen_version: str, deadline_ns: int) -> bool:
        return self._acquisition_write(deadline_ns, seen_owner, seen_version)

    def _acquisition_write(self, deadline_ns: int, seen_owner: Optional[str], seen_version: Optional[str]) -> bool:
        """Write a fresh row: a put if absent, or (with a seen row) a takeover conditioned on it."""
        owner, version = new_token(), new_token()
        mono_ns, wall_ns = self._mono(), self._wall()  # the stamp validity counts from
        timeout_s = self._timeout_s(deadline_ns, mono_ns)
        self._writes += 1
        try:
            if seen_owner is None:
                applied = self._store.put_if_absent(
                    self.table, self.key, owner, version, self.lease_ms, timeout_s, self
                )
            else:
                applied = self._store.replace_if(
                    self.table, self.key, seen_owner, seen_version, owner, version, self.lease_ms, timeout_s, self
                )
        except StoreError as error:
            self._request_failures += 1
            _log.debug("acquisition write of %r failed (maybe committed: %s): %s", self.key,
                       error.maybe_committed, error)
            if not error.maybe_committed:
                raise
            self._pending = (owner, version, mono_ns, wall_ns)
            return self._reconcile_or_keep_pending(deadline_ns)
        if applied:
            if seen_owner is not None:
                _log.debug("took over %r in %r from owner %s", self.key, self.table, seen_owner)
            # A store that keeps fencing tokens returns the new one (an int) instead of True.
            return self._confirm(owner, version, mono_ns, wall_ns, applied if type(applied) is int else None)
        self._conditional_failures += 1
        return False

    def _reconcile_or_keep_pending(self, deadline_ns: int) -> bool:
        """Right after an ambiguous write: one consistent read. A failed read keeps it pending."""
        try:
            return self._reconcile_acquisition(deadline_ns) is True
        except StoreError:
            return False

    def _reconcile_acquisition(self, deadline_ns: int) -> Any:
        """Resolve a pending write by a consistent read: True if the row holds exactly our owner and
        version (and the confirmation is still valid), else the row as read (None when absent)."""
        row = self._read(deadline_ns)
        # Only called with a write pending (``_attempt`` checks, ``_acquisition_write`` has just set it).
        owner, version, mono_ns, wall_ns = cast("tuple[str, str, int, int]", self._pending)
        if row is not None and row[0] == owner and row[1] == version:
            self._pending = None
            return True if self._confirm(owner, version, mono_ns, wall_ns, row[5]) else None
        self._pending = None
        return row

    def _confirm(self, owner: str, version: str, mono_ns: int, wall_ns: int, fence: Optional[int]) -> bool:
        """A write of ours is confirmed: HELD with validity from the stamp taken before the write.

        A confirmation that arrives after that validity ended (a very slow response), or after the
        acquisition was cancelled, does not count: the row is ours, so it is deleted.
        """
        with self._mutex:
            if self.state != ACQUIRING:
                return False  # a late success never revives a failed or cancelled guard
            self._set_validity(mono_ns, wall_ns)
            if self._cancelled or not self._valid_at(self._mono(), self._wall()):
                stale = True
            else:
                stale = False
                self.owner = owner
                self.version = version
                self.fencing_token = fence
                self.state = HELD
                if self.max_hold_ms:
                    self._hold_until_ns = mono_ns + self.max_hold_ms * _NS_PER_MS
        if stale:
            self._delete_owned(owner, cleanup_budget_ns(self.lease_ms))
            self._hint_ns = 0
            return False
        if self._row_seen:  # only an acquisition that observed the key can have left a sighting
            self._observations.forget(self._cache_key)
        if self._link is not None and self.lease_ms >= DELEGATE_MIN_LEASE_MS:
            pulse = self._link.fast_pulse  # the link's checks are done: the registration is one C call
            if pulse is not None:
                link_id = pulse.register(self, self.table, self.key, owner, version, self.lease_ms, fence,
                                         mono_ns, wall_ns, self._hold_until_ns, self._link.store_id)
            else:
                link_id = self._link.register(self, mono_ns, wall_ns, self._hold_until_ns)
            if link_id:
                with self._mutex:
                    # The renewal process may have ended while this was being staged, handing its
                    # registrations back (this one too, before it was ours to clear): renewals stay here.
                    if self._link.registered(self, link_id):
                        self._link_id = link_id
        self._scheduler.schedule(self, mono_ns + renew_interval_ns(self.lease_ms))
        return True

    # ---- renewal (renewal thread) ------------------------------------------------------------
    def renew_step(self, now_ns: int) -> int:
        """Run one due renewal; return the next due time in ns, or 0 when no more renewals are needed.

        Never raises: any failure becomes a lost lease with a cause, because an exception escaping
        the renewal thread would silently stop every lease of the client.
        """
        try:
            return self._renew_step(now_ns)
        except BaseException as error:  # noqa: BLE001 - see docstring
            _log.warning("renewal of %r failed unexpectedly: %r", self.key, error)
            self._mark_lost("unreachable")
            return 0

    def _renew_step(self, now_ns: int) -> int:
        if self._link_id:
            self._link.sync()  # the renewal process's confirmations count first
        with self._mutex:
            if self.state != HELD:
                return 0
            owner, version = self.owner, self.version
            deadline_ns = self._valid_until_mono_ns
            valid = self._valid_at(self._mono(), self._wall())
        if not valid:
            self._mark_lost(self._lapse_cause())
            return 0
        if self._hold_until_ns and now_ns >= self._hold_until_ns:
            # max_hold reached: no more renewals; come back when validity ends to mark the loss.
            self._end_delegation()
            self._renewal_stopped = True
            return deadline_ns
        if self._link_id:
            # The renewal process renews it (if it ended, sync() gave renewals back to this step): here
            # only the watch above, every lease/3 and at the end of validity.
            self._link.refresh()
            return min(now_ns + renew_interval_ns(self.lease_ms), deadline_ns)
        retry_ns = renew_retry_ns(self.lease_ms)
        if self._renew_pending is not None:
            # The previous renewal's outcome is unknown: read before writing again, because a retry
            # conditioned on the old version would fail if the previous write did land.
            pending_version, p_mono, p_wall = self._renew_pending
            self._renew_reads += 1
            try:
                row = self._store.read(self.table, self.key, self._timeout_s(deadline_ns, now_ns), self)
            except StoreError:
                self._renew_request_failures += 1
                self._renew_errors += 1
                return min(self._mono() + retry_ns, deadline_ns)
            self._renew_pending = None
            if row is not None and row[0] == owner and row[1] == pending_version:
                return self._confirm_renewal(version, pending_version, p_mono, p_wall)
            if row is None or row[0] != owner or row[1] != version:
                self._mark_lost("stolen")
                return 0
        new_version = new_token()
        mono_ns, wall_ns = self._mono(), self._wall()
        self._renew_writes += 1
        try:
            applied = self._store.update_version_if(
                self.table, self.key, owner, version, new_version, self._timeout_s(deadline_ns, mono_ns), self
            )
        except StoreError as error:
            self._renew_request_failures += 1
            self._renew_errors += 1
            _log.debug("renewal of %r failed (maybe committed: %s): %s", self.key, error.maybe_committed, error)
            if error.maybe_committed:
                self._renew_pending = (new_version, mono_ns, wall_ns)
            return min(self._mono() + retry_ns, deadline_ns)
        if applied:
            next_ns = self._confirm_renewal(version, new_version, mono_ns, wall_ns)
            if next_ns and self._link is not None and self.lease_ms >= DELEGATE_MIN_LEASE_MS:
                self._hand_back(mono_ns, wall_ns)
            return next_ns
        self._renew_conditional_failures += 1
        self._mark_lost("stolen")
        return 0

    def _hand_back(self, mono_ns: int, wall_ns: int) -> None:
        """Right after a renewal confirmed here, on the renewal thread (so no renewal of this lease is in
        flight in this process): if a renewal process is ready again (the last one died, or none could
        start at the acquisition), register the lease with it, with this renewal's version and stamps;
        it renews from there, and this thread only watches again."""
        link = self._link
        if not link.takes_back():
            return
        link_id = link.register(self, mono_ns, wall_ns, self._hold_until_ns)
        if not link_id:
            return
        with self._mutex:
            taken = (self.state == HELD and not self._link_id and not self._renewal_stopped
                     and link.registered(self, link_id))
            if taken:
                self._link_id = link_id
                # Its reports count from 0 again: what was counted here so far stays.
                self._delegation_base = (self._renew_writes, self._renew_reads, self._renew_conditional_failures,
                                         self._renew_request_failures, self._renewals)
        if not taken:  # released, lost or at max_hold meanwhile: the renewal process must not renew it
            link.stop(self, link_id)

    def _confirm_renewal(self, old_version: Optional[str], new_version: str, mono_ns: int, wall_ns: int) -> int:
        with self._mutex:
            if self.state != HELD or self.version != old_version:
                return 0  # released or lost meanwhile: a late success never revives it
            # A confirmation that arrives after validity ended does not count (docs/protocol.md,
            # "Validity"): the block may have run unowned meanwhile, so the lease is lost, not renewed.
            lapsed = not self._valid_at(self._mono(), self._wall())
            if not lapsed:
                self.version = new_version
                self._set_validity(mono_ns, wall_ns)
        if lapsed:
            self._mark_lost(self._lapse_cause())
            return 0
        self._renewals += 1
        self._renew_errors = 0
        observed = self._observed
        if observed is not None:
            cast("Observer", self._observer).renewed(self, observed, 1)
        if self._listener is not None:
            self._listener(self)
        return mono_ns + renew_interval_ns(self.lease_ms)

    # ---- renewal by the client's renewal process ----------------------------------------------
    def _end_delegation(self) -> None:
        """Stop the renewal process renewing this lease, and wait until it has (its last confirmed
        renewal applied): before a release is sent, after a loss, at ``max_hold``. No-op otherwise."""
        with self._mutex:
            link_id, self._link_id = self._link_id, 0
        if link_id:
            self._link.stop(self, link_id)  # (a registration not written yet is taken back, with no request)

    def delegation_ended(self) -> None:
        """The renewal process is gone (it died or could not start): renewals are this process's again."""
        with self._mutex:
            self._link_id = 0

    def apply_renewal(self, version: str, mono_ns: int, wall_ns: int, counters: tuple[int, int, int, int, int]) -> None:
        """A renewal the renewal process confirmed: validity from the stamp taken before its write.

        Applied only while the lease is held and that stamp lies within the validity it extends, so a
        late confirmation never revives a lapsed or lost lease.
        """
        renewed = 0
        with self._mutex:
            # A renewal counts only if its write was sent within the validity it extends: the
            # renewal process itself never reports one confirmed after validity ended.
            if self._valid_at(mono_ns, wall_ns):
                renewed = self._delegation_base[4] + counters[4] - self._renewals
                self._renewals = self._delegation_base[4] + counters[4]
                if self.state == HELD and self._link_id:
                    self.version = version
                    self._set_validity(mono_ns, wall_ns)
            self._count_delegated_requests(counters)
        observed = self._observed
        if observed is not None and renewed > 0:
            cast("Observer", self._observer).renewed(self, observed, renewed)

    def apply_loss(self, cause: str, counters: tuple[int, int, int, int, int]) -> None:
        """The renewal process lost the lease (the store refused a renewal, or it lapsed there). Its
        request counters count; its renewals only as far as reports extended validity here."""
        with self._mutex:
            self._link_id = 0
            self._count_delegated_requests(counters)
        self._mark_lost(cause)

    def _count_delegated_requests(self, counters: tuple[int, int, int, int, int]) -> None:
        """Under _mutex: the renewal process's request counters (its own lease's, from 0 at its adoption),
        on top of what this lease counted before it was handed over."""
        base = self._delegation_base
        self._renew_writes = base[0] + counters[0]
        self._renew_reads = base[1] + counters[1]
        self._renew_conditional_failures = base[2] + counters[2]
        self._renew_request_failures = base[3] + counters[3]

    def adopt(self, owner: str, version: str, fence: Optional[int], mono_ns: int, wall_ns: int,
              hold_until_ns: int) -> bool:
        """NEW -> HELD from another process's confirmed acquisition (the renewal process renews it):
        validity from that write's stamps, renewals scheduled from there. False if already lapsed."""
        with self._mutex:
            if self.state != NEW:
                raise RuntimeError("only a new lease can adopt an acquisition")
            self._set_validity(mono_ns, wall_ns)
            if not self._valid_at(self._mono(), self._wall()):
                self.state = FAILED
                return False
            self.owner, self.version, self.fencing_token = owner, version, fence
            self._hold_until_ns = hold_until_ns
            self.state = HELD
        self._scheduler.schedule(self, mono_ns + renew_interval_ns(self.lease_ms))
        return True

    def renewal_state(self) -> tuple[str, int, int, tuple[int, int, int, int, int]]:
        """(version, monotonic and wall stamps its validity counts from, renewal counters): what the
        renewal process reports to the holder after each confirmed renewal."""
        with self._mutex:
            return (cast(str, self.version), self._valid_until_mono_ns - validity_ns(self.lease_ms),
                    self._wall_stamp_ns, (self._renew_writes, self._renew_reads, self._renew_conditional_failures,
                                          self._renew_request_failures, self._renewals))

    def stop_renewing(self) -> None:
        """HELD -> RELEASED without a request, and return once no renewal write of it is in flight:
        the renewal process, when the holder releases (the holder sends the release itself)."""
        with self._mutex:
            if self.state == HELD:
                self.state = RELEASED
        self._scheduler.cancel(self)
        self._scheduler.wait_idle(self, 2 * request_timeout_ns(self.lease_ms))

    # ---- release (caller's thread) -------------------------------------------------------------
    def release(self) -> None:
        """HELD/LOST -> RELEASED (or stays LOST). Raises LockLost if ownership ended before the
        release: the row was no longer ours (``stolen``), or validity lapsed while the block ran (the
        row, still ours, is deleted; another owner may have acted meanwhile), also when the delete then
        stayed unconfirmed (the LockReleaseError is its ``__cause__``); LockReleaseError if the delete of a
        valid lease stayed unconfirmed."""
        check_not_forked(self._pid)  # a forked child must not delete the row its parent still holds
        lapsed = synced = False
        while True:  # at most twice: again only after the renewal process's reports are applied
            self._mutex.acquire()  # (not `with`: see acquire)
            try:
                state = self.state
                if state == HELD:
                    lapsed = not self._valid_at(self._mono(), self._wall())
                    if not lapsed:
                        self.state = RELEASING
                elif state != LOST:
                    raise RuntimeError(f"lease on {self.key!r} cannot be released in state {STATE_NAMES[state]}")
            finally:
                self._mutex.release()
            if not lapsed or synced or not self._link_id:
                break
            # Validity here looks over, but reports may extend it (valid here means valid, so a hold
            # that ends in time reads no report: no system call on the release's path).
            self._link.sync()
            synced = True
        if lapsed:  # the block outlived validity, perhaps before any renewal step noticed
            self._mark_lost(self._lapse_cause())
        if self._scheduler.cancel(self):
            # A renewal write is in flight: let it finish, so that no renewal lands after the release.
            self._scheduler.wait_idle(self, 2 * request_timeout_ns(self.lease_ms))
        if self._link_id:
            self._end_delegation()
        budget_ns = cleanup_budget_ns(self.lease_ms)
        try:
            deleted = self._delete_owned(self.owner, budget_ns, raise_on_failure=True)
        except LockReleaseError as failure:
            if self.lost_cause is None:
                if self._observed is not None:
                    self._hold_ended(failure)
                raise
            # Ownership had already ended (lost or lapsed): what the caller must hear is LockLost, with
            # the unconfirmed release as its cause; only a release of a valid lease is LockReleaseError.
            ended = LockLost(f"lease on {self.key!r} in table {self.table!r} was lost ({self.lost_cause}) before "
                             f"the block ended, and its release stayed unconfirmed: {failure}",
                             key=self.key, cause=self.lost_cause)
            if self._observed is not None:
                self._hold_ended(ended)
            raise ended from failure
        except BaseException as failure:
            if self._observed is not None:
                self._hold_ended(failure)
            raise
        finally:
            self._mutex.acquire()
            try:
                if self.state == RELEASING:
                    self.state = RELEASED
            finally:
                self._mutex.release()
        if deleted:
            self._signals.released(self._cache_key, self._others_waiting, self._mono())
            cause = self.lost_cause
            if cause is None:
                if self._observed is not None:
                    self._hold_ended(None)
                return
            # Ownership lapsed during the block (expired, unreachable, or max_hold's cancelled). The
            # row was still ours, but nobody can tell whether another owner acted in between.
            lost = LockLost(
                f"lease on {self.key!r} in table {self.table!r} lapsed before the block ended ({cause}): "
                "its row is deleted, but another owner may have acted meanwhile",
                key=self.key, cause=cause)
        else:
            # The row was not ours any more: someone took over (or removed it). Fail closed.
            self.note_stolen()
            cause = cast(str, self.lost_cause)  # set by note_stolen(), or before, with the state LOST
            lost = LockLost(f"lease on {self.key!r} was lost before release: {cause}", key=self.key, cause=cause)
        if self._observed is not None:
            self._hold_ended(lost)
        raise lost

    def _hold_ended(self, error: Optional[BaseException]) -> None:
        """Tell the observer, once, that the hold is over (``error``: what the release raised)."""
        with self._mutex:
            observed, self._observed = self._observed, None
        if observed is not None:  # (checked again: another thread may have ended it since the caller looked)
            cast("Observer", self._observer).released(self, observed, error)

    def released_by_store(self) -> None:
        """HELD/LOST -> RELEASED without a request: the caller's own atomic write, conditioned on our
        ownership, has just deleted the row (idempotency's completion). Renewals stop; this client's
        waiters are woken as on a release."""
        check_not_forked(self._pid)
        with self._mutex:
            if self.state not in (HELD, LOST):
                raise RuntimeError(f"lease on {self.key!r} cannot be released in state {STATE_NAMES[self.state]}")
            self.state = RELEASED
        self._scheduler.cancel(self)
        self._end_delegation()
        self._signals.released(self._cache_key, False, self._mono())
        if self._observed is not None:
            self._hold_ended(None)

    def release_by_write(self, write: Callable[[float], bool], landed: Callable[[float], bool]) -> None:
        """Release through the caller's own atomic write, conditioned on our ownership, that also
        deletes the row (idempotency's completion stores its record and frees the key in one request).

        ``write(timeout_s)`` sends it: True if applied, False if the row was not ours. After a write
        whose outcome is unknown, ``landed(timeout_s)`` reads whether it did. The write is sent only
        while the lease is valid (LockLost before any request otherwise); transient errors are retried
        within the cleanup budget. The store refusing it raises LockLost (stolen); an outcome still
        unknown at the end of the budget raises the last StoreError. On success: RELEASED, as after
        ``released_by_store``.
        """
        check_not_forked(self._pid)
        if self._link_id:
            self.raise_if_lost()  # (applies the renewal process's last confirmations first)
            self._end_delegation()  # no renewal lands after the write that ends the lease
        budget_ns = cleanup_budget_ns(self.lease_ms)
        deadline_ns = self._mono() + budget_ns
        backoff_ns = ERROR_BACKOFF_MS * _NS_PER_MS
        ambiguous = False
        while True:
            now_ns = self._mono()
            try:
                if ambiguous:
                    self._reads += 1
                    if landed(self._timeout_s(deadline_ns, now_ns)):
                        break
                    ambiguous = False
                self.raise_if_lost()  # never write on a lapsed lease: a successor may be running
                self._writes += 1
                if write(self._timeout_s(deadline_ns, self._mono())):
                    break
                self._conditional_failures += 1
                raise self.lost_to_store("the store refused the write that ends the lease")
            except StoreError as failure:
                self._request_failures += 1
                _log.debug("final write of %r failed (maybe committed: %s): %s", self.key,
                           failure.maybe_committed, failure)
                ambiguous = ambiguous or failure.maybe_committed
                backoff_ns = self._pause_before_retry(backoff_ns, deadline_ns)
                if not backoff_ns:
                    self._cleanup_failures += 1
                    raise
        self.released_by_store()

    def _pause_before_retry(self, backoff_ns: int, deadline_ns: int) -> int:
        """Sleep ``backoff_ns`` before retrying after a transient store error, if that ends before
        ``deadline_ns``; return the next back-off, or 0 (no sleep) when the budget is spent."""
        if self._mono() + backoff_ns >= deadline_ns:
            return 0
        self._clock.wait(_NEVER_SET, backoff_ns / 1e9)
        return next_backoff_ns(backoff_ns)

    def _delete_owned(self, owner: Optional[str], budget_ns: int, raise_on_failure: bool = False) -> bool:
        """Delete the row if ``owner`` still holds it, retrying transient errors within the budget.

        True: our row is gone (deleted now, or confirmed absent after an ambiguous delete).
        False: the row belongs to someone else or was absent. Raises LockReleaseError when the
        outcome stays unknown and ``raise_on_failure`` is set; otherwise logs and returns True.
        """
        deadline_ns = self._mono() + budget_ns
        backoff_ns = ERROR_BACKOFF_MS * _NS_PER_MS
        error: Optional[StoreError] = None
        ambiguous = False
        while True:
            now_ns = self._mono()
            try:
                if ambiguous:
                    self._reads += 1
                    row = self._store.read(self.table, self.key, self._timeout_s(deadline_ns, now_ns), self)
                    if row is None or row[0] != owner:
                        return True
                    ambiguous = False
                    continue
                self._writes += 1
                timeout_s = self._timeout_s(deadline_ns, now_ns)
                deleted = self._store.delete_if_owner(self.table, self.key, owner, timeout_s, self)
                if deleted is not None:
                    self._others_waiting = self._others_waiting or deleted[4] is True
                    return True
                self._conditional_failures += 1
                return False
            except StoreError as failure:
                self._request_failures += 1
                error = failure
                _log.debug("release of %r failed (maybe committed: %s): %s", self.key, failure.maybe_committed, failure)
                ambiguous = ambiguous or failure.maybe_committed
            backoff_ns = self._pause_before_retry(backoff_ns, deadline_ns)
            if not backoff_ns:
                break
        self._cleanup_failures += 1
        message = f"release of {self.key!r} in table {self.table!r} unconfirmed after {seconds_text(budget_ns)}"
        if raise_on_failure:
            raise LockReleaseError(message, key=self.key) from error
        _log.warning("%s; the row is recovered by observation", message)
        return True


_NEVER_SET = threading.Event()  # waited on for plain back-off sleeps that honour an injected clock


# ---------------------------------------------------------------------------------------------
# Renewal scheduler: one thread per client, a heap of due renewals
# ---------------------------------------------------------------------------------------------
class RenewalScheduler:
    """Renews every held lease of one client: one scheduler thread, a bounded pool of request workers.

    The heap holds (due_ns, sequence, lease). Cancelling is lazy: an entry is live only while
    ``lease._renew_at_ns == due_ns``; stale entries are dropped when popped, and the heap is compacted
    when they outnumber the live ones, so short holds cannot grow it without bound. A clock that
    drives the scheduler itself (``FakeClock``) gets no thread: it calls ``run_due`` as time moves.
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._heap: list[tuple[int, int, Lease]] = []
        self._sequence = 0
        self._stale = 0
        self._mutex = _new_mutex()  # guards the heap and the fields below; schedule and cancel on every hold
        # Set to wake the scheduler thread before its timed wait ends (an earlier renewal, close). The
        # thread clears it and then looks at the heap under _mutex, so a wake-up is never lost.
        self._wake = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._workers: Optional[ThreadPoolExecutor] = None  # made at the first dispatch
        self._closed = False
        self._manual = bool(clock.attach_scheduler(self))
        # Lateness of renewals (start time minus due time), under _mutex: count, max, total.
        self._late_count = 0
        self._late_max_ns = 0
        self._late_total_ns = 0

    def __len__(self) -> int:
        """Live scheduled renewals."""
        with self._mutex:
            return len(self._heap) - self._stale

    def heap_size(self) -> int:
        """Entries in the heap, stale ones included (they are compacted away as they accumulate)."""
        with self._mutex:
            return len(self._heap)

    def check_open(self) -> None:
        """Raise RuntimeError once the client is closed: nothing could renew a new lease."""
        if self._closed:
            raise RuntimeError("the client is closed: create a new client")

    def schedule(self, lease: Lease, due_ns: int) -> None:
        """Renew ``lease`` at ``due_ns`` (monotonic); starts the thread on first use."""
        self._mutex.acquire()  # not `with`: on every hold's path (see Lease.acquire)
        try:
            self.check_open()
            self._push_locked(lease, due_ns)
        finally:
            self._mutex.release()

    def _push_locked(self, lease: Lease, due_ns: int) -> None:
        if lease._renew_at_ns:
            self._stale += 1
        lease._renew_at_ns = due_ns
        self._sequence += 1
        earliest = not self._heap or due_ns < self._heap[0][0]
        heapq.heappush(self._heap, (due_ns, self._sequence, lease))
        if self._manual:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="fastlease-renewal", daemon=True)
            self._thread.start()
        elif earliest:
            self._wake.set()

    def holds(self, cache_key: tuple[str, str], besides: Lease) -> bool:
        """Whether a lease of this client other than ``besides`` holds ``cache_key`` now: every held
        lease has a renewal entry. Only for messages (a scan of the heap), never on a hold's path."""
        with self._mutex:
            for entry in self._heap:
                other = entry[2]
                if other is not besides and other._cache_key == cache_key and other.state == HELD:
                    return True
        return False

    def cancel(self, lease: Lease) -> bool:
        """Unschedule ``lease``; True if a worker is running its renewal step right now."""
        self._mutex.acquire()  # not `with`: on every hold's path (see Lease.acquire)
        try:
            if lease._renew_at_ns:
                lease._renew_at_ns = 0
                self._stale += 1
                if self._stale > 64 and self._stale * 2 > len(self._heap):
                    self._heap = [entry for entry in self._heap if entry[2]._renew_at_ns == entry[0]]
                    heapq.heapify(self._heap)
                    self._stale = 0
            return lease._renewing
        finally:
            self._mutex.release()

    def wait_idle(self, lease: Lease, timeout_ns: int) -> bool:
        """Wait (up to ``timeout_ns``, real time) until no worker runs a renewal step of ``lease``;
        rare, so it polls with a growing pause instead of giving every lease an event."""
        deadline_ns = time.monotonic_ns() + timeout_ns
        pause_s = 0.0002
        while True:
            with self._mutex:
                if not lease._renewing:
                    return True
            if time.monotonic_ns() >= deadline_ns:
                return False
            _NEVER_SET.wait(pause_s)
            pause_s = min(pause_s * 2, 0.005)

    def next_due_ns(self) -> int:
        """Due time of the earliest live renewal, or 0 when none is scheduled."""
        with self._mutex:
            heap = self._heap
            while heap and heap[0][2]._renew_at_ns != heap[0][0]:
                heapq.heappop(heap)
                self._stale -= 1
            return heap[0][0] if heap else 0

    def _pop_due(self, now_ns: int) -> Optional[Lease]:
        """Under the lock: pop the next due live entry, or None."""
        heap = self._heap
        while heap and heap[0][0] <= now_ns:
            due_ns, _, lease = heapq.heappop(heap)
            if lease._renew_at_ns == due_ns:
                lease._renew_at_ns = 0
                lease._renewing = True
                late_ns = now_ns - due_ns
                self._late_count += 1
                self._late_total_ns += late_ns
                if late_ns > self._late_max_ns:
                    self._late_max_ns = late_ns
                return lease
            self._stale -= 1
        return None

    def lateness(self) -> tuple[int, int, int]:
        """(renewals started, max lateness ns, total lateness ns): how far behind their due times."""
        with self._mutex:
            return (self._late_count, self._late_max_ns, self._late_total_ns)

    def _renew(self, lease: Lease, now_ns: int) -> None:
        """A worker thread: one renewal step, then the next due time back on the heap."""
        self._reschedule(lease, lease.renew_step(now_ns))

    def _dispatch(self, lease: Lease, now_ns: int) -> None:
        if self._workers is None:
            from concurrent.futures import ThreadPoolExecutor

            self._workers = ThreadPoolExecutor(RENEWAL_WORKERS, thread_name_prefix="fastlease-renewer")
        try:
            self._workers.submit(self._renew, lease, now_ns)
        except RuntimeError:  # the pool was shut down by close(): leases lapse locally, as documented
            self._reschedule(lease, 0)

    def _reschedule(self, lease: Lease, next_ns: int) -> None:
        """A renewal step has ended: schedule the next one (``next_ns``; 0 for none)."""
        with self._mutex:
            lease._renewing = False
            if next_ns and not self._closed:
                self._push_locked(lease, next_ns)

    def run_due(self) -> int:
        """Run every renewal due now in the calling thread; returns how many ran (manual clocks)."""
        ran = 0
        while True:
            now_ns = self._clock.monotonic_ns()
            with self._mutex:
                lease = self._pop_due(now_ns)
            if lease is None:
                return ran
            self._reschedule(lease, lease.renew_step(now_ns))
            ran += 1

    def _run(self) -> None:
        clock = self._clock
        while True:
            timeout_s = SCHEDULER_IDLE_EXIT_MS / 1000
            with self._mutex:
                if self._closed:
                    self._thread = None
                    return
                now_ns = clock.monotonic_ns()
                lease = self._pop_due(now_ns)
                if lease is None and self._heap:
                    timeout_s = (self._heap[0][0] - now_ns) / 1e9
            if lease is not None:
                self._dispatch(lease, now_ns)
                continue
            woken = self._wake.wait(timeout_s)  # releases the GIL while it waits
            self._wake.clear()
            if not woken:
                with self._mutex:
                    if not self._heap and not self._closed:
                        self._thread = None  # idle: exit; the next schedule() starts a new thread
                        return

    def close(self) -> None:
        """Stop the thread; held leases stop renewing and lapse locally at their validity."""
        with self._mutex:
            self._closed = True
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)
        if self._workers is not None:
            self._workers.shutdown(wait=False)


# ---------------------------------------------------------------------------------------------
# The engine's state per client
# ---------------------------------------------------------------------------------------------
class Engine:
    """What the engine keeps once per client: the store adapter, the clock, the observation cache,
    the renewal scheduler, the same-process release signals and the store's release feed. A client
    makes one (``client.engine``), and every lease of the client reads it; nothing else of the client.
    """

    def __init__(self, store: Any, clock: Optional[Clock] = None, observations: Any = None) -> None:
        self.pid = current_pid()  # using the client in a forked child raises RuntimeError
        self.store = store
        self.clock: Clock = clock if clock is not None else SYSTEM_CLOCK
        # An ObservationCache of this engine, or a SharedObservationCache that wraps one.
        self.observations = observations if observations is not None else ObservationCache()
        self.scheduler = RenewalScheduler(self.clock)
        self.signals = ReleaseSignals()
        # Stores that can report releases made by other processes (Redis pub/sub) set this before
        # the first lease; None means waiters poll.
        self.release_feed: Any = None
        # The client's renewal process (``_renewal_link.RenewalLink``), set by clients whose store it
        # can renew; None keeps every renewal in this process.
        self.link: Any = None
        # The renewal process's own engine sets this: called after each confirmed renewal.
        self.renewal_listener: Optional[Callable[[Lease], None]] = None
        # Told of every lease's events (fastlease.otel.instrument sets one), or None: see Observer.
        self.observer: Optional[Observer] = None

    def close(self) -> None:
        """Stop renewing: held leases lapse locally at their validity; others recover their rows."""
        self.scheduler.close()
        if self.link is not None:
            self.link.close()
