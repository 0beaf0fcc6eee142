# cython: language_level=3, embedsignature=True, freethreading_compatible=True
# cython: boundscheck=False, wraparound=False, cdivision=True
"""Compiled lease engine. ``_core_py.py`` is its twin, name for name and behaviour for behaviour;
read the twin for the reasoning, this file for what differs because it is C:

* clocks are read through CPython's C clock API when the client uses the system clock;
* owner and version tokens are UUID4 strings formatted in C from a pooled ``os.urandom`` buffer
  (the pool is emptied in a forked child, so parent and child never share randomness);
* the renewal thread waits on a ``PyThread`` lock with the GIL released (no raw pthread calls, so
  wheels keep the manylinux baseline of the interpreter).
"""

cimport cython
from cpython.pythread cimport (
    PY_LOCK_ACQUIRED,
    PyLockStatus,
    PyThread_acquire_lock,
    PyThread_allocate_lock,
    PyThread_free_lock,
    PyThread_release_lock,
    PyThread_type_lock,
)
from cpython.time cimport monotonic_ns as c_monotonic_ns, time_ns as c_time_ns
from cpython.unicode cimport PyUnicode_DecodeASCII
from libc.stdint cimport int64_t
from libc.string cimport memcpy


cdef extern from "pythread.h":
    # Public CPython API since 3.2 (Cython's pythread.pxd does not declare it). A portable timed wait
    # that needs no raw pthread call, so wheels keep the interpreter's manylinux baseline.
    PyLockStatus PyThread_acquire_lock_timed(PyThread_type_lock lock, long long microseconds, int intr_flag) nogil

import heapq
import logging
import os
import random
import threading
import time

from .exceptions import LockLost, LockNotAcquired, LockReleaseError, MalformedLockRow, StoreError

IMPLEMENTATION = "c"

_log = logging.getLogger("fastlease.engine")
_heappush = heapq.heappush
_heappop = heapq.heappop
_random = random.random

PROTOCOL_V1 = 1
MIN_LEASE_MS = 100
MAX_DURATION_MS = 86_400_000
MAX_KEY_BYTES = 2048
OBSERVATION_CACHE_SIZE = 4096
POLL_INTERVAL_MS = 125
YIELD_WINDOW_MS = 2 * POLL_INTERVAL_MS
WAITING_MARK_AFTER_MS = 2 * POLL_INTERVAL_MS
ERROR_BACKOFF_MS = 25
SCHEDULER_IDLE_EXIT_MS = 30_000
RENEWAL_WORKERS = 8

cdef int64_t NS_PER_MS = 1_000_000


cdef enum LeaseState:
    NEW_ = 0
    ACQUIRING_ = 1
    HELD_ = 2
    RELEASING_ = 3
    RELEASED_ = 4
    LOST_ = 5       # ownership ended without a release: stolen, expired or unreachable
    FAILED_ = 6     # acquisition gave up: budget spent, malformed row or store error

NEW = NEW_
ACQUIRING = ACQUIRING_
HELD = HELD_
RELEASING = RELEASING_
RELEASED = RELEASED_
LOST = LOST_
FAILED = FAILED_
STATE_NAMES = ("new", "acquiring", "held", "releasing", "released", "lost", "failed")


# ---- timing rules (docs/protocol.md, "Timeouts and budgets") ----------------------------------
cpdef int64_t validity_ns(int64_t lease_ms):
    """Ownership stays valid for 90% of the lease, counted from the stamp taken before the write."""
    return lease_ms * 900_000

cpdef int64_t renew_interval_ns(int64_t lease_ms):
    """Renewal runs every lease/3."""
    return lease_ms * NS_PER_MS // 3

cpdef int64_t renew_retry_ns(int64_t lease_ms):
    """After an unconfirmed renewal the retry comes after min(lease/12, 1 s)."""
    return min(lease_ms * NS_PER_MS // 12, 1_000_000_000)

cpdef int64_t request_timeout_ns(int64_t lease_ms):
    """Each request is bounded by min(lease/3, 5 s)."""
    return min(lease_ms * NS_PER_MS // 3, 5_000_000_000)

cpdef int64_t cleanup_budget_ns(int64_t lease_ms):
    """Release, reconciliation included, has a total budget of min(0.6 * lease, 10 s)."""
    return min(lease_ms * 600_000, 10_000_000_000)


# ---- clocks -------------------------------------------------------------------------------------
class SystemClock:
    """The process's monotonic and wall clocks; waits are real waits on an event."""

    monotonic_ns = staticmethod(time.monotonic_ns)
    time_ns = staticmethod(time.time_ns)

    def wait(self, event, timeout_s):
        return event.wait(timeout_s)

    def attach_scheduler(self, scheduler):
        """Return True if this clock drives the scheduler itself (fake clocks do); False starts a thread."""
        return False


SYSTEM_CLOCK = SystemClock()


# ---- fork detection: clients and guards record the PID they were made in -----------------------
cdef long _process_id = os.getpid()


def _note_fork():
    global _process_id
    _process_id = os.getpid()


os.register_at_fork(after_in_child=_note_fork)


def current_pid():
    """This process's id, kept current across fork without a system call per use."""
    return _process_id


cpdef check_not_forked(long pid):
    """Raise RuntimeError if an object made in process ``pid`` is used in a forked child."""
    if pid != _process_id:
        raise RuntimeError(
            "fastlease client or guard used in a forked child process: its renewal thread and "
            "observations belong to the parent. Create the client in the worker process "
            "(after fork, or use the multiprocessing 'spawn' start method)."
        )


# ---- tokens ------------------------------------------------------------------------------------
cdef unsigned char _pool[4096]
cdef Py_ssize_t _pool_left = 0
cdef cython.pymutex _pool_mutex
cdef const char* _HEX = b"0123456789abcdef"


cdef str _new_token():
    global _pool_left
    cdef unsigned char raw[16]
    cdef char text[36]
    cdef bytes fresh
    cdef int i, j = 0
    cdef bint taken = False
    while not taken:
        with _pool_mutex:
            if _pool_left >= 16:
                _pool_left -= 16
                memcpy(raw, _pool + _pool_left, 16)
                taken = True
        if not taken:
            fresh = os.urandom(4096)  # outside the mutex: a Python call may switch threads
            with _pool_mutex:
                if _pool_left < 16:
                    memcpy(_pool, <const char*>fresh, 4096)
                    _pool_left = 4096
    raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
    for i in range(16):
        if i == 4 or i == 6 or i == 8 or i == 10:
            text[j] = b'-'
            j += 1
        text[j] = _HEX[raw[i] >> 4]
        text[j + 1] = _HEX[raw[i] & 0x0F]
        j += 2
    return PyUnicode_DecodeASCII(text, 36, NULL)


def new_token():
    """A random UUID4 string: used for every owner and every version."""
    return _new_token()


def _hold_pool_for_fork():
    # Held across fork() so that no other thread can be inside the pool when the process is copied:
    # a child must neither inherit a locked mutex nor the parent's unused random bytes.
    _pool_mutex.acquire()


def _resume_pool_in_parent():
    _pool_mutex.release()


def _empty_pool_in_child():
    global _pool_left
    _pool_left = 0
    _pool_mutex.release()


os.register_at_fork(
    before=_hold_pool_for_fork, after_in_parent=_resume_pool_in_parent, after_in_child=_empty_pool_in_child
)


# ---- input checks ------------------------------------------------------------------------------
cpdef str check_key(object key):
    """Return ``key`` if it is a str of 1-2,048 UTF-8 bytes, else raise TypeError/ValueError."""
    cdef Py_ssize_t size
    if type(key) is not str:  # str subclasses too: their str() may not be the value stored
        raise TypeError(f"lock key must be a str, got {type(key).__name__}: {key!r:.80}")
    if (<str>key).isascii():
        size = len(<str>key)
    else:
        try:
            size = len((<str>key).encode("utf-8"))
        except UnicodeEncodeError:
            raise ValueError(f"lock key is not encodable as UTF-8 (lone surrogate?): {key!r:.80}") from None
    if not 1 <= size <= MAX_KEY_BYTES:
        raise ValueError(f"lock key must be 1-{MAX_KEY_BYTES} UTF-8 bytes, got {size}: {key!r:.80}")
    return key


cpdef str check_table(object table):
    """Table names follow DynamoDB's rule on every store, so code moves between stores unchanged."""
    cdef Py_UCS4 c
    if type(table) is not str:
        raise TypeError(f"table must be a str, got {type(table).__name__}: {table!r:.80}")
    cdef bint ok = 3 <= len(<str>table) <= 255
    if ok:
        for c in <str>table:
            if not ('a' <= c <= 'z' or 'A' <= c <= 'Z' or '0' <= c <= '9' or c == '_' or c == '.' or c == '-'):
                ok = False
                break
    if not ok:
        raise ValueError(f"table must be 3-255 characters of A-Z a-z 0-9 _ . -, got {table!r:.80}")
    return table


cpdef check_row(object row, str key):
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


# ---- key templates -----------------------------------------------------------------------------
MISSING = object()


@cython.final
cdef class KeyTemplate:
    """A lock key template, parsed once: literal text, ``{name}`` placeholders, ``{{``/``}}`` braces.

    One placeholder inserts its value as is; two or more prefix each value with its UTF-8 byte length
    and a colon, so ``"{tenant}:{id}"`` with ("acme", "123") is ``"4:acme:3:123"``.
    """

    cdef readonly str template
    cdef readonly tuple names
    cdef tuple _literals

    def __init__(self, template):
        if type(template) is not str:
            raise TypeError(f"key template must be a str, got {type(template).__name__}: {template!r:.80}")
        cdef str source = template
        cdef list literals = [], names = [], text = []
        cdef Py_ssize_t i = 0, n = len(source), end
        cdef str name
        while i < n:
            ch = source[i]
            if ch == "{":
                if source.startswith("{{", i):
                    text.append("{")
                    i += 2
                    continue
                end = source.find("}", i + 1)
                name = source[i + 1:end] if end >= 0 else ""
                if end < 0 or not name.isidentifier():
                    raise ValueError(
                        f"key template {source!r:.200}: placeholder at offset {i} must be {{argument_name}}"
                    )
                literals.append("".join(text))
                text = []
                names.append(name)
                i = end + 1
            elif ch == "}":
                if not source.startswith("}}", i):
                    raise ValueError(f"key template {source!r:.200}: single '}}' at offset {i}; write '}}}}'")
                text.append("}")
                i += 2
            else:
                text.append(ch)
                i += 1
        literals.append("".join(text))
        self.template = source
        self.names = tuple(names)
        self._literals = tuple(literals)
        if not names:
            check_key(literals[0])

    def resolve(self, tuple values):
        """Resolve with one str value per placeholder, in order; TypeError/ValueError on bad values."""
        return self._resolve(values)

    cdef str _resolve(self, tuple values):
        cdef Py_ssize_t count = len(self.names), i, size
        cdef list parts
        cdef str value
        if len(values) != count:
            raise TypeError(f"key template {self.template!r:.200} takes {count} values, got {len(values)}")
        if count == 0:
            return self._literals[0]
        for i in range(count):
            if type(values[i]) is not str:
                raise TypeError(
                    f"lock key argument {self.names[i]!r} must be a str, got "
                    f"{type(values[i]).__name__}: {values[i]!r:.80}"
                )
        if count == 1:
            return check_key(<str>self._literals[0] + <str>values[0] + <str>self._literals[1])
        parts = [self._literals[0]]
        for i in range(count):
            value = values[i]
            if value.isascii():
                size = len(value)
            else:
                try:
                    size = len(value.encode("utf-8"))
                except UnicodeEncodeError:
                    raise ValueError(
                        f"lock key argument {self.names[i]!r} is not encodable as UTF-8: {value!r:.80}"
                    ) from None
            parts.append(f"{size}:{value}{self._literals[i + 1]}")
        return check_key("".join(parts))


@cython.final
cdef class CallKey:
    """A template bound to a function signature: resolves the key from one call's arguments."""

    cdef readonly KeyTemplate template
    cdef tuple _positions
    cdef tuple _defaults

    def __init__(self, KeyTemplate template, tuple positions, tuple defaults):
        if len(positions) != len(template.names) or len(defaults) != len(template.names):
            raise ValueError("positions and defaults must match the template's placeholders")
        self.template = template
        self._positions = positions
        self._defaults = defaults

    def resolve(self, tuple args, dict kwargs):
        cdef Py_ssize_t count = len(self._positions), i, position
        cdef tuple names = self.template.names
        cdef list values = []
        for i in range(count):
            position = self._positions[i]
            name = names[i]
            if 0 <= position < len(args):
                if kwargs and name in kwargs:
                    raise TypeError(f"got multiple values for argument {name!r}")
                values.append(args[position])
            else:
                value = kwargs.get(name, self._defaults[i])
                if value is MISSING:
                    raise TypeError(f"missing required argument {name!r} used by the lock key")
                values.append(value)
        return self.template._resolve(tuple(values))


# ---- observation cache -------------------------------------------------------------------------
@cython.final
cdef class ObservationCache:
    """When this client first saw each contended row unchanged, on its own monotonic clock.

    Bounded LRU; evicting an entry only restarts that row's observation (never an early takeover).
    """

    cdef readonly Py_ssize_t capacity
    cdef dict _entries
    cdef cython.pymutex _mutex

    def __init__(self, capacity=OBSERVATION_CACHE_SIZE):
        if type(capacity) is not int or capacity < 1:
            raise ValueError(f"observation cache capacity must be a positive int, got {capacity!r}")
        self.capacity = capacity
        self._entries = {}

    cpdef int64_t observe(self, tuple cache_key, str owner, str version, int64_t lease_ms, int64_t now_ns):
        """Record a sighting; return how long (ns) this exact row has been seen unchanged."""
        cdef tuple entry
        with self._mutex:
            entry = self._entries.pop(cache_key, None)
            if entry is None or entry[0] != owner or entry[1] != version or entry[2] != lease_ms:
                entry = (owner, version, lease_ms, now_ns)
                if len(self._entries) >= self.capacity:
                    del self._entries[next(iter(self._entries))]
            self._entries[cache_key] = entry  # re-inserted last: the dict's order is the LRU order
            return now_ns - <int64_t>entry[3]

    cpdef forget(self, tuple cache_key):
        with self._mutex:
            if self._entries:
                self._entries.pop(cache_key, None)

    def __len__(self):
        return len(self._entries)


# ---- same-process wake-up on release -----------------------------------------------------------
@cython.final
cdef class ReleaseSignals:
    """Handoff between this client's waiters and others: first-come first-served wake-ups on release,
    and turn-taking while others wait (see the twin for the reasoning)."""

    cdef dict _queues  # cache_key -> [ticket, ...], oldest first; removed when empty
    cdef dict _contended  # cache_key -> last release of a key others wait for; bounded
    cdef cython.pymutex _mutex

    def __init__(self):
        self._queues = {}
        self._contended = {}

    cpdef wait(self, clock, tuple cache_key, ticket, double timeout_s):
        """Wait up to ``timeout_s`` (or until woken), queued behind earlier waiters on the key."""
        cdef list queue
        with self._mutex:
            queue = self._queues.get(cache_key)
            if queue is None:
                queue = []
                self._queues[cache_key] = queue
            if ticket not in queue:
                queue.append(ticket)
        clock.wait(ticket, timeout_s)

    cpdef leave(self, tuple cache_key, ticket, bint acquired):
        """The waiter's acquisition is over; without the lease, it hands an unused wake-up on."""
        cdef list queue
        cdef bint was_head
        next_head = None
        with self._mutex:
            queue = self._queues.get(cache_key)
            if queue is None or ticket not in queue:
                return
            was_head = queue[0] is ticket
            queue.remove(ticket)
            if not queue:
                del self._queues[cache_key]
            elif was_head and not acquired:
                next_head = queue[0]
        if next_head is not None and ticket.is_set():
            next_head.set()

    cpdef notify(self, tuple cache_key):
        """This client released the key: wake its oldest waiter."""
        cdef list queue
        head = None
        if self._queues:  # the uncontended release skips the mutex
            with self._mutex:
                queue = self._queues.get(cache_key)
                if queue:
                    head = queue[0]
            if head is not None:
                head.set()

    cpdef released(self, tuple cache_key, bint others_waiting, int64_t now_ns):
        """This client released ``cache_key``; ``others_waiting`` if the row carried a waiting mark."""
        if others_waiting or self._contended:
            with self._mutex:
                self._contended.pop(cache_key, None)
                if others_waiting:
                    if len(self._contended) >= OBSERVATION_CACHE_SIZE:
                        del self._contended[next(iter(self._contended))]
                    self._contended[cache_key] = now_ns
        self.notify(cache_key)

    cpdef bint should_yield(self, tuple cache_key, int64_t now_ns):
        """Should a new acquisition of ``cache_key`` let other contenders go first?"""
        if self._queues and cache_key in self._queues:
            return True
        released_ns = self._contended.get(cache_key) if self._contended else None
        return released_ns is not None and now_ns - <int64_t>released_ns < YIELD_WINDOW_MS * NS_PER_MS

    def __len__(self):
        """Keys with waiters queued."""
        return len(self._queues)


# ---- the lease state machine -------------------------------------------------------------------
cdef object _NEVER_SET = threading.Event()  # waited on for back-off sleeps that honour an injected clock


@cython.final
cdef class Lease:
    """One acquisition of one key: the protocol state machine. Single use.

    The caller's thread drives acquire and release; the client's renewal thread runs ``renew_step``.
    Fields both threads write are guarded by ``_mutex``; each thread has its own request counters.
    """

    cdef readonly str table
    cdef readonly str key
    cdef readonly int64_t lease_ms
    cdef readonly int64_t wait_ms
    cdef readonly int64_t max_hold_ms
    cdef object _on_lost  # taken (set to None) by the one call that announces the loss
    cdef object _lost_event  # made on first use; installed under _mutex
    cdef int64_t _hold_until_ns  # written by the caller before renewal is scheduled; 0: no max_hold
    cdef bint _renewal_stopped  # max_hold reached; renewal thread only
    cdef long _pid  # the process this guard was made in
    cdef object _client
    cdef object _store
    cdef object _clock
    cdef bint _system_clock
    cdef tuple _cache_key
    cdef object _observations  # the client's ObservationCache, or a SharedObservationCache
    cdef RenewalScheduler _scheduler
    cdef ReleaseSignals _signals
    cdef cython.pymutex _mutex
    # Written by the caller's thread, and by the renewal thread only to move HELD -> LOST.
    cdef readonly int state
    cdef readonly object lost_cause
    # Written once by the caller's thread before renewal is scheduled; read-only afterwards.
    cdef readonly object owner
    cdef readonly object fencing_token  # the store's token of this acquisition, or None; set with owner
    # Written under _mutex by whichever thread confirms a write.
    cdef readonly object version
    cdef int64_t _valid_until_mono_ns
    cdef int64_t _wall_stamp_ns
    cdef int64_t _valid_until_wall_ns
    # Unknown-outcome writes: acquisition (caller only) and renewal (renewal thread only).
    cdef tuple _pending
    cdef tuple _renew_pending
    cdef int _renew_errors
    # Due time of the live heap entry; 0 when unscheduled. Written under the scheduler's mutex.
    cdef int64_t _renew_at_ns
    cdef int64_t _hint_ns
    cdef bint _row_seen  # the last attempt found the key held; caller only
    cdef int64_t _acquire_start_ns  # when acquire() began; caller only
    cdef bint _others_waiting  # our deleted row was marked, or we saw a mark not ours; caller only
    cdef object _marked_owner  # the holder whose row we marked; caller only
    # Set by cancel() from any thread (an async task was cancelled); read by the caller's thread.
    cdef bint _cancelled
    cdef object _ticket  # our place in the client's wait queue (an Event); caller only
    cdef object _feed  # the store's feed of releases made anywhere (Redis pub/sub), or None
    cdef object _watch  # our watch on the feed while waiting; caller only
    # Caller-thread counters.
    cdef int64_t _writes, _reads, _conditional_failures, _request_failures
    cdef int64_t _wait_timeouts, _cleanup_failures, _wait_ns
    # Renewal-thread counters.
    cdef int64_t _renew_writes, _renew_reads, _renew_conditional_failures, _renew_request_failures
    cdef int64_t _renewals
    # Capacity reported by stores from either thread; under _mutex.
    cdef double _rcu, _wcu

    def __init__(self, client, table, key, lease_ms, wait_ms, max_hold_ms=0, on_lost=None):
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
        check_not_forked(client._pid)
        self.table = check_table(table)
        self.key = check_key(key)
        self._pid = client._pid
        self.lease_ms = lease_ms
        self.wait_ms = wait_ms
        self.max_hold_ms = max_hold_ms
        self._on_lost = on_lost
        self._client = client
        self._store = client._store
        self._clock = client._clock
        self._system_clock = self._clock is SYSTEM_CLOCK
        self._cache_key = (self.table, self.key)
        self._observations = client._observations
        self._scheduler = client._scheduler
        self._signals = client._release_signals
        self._feed = client._release_feed
        self.state = NEW_

    # ---- small helpers ---------------------------------------------------------------------------
    cdef inline int64_t _mono(self) except? -1:
        if self._system_clock:
            return c_monotonic_ns()
        return self._clock.monotonic_ns()

    cdef inline int64_t _wall(self) except? -1:
        if self._system_clock:
            return c_time_ns()
        return self._clock.time_ns()

    def add_capacity(self, double rcu, double wcu):
        """Stores report consumed capacity of successful responses here."""
        with self._mutex:
            self._rcu += rcu
            self._wcu += wcu

    cdef double _timeout_s(self, int64_t deadline_ns, int64_t now_ns):
        return max(min(request_timeout_ns(self.lease_ms), deadline_ns - now_ns), 1_000_000) / 1e9

    cdef inline bint _valid_at(self, int64_t mono_ns, int64_t wall_ns) noexcept:
        # A backwards wall jump (wall_ns < stamp) invalidates: we cannot tell how much time passed.
        return (mono_ns < self._valid_until_mono_ns
                and self._wall_stamp_ns <= wall_ns < self._valid_until_wall_ns)

    cdef inline void _set_validity(self, int64_t mono_ns, int64_t wall_ns) noexcept:
        cdef int64_t span = validity_ns(self.lease_ms)
        self._valid_until_mono_ns = mono_ns + span
        self._wall_stamp_ns = wall_ns
        self._valid_until_wall_ns = wall_ns + span

    cdef bint _mark_lost(self, str cause) except -1:
        """HELD -> LOST once; returns True if this call made the transition."""
        with self._mutex:
            if self.state != HELD_:
                return False
            self.state = LOST_
            self.lost_cause = cause
        self._announce_lost(cause)
        return True

    def note_stolen(self):
        """The store proved another owner has the row (a failed release, a rejected check_in): the
        lease is lost with cause ``stolen``, even if it had already lapsed locally as ``expired``."""
        cdef bint first
        with self._mutex:
            first = self.lost_cause is None
            if self.state == HELD_ or self.state == LOST_ or self.state == RELEASING_ or self.state == RELEASED_:
                self.state = LOST_
                self.lost_cause = "stolen"
        if first:
            self._announce_lost("stolen")

    cdef str _lapse_cause(self):
        """Why validity ran out without a conditional failure."""
        if self._renewal_stopped:
            return "cancelled"  # max_hold: renewal stopped on purpose
        return "unreachable" if self._renew_errors else "expired"

    cdef _announce_lost(self, str cause):
        """Runs once per lease, in the thread that found the loss (usually the renewal thread): stop
        renewing, log, set the ``lost`` event, call ``on_lost`` (its exceptions are logged, not raised)."""
        self._scheduler.cancel(self)
        _log.warning("lease lost: table=%s key=%r cause=%s", self.table, self.key, cause)
        with self._mutex:
            event = self._lost_event
            callback = self._on_lost
            self._on_lost = None
        if event is not None:
            event.set()
        if callback is not None:
            try:
                callback(LockLost(f"lease on {self.key!r} was lost: {cause}", key=self.key, cause=cause))
            except BaseException:
                _log.warning("on_lost callback for %r raised", self.key, exc_info=True)

    @property
    def lost_event(self):
        """A ``threading.Event`` set when the lease is lost (already set if it has been)."""
        fresh = threading.Event()
        with self._mutex:
            if self._lost_event is None:
                self._lost_event = fresh
                if self.lost_cause is not None:
                    fresh.set()
            return self._lost_event

    # ---- public state ----------------------------------------------------------------------------
    @property
    def client(self):
        """The client this lease belongs to."""
        return self._client

    @property
    def state_name(self):
        return STATE_NAMES[self.state]

    def is_valid(self):
        """True while the lease is held and within its validity on both clocks."""
        cdef int64_t mono = self._mono(), wall = self._wall()
        with self._mutex:
            return self.state == HELD_ and self._valid_at(mono, wall)

    def raise_if_lost(self):
        """Raise LockLost unless ownership is still valid now (a local check, no request)."""
        cdef int64_t mono = self._mono(), wall = self._wall()
        cdef int state
        with self._mutex:
            state = self.state
            if state == HELD_ and self._valid_at(mono, wall):
                return
        if state == HELD_:
            self._mark_lost(self._lapse_cause())
        elif self.lost_cause is None:
            raise RuntimeError(f"lease on {self.key!r} is {STATE_NAMES[state]}, not held")
        cause = self.lost_cause
        raise LockLost(f"lease on {self.key!r} was lost: {cause}", key=self.key, cause=cause or "expired")

    def counters(self):
        """(write_requests, read_requests, renewals, wait_ns, conditional_failures, request_failures,
        wait_timeouts, cleanup_failures, lost, consumed_rcu, consumed_wcu)."""
        cdef double rcu, wcu
        cdef bint lost
        with self._mutex:
            rcu = self._rcu
            wcu = self._wcu
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

    # ---- acquisition (caller's thread) -----------------------------------------------------------
    def acquire(self):
        """NEW -> HELD, or raise LockNotAcquired / MalformedLockRow / StoreError (state FAILED)."""
        cdef int64_t start_ns, deadline_ns, delay_ns, remaining_ns
        cdef int64_t backoff_ns = ERROR_BACKOFF_MS * NS_PER_MS
        check_not_forked(self._pid)
        self._scheduler.check_open()
        with self._mutex:
            if self.state != NEW_:
                raise RuntimeError("lease guards are single-use: create a new guard for each acquisition")
            self.state = ACQUIRING_
        start_ns = self._acquire_start_ns = self._mono()
        deadline_ns = start_ns + self.wait_ms * NS_PER_MS
        last_error = None
        cdef bint acquired = False
        try:
            if self.wait_ms and self._signals.should_yield(self._cache_key, start_ns):
                # Others are waiting for this key: let one go first. The wait outlasts the longest
                # poll interval, so every waiter polls at least once meanwhile.
                delay_ns = <int64_t>(POLL_INTERVAL_MS * NS_PER_MS * (1.5 + 0.25 * _random()))
                self._wait_turn(min(delay_ns, self.wait_ms * NS_PER_MS), False)
            while True:
                if self._ticket is not None:
                    self._ticket.clear()  # a wake-up from now on is for the next attempt
                try:
                    # Requests get their full timeout even when the wait budget is shorter (or 0):
                    # the budget limits waiting for contention, not the network.
                    if self._attempt(max(deadline_ns, self._mono() + request_timeout_ns(self.lease_ms))):
                        self._wait_ns = self._mono() - start_ns
                        acquired = True
                        return
                    delay_ns = min(self._hint_ns, <int64_t>(POLL_INTERVAL_MS * NS_PER_MS * (0.5 + _random())))
                    backoff_ns = ERROR_BACKOFF_MS * NS_PER_MS
                except StoreError as error:
                    last_error = error
                    delay_ns = <int64_t>(backoff_ns * (0.5 + _random()))
                    backoff_ns = min(backoff_ns * 2, POLL_INTERVAL_MS * 5 * NS_PER_MS)
                remaining_ns = deadline_ns - self._mono()
                if self.wait_ms == 0 or remaining_ns <= 0 or self._cancelled:
                    break
                # A wait that would cross the deadline is cut to it, then one last attempt is made.
                self._wait_turn(min(delay_ns, remaining_ns), True)
                if self._cancelled:
                    break
        except BaseException:
            self._fail_acquisition(start_ns)
            raise
        finally:
            if self._ticket is not None:
                self._signals.leave(self._cache_key, self._ticket, acquired)
            if self._watch is not None:
                self._feed.unwatch(self._watch)
                self._watch = None
        self._fail_acquisition(start_ns)
        if self._cancelled:
            raise LockNotAcquired(f"acquisition of {self.key!r} in table {self.table!r} was cancelled", key=self.key)
        self._wait_timeouts += 1
        raise LockNotAcquired(
            f"lease on {self.key!r} in table {self.table!r} not acquired within {self.wait_ms / 1000:g}s",
            key=self.key,
        ) from last_error

    def cancel(self):
        """Give up an acquisition from any thread. The waiting stops at its next step, and a write
        confirmed after this is deleted rather than held. No effect once the lease is held."""
        self._cancelled = True
        ticket = self._ticket
        if ticket is not None:
            ticket.set()

    cdef _wait_turn(self, int64_t delay_ns, bint after_attempt):
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
        self._signals.wait(self._clock, self._cache_key, self._ticket, delay_ns / 1e9)

    def _wake_on_release(self):
        """The feed saw the key released somewhere: wake this client's oldest waiter on it."""
        self._signals.notify(self._cache_key)

    cdef _fail_acquisition(self, int64_t start_ns):
        """The acquisition is abandoned (budget spent, error, interrupt): leave nothing behind."""
        cdef int state
        with self._mutex:
            state = self.state
            if state == ACQUIRING_ or state == HELD_:
                self.state = FAILED_
        self._wait_ns = self._mono() - start_ns
        pending = self._pending
        self._pending = None
        if state == HELD_:
            # Interrupted after the row was confirmed: the caller never got the guard, so stop
            # renewing and delete the row.
            self._scheduler.cancel(self)
            self._delete_owned(self.owner, cleanup_budget_ns(self.lease_ms), False)
        elif pending is not None:
            # A put that may have committed: remove it if it did, so nobody waits a lease for it.
            self._delete_owned(pending[0], cleanup_budget_ns(self.lease_ms), False)

    cdef bint _attempt(self, int64_t deadline_ns) except -1:
        """One acquisition step. True when held; False with ``_hint_ns`` set when contended."""
        cdef int64_t now_ns, seen_ns, remaining_ns
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
        remaining_ns = <int64_t>stored_lease_ms * NS_PER_MS - seen_ns
        if remaining_ns > 0:
            self._hint_ns = remaining_ns
            if waiting:
                if owner != self._marked_owner:
                    # Another contender has waited a while too: after our turn, we yield to it.
                    self._others_waiting = True
            elif self.wait_ms and now_ns - self._acquire_start_ns >= WAITING_MARK_AFTER_MS * NS_PER_MS:
                self._mark_waiting(owner, version, deadline_ns)
            return False
        return self._take_over(owner, version, deadline_ns)

    cdef _mark_waiting(self, str owner, str version, int64_t deadline_ns):
        """Tell the holder (in any process) that we have been waiting: it yields the next turn on
        release. Only a hint: any outcome is fine, and a failure never ends the wait."""
        self._writes += 1
        try:
            if not self._store.mark_waiting(self.table, self.key, owner, version,
                                            self._timeout_s(deadline_ns, self._mono()), self):
                self._conditional_failures += 1  # renewed, marked or released meanwhile
            else:
                self._marked_owner = owner
                # The holder will yield its next turn: look again soon, so the contender that has
                # waited longest (only such a one marks) is the likeliest to take it.
                self._hint_ns = min(self._hint_ns, <int64_t>(POLL_INTERVAL_MS * NS_PER_MS * (0.0625 + 0.125 * _random())))
        except StoreError as error:
            self._request_failures += 1
            _log.debug("waiting mark on %r failed: %s", self.key, error)

    cdef object _put_or_read(self, int64_t deadline_ns):
        """Put a fresh row; if the key is taken, read it. True when held, else the row (or None)."""
        if self._put(deadline_ns):
            return True
        if self._pending is not None:  # unknown outcome and the reconciling read failed: back off
            raise StoreError(f"acquisition of {self.key!r} unconfirmed", key=self.key, maybe_committed=True)
        return self._read(deadline_ns)

    cdef object _read(self, int64_t deadline_ns):
        cdef int64_t now_ns = self._mono()
        self._reads += 1
        try:
            return self._store.read(self.table, self.key, self._timeout_s(deadline_ns, now_ns), self)
        except StoreError:
            self._request_failures += 1
            raise

    cdef bint _put(self, int64_t deadline_ns) except -1:
        return self._acquisition_write(deadline_ns, None, None)

    cdef bint _take_over(self, str seen_owner, str seen_version, int64_t deadline_ns) except -1:
        return self._acquisition_write(deadline_ns, seen_owner, seen_version)

    cdef bint _acquisition_write(self, int64_t deadline_ns, seen_owner, seen_version) except -1:
        """Write a fresh row: a put if absent, or (with a seen row) a takeover conditioned on it."""
        cdef str owner = _new_token(), version = _new_token()
        cdef int64_t mono_ns = self._mono(), wall_ns = self._wall()  # the stamp validity counts from
        cdef double timeout_s = self._timeout_s(deadline_ns, mono_ns)
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

    cdef bint _reconcile_or_keep_pending(self, int64_t deadline_ns) except -1:
        """Right after an ambiguous write: one consistent read. A failed read keeps it pending."""
        try:
            return self._reconcile_acquisition(deadline_ns) is True
        except StoreError:
            return False

    cdef object _reconcile_acquisition(self, int64_t deadline_ns):
        """Resolve a pending write by a consistent read: True if the row holds exactly our owner and
        version (and the confirmation is still valid), else the row as read (None when absent)."""
        row = self._read(deadline_ns)
        owner, version, mono_ns, wall_ns = self._pending
        self._pending = None
        if row is not None and row[0] == owner and row[1] == version:
            return True if self._confirm(owner, version, mono_ns, wall_ns, row[5]) else None
        return row

    cdef bint _confirm(self, str owner, str version, int64_t mono_ns, int64_t wall_ns, object fence) except -1:
        """A write of ours is confirmed: HELD with validity from the stamp taken before the write.
        A confirmation that arrives after that validity ended does not count: the row is deleted."""
        cdef int64_t now_mono = self._mono(), now_wall = self._wall()
        cdef bint stale
        with self._mutex:
            if self.state != ACQUIRING_:
                return False  # a late success never revives a failed or cancelled guard
            self._set_validity(mono_ns, wall_ns)
            stale = self._cancelled or not self._valid_at(now_mono, now_wall)
            if not stale:
                self.owner = owner
                self.version = version
                self.fencing_token = fence
                self.state = HELD_
                if self.max_hold_ms:
                    self._hold_until_ns = mono_ns + self.max_hold_ms * NS_PER_MS
        if stale:
            self._delete_owned(owner, cleanup_budget_ns(self.lease_ms), False)
            self._hint_ns = 0
            return False
        if self._row_seen:  # only an acquisition that observed the key can have left a sighting
            self._observations.forget(self._cache_key)
        self._scheduler.schedule(self, mono_ns + renew_interval_ns(self.lease_ms))
        return True

    # ---- renewal (renewal thread) ----------------------------------------------------------------
    def renew_step(self, int64_t now_ns):
        """Run one due renewal; return the next due time in ns, or 0 when no more renewals are needed.
        Never raises: any failure becomes a lost lease with a cause."""
        try:
            return self._renew_step(now_ns)
        except BaseException as error:
            _log.warning("renewal of %r failed unexpectedly: %r", self.key, error)
            self._mark_lost("unreachable")
            return 0

    cdef int64_t _renew_step(self, int64_t now_ns) except? -1:
        cdef int64_t deadline_ns, retry_ns, mono_ns, wall_ns, p_mono, p_wall
        cdef int64_t now_mono = self._mono(), now_wall = self._wall()
        cdef bint valid
        with self._mutex:
            if self.state != HELD_:
                return 0
            owner = self.owner
            version = self.version
            deadline_ns = self._valid_until_mono_ns
            valid = self._valid_at(now_mono, now_wall)
        if not valid:
            self._mark_lost(self._lapse_cause())
            return 0
        if self._hold_until_ns and now_ns >= self._hold_until_ns:
            # max_hold reached: no more renewals; come back when validity ends to mark the loss.
            self._renewal_stopped = True
            return deadline_ns
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
        new_version = _new_token()
        mono_ns = self._mono()
        wall_ns = self._wall()
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
            return self._confirm_renewal(version, new_version, mono_ns, wall_ns)
        self._renew_conditional_failures += 1
        self._mark_lost("stolen")
        return 0

    cdef int64_t _confirm_renewal(self, old_version, str new_version, int64_t mono_ns, int64_t wall_ns):
        with self._mutex:
            if self.state != HELD_ or self.version != old_version:
                return 0  # released or lost meanwhile: a late success never revives it
            self.version = new_version
            self._set_validity(mono_ns, wall_ns)
        self._renewals += 1
        self._renew_errors = 0
        return mono_ns + renew_interval_ns(self.lease_ms)

    # ---- release (caller's thread) ---------------------------------------------------------------
    def release(self):
        """HELD/LOST -> RELEASED (or stays LOST). Raises LockLost if the row was no longer ours,
        LockReleaseError if the delete stayed unconfirmed."""
        cdef int state
        cdef bint deleted
        check_not_forked(self._pid)
        with self._mutex:
            state = self.state
            if state == HELD_:
                self.state = RELEASING_
        if state != HELD_ and state != LOST_:
            raise RuntimeError(f"lease on {self.key!r} cannot be released in state {STATE_NAMES[state]}")
        self._scheduler.cancel(self)
        try:
            deleted = self._delete_owned(self.owner, cleanup_budget_ns(self.lease_ms), True)
        finally:
            with self._mutex:
                if self.state == RELEASING_:
                    self.state = RELEASED_
        if deleted:
            self._signals.released(self._cache_key, self._others_waiting, self._mono())
            return
        # The row was not ours any more: someone took over (or removed it). Fail closed.
        self.note_stolen()
        cause = self.lost_cause
        raise LockLost(f"lease on {self.key!r} was lost before release: {cause}", key=self.key, cause=cause)

    def released_by_store(self):
        """HELD/LOST -> RELEASED without a request: the caller's own atomic write, conditioned on our
        ownership, has just deleted the row (idempotency's completion). Renewals stop; this client's
        waiters are woken as on a release."""
        check_not_forked(self._pid)
        with self._mutex:
            if self.state != HELD_ and self.state != LOST_:
                raise RuntimeError(f"lease on {self.key!r} cannot be released in state {STATE_NAMES[self.state]}")
            self.state = RELEASED_
        self._scheduler.cancel(self)
        self._signals.released(self._cache_key, False, self._mono())

    cdef bint _delete_owned(self, owner, int64_t budget_ns, bint raise_on_failure) except -1:
        """Delete the row if ``owner`` still holds it, retrying transient errors within the budget.
        True: our row is gone. False: it belongs to someone else or was absent."""
        cdef int64_t deadline_ns = self._mono() + budget_ns
        cdef int64_t backoff_ns = ERROR_BACKOFF_MS * NS_PER_MS
        cdef int64_t now_ns
        cdef bint ambiguous = False
        error = None
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
                deleted = self._store.delete_if_owner(self.table, self.key, owner, self._timeout_s(deadline_ns, now_ns), self)
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
            now_ns = self._mono()
            if now_ns + backoff_ns >= deadline_ns:
                break
            self._clock.wait(_NEVER_SET, backoff_ns / 1e9)
            backoff_ns = min(backoff_ns * 2, POLL_INTERVAL_MS * 5 * NS_PER_MS)
        self._cleanup_failures += 1
        message = f"release of {self.key!r} in table {self.table!r} unconfirmed after {budget_ns / 1e9:g}s"
        if raise_on_failure:
            raise LockReleaseError(message, key=self.key) from error
        _log.warning("%s; the row is recovered by observation", message)
        return True


# ---- renewal scheduler -------------------------------------------------------------------------
@cython.final
cdef class RenewalScheduler:
    """Renews every held lease of one client: one scheduler thread that waits and dispatches, and a
    bounded pool of request workers (see the twin for the design).

    The thread sleeps on ``_wake``, a PyThread lock held while no wake-up is pending, with the GIL
    released; ``_notify`` releases it. A clock that drives the scheduler itself gets no thread.
    """

    cdef object _clock
    cdef list _heap
    cdef int64_t _sequence
    cdef Py_ssize_t _stale
    cdef cython.pymutex _mutex
    cdef PyThread_type_lock _wake
    cdef bint _wake_pending  # under _mutex: True while _wake is released and not yet re-taken
    cdef object _thread
    cdef object _workers  # ThreadPoolExecutor for renewal requests, made at the first dispatch
    cdef bint _closed
    cdef bint _manual
    # Lateness of renewals (start time minus due time), under _mutex: count, max, total.
    cdef int64_t _late_count, _late_max_ns, _late_total_ns

    def __cinit__(self):
        self._wake = PyThread_allocate_lock()
        if self._wake == NULL:
            raise MemoryError("cannot allocate the renewal scheduler's lock")
        PyThread_acquire_lock(self._wake, 1)

    def __dealloc__(self):
        # The thread holds a reference to self while it runs, so it has finished by now.
        if self._wake != NULL:
            if self._wake_pending:
                PyThread_acquire_lock(self._wake, 0)
            PyThread_release_lock(self._wake)
            PyThread_free_lock(self._wake)

    def __init__(self, clock):
        self._clock = clock
        self._heap = []
        self._manual = bool(clock.attach_scheduler(self))

    def __len__(self):
        """Live scheduled renewals."""
        with self._mutex:
            return len(self._heap) - self._stale

    def heap_size(self):
        """Entries in the heap, stale ones included (they are compacted away as they accumulate)."""
        with self._mutex:
            return len(self._heap)

    cdef inline void _notify(self) noexcept:
        # Caller holds _mutex.
        if not self._wake_pending:
            self._wake_pending = True
            PyThread_release_lock(self._wake)

    cpdef check_open(self):
        """Raise RuntimeError once the client is closed: nothing could renew a new lease."""
        if self._closed:
            raise RuntimeError("the client is closed: create a new client")

    cpdef schedule(self, Lease lease, int64_t due_ns):
        """Renew ``lease`` at ``due_ns`` (monotonic); starts the thread on first use."""
        cdef bint start = False, closed
        with self._mutex:
            closed = self._closed
            if not closed:
                start = self._push_locked(lease, due_ns)
        if closed:
            self.check_open()
        if start:
            self._start_thread()

    cdef bint _push_locked(self, Lease lease, int64_t due_ns) except -1:
        """Caller holds _mutex. Returns True if a thread must be started."""
        cdef bint earliest
        if lease._renew_at_ns:
            self._stale += 1
        lease._renew_at_ns = due_ns
        self._sequence += 1
        earliest = not self._heap or due_ns < <int64_t>self._heap[0][0]
        _heappush(self._heap, (due_ns, self._sequence, lease))
        if self._manual:
            return False
        if self._thread is None:
            self._thread = True  # placeholder under the mutex; replaced by the thread object
            return True
        if earliest:
            self._notify()
        return False

    cdef _start_thread(self):
        thread = threading.Thread(target=self._run, name="fastlease-renewal", daemon=True)
        with self._mutex:
            self._thread = thread
        thread.start()

    cpdef cancel(self, Lease lease):
        cdef list live
        with self._mutex:
            if lease._renew_at_ns:
                lease._renew_at_ns = 0
                self._stale += 1
                if self._stale > 64 and self._stale * 2 > len(self._heap):
                    live = [entry for entry in self._heap if (<Lease>entry[2])._renew_at_ns == entry[0]]
                    heapq.heapify(live)
                    self._heap = live
                    self._stale = 0

    def next_due_ns(self):
        """Due time of the earliest live renewal, or 0 when none is scheduled."""
        with self._mutex:
            while self._heap and (<Lease>self._heap[0][2])._renew_at_ns != self._heap[0][0]:
                _heappop(self._heap)
                self._stale -= 1
            return self._heap[0][0] if self._heap else 0

    cdef Lease _pop_due(self, int64_t now_ns):
        """Caller holds _mutex: pop the next due live entry, or None."""
        cdef Lease lease
        cdef int64_t due_ns
        while self._heap and <int64_t>self._heap[0][0] <= now_ns:
            entry = _heappop(self._heap)
            due_ns = entry[0]
            lease = entry[2]
            if lease._renew_at_ns == due_ns:
                lease._renew_at_ns = 0
                self._late_count += 1
                self._late_total_ns += now_ns - due_ns
                if now_ns - due_ns > self._late_max_ns:
                    self._late_max_ns = now_ns - due_ns
                return lease
            self._stale -= 1
        return None

    def lateness(self):
        """(renewals started, max lateness ns, total lateness ns): how far behind their due times."""
        with self._mutex:
            return (self._late_count, self._late_max_ns, self._late_total_ns)

    def _renew(self, Lease lease, int64_t now_ns):
        """A worker thread: one renewal step, then the next due time back on the heap."""
        self._reschedule(lease, lease.renew_step(now_ns))

    cdef _dispatch(self, Lease lease, int64_t now_ns):
        if self._workers is None:
            from concurrent.futures import ThreadPoolExecutor

            self._workers = ThreadPoolExecutor(RENEWAL_WORKERS, thread_name_prefix="fastlease-renewer")
        try:
            self._workers.submit(self._renew, lease, now_ns)
        except RuntimeError:  # the pool was shut down by close(): leases lapse locally, as documented
            pass

    cdef _reschedule(self, Lease lease, int64_t next_ns):
        if next_ns:
            with self._mutex:
                if not self._closed:
                    self._push_locked(lease, next_ns)

    def run_due(self):
        """Run every renewal due now in the calling thread; returns how many ran (manual clocks)."""
        cdef int ran = 0
        cdef int64_t now_ns
        cdef Lease lease
        while True:
            now_ns = self._clock.monotonic_ns()
            with self._mutex:
                lease = self._pop_due(now_ns)
            if lease is None:
                return ran
            self._reschedule(lease, lease.renew_step(now_ns))
            ran += 1

    def _run(self):
        cdef int64_t now_ns, wait_us, idle_ns = SCHEDULER_IDLE_EXIT_MS * NS_PER_MS
        cdef Lease lease
        cdef int acquired
        cdef bint system = self._clock is SYSTEM_CLOCK
        while True:
            lease = None
            with self._mutex:
                if self._closed:
                    self._thread = None
                    return
                now_ns = c_monotonic_ns() if system else self._clock.monotonic_ns()
                lease = self._pop_due(now_ns)
                if lease is None:
                    if self._heap:
                        wait_us = (<int64_t>self._heap[0][0] - now_ns) // 1000 + 1
                    else:
                        wait_us = idle_ns // 1000
            if lease is not None:
                self._dispatch(lease, now_ns)
                continue
            wait_us = min(wait_us, 3_600_000_000)
            with nogil:
                acquired = PyThread_acquire_lock_timed(self._wake, wait_us, 0)
            with self._mutex:
                if acquired == PY_LOCK_ACQUIRED:
                    self._wake_pending = False
                elif not self._heap and not self._closed:
                    self._thread = None  # idle: exit; the next schedule() starts a new thread
                    return

    def close(self):
        """Stop the thread; held leases stop renewing and lapse locally at their validity."""
        with self._mutex:
            self._closed = True
            self._notify()
            thread = self._thread
        if isinstance(thread, threading.Thread) and thread is not threading.current_thread():
            thread.join(timeout=10)
        if self._workers is not None:
            self._workers.shutdown(wait=False)
