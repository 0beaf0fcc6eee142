# Augmenting declarations for _engine.py: cythonize reads them beside the source and compiles the
# same code with C layouts and types. The interpreted engine never sees this file, so nothing here
# may change behaviour: only attribute layouts, argument and local types, and method dispatch.
# Every integer typed int64_t holds nanoseconds or milliseconds, as its name says; all fit in 63 bits.

cimport cython
from libc.stdint cimport int64_t

from fastlease._core cimport Mutex

# The CRC-32 of _engine.py as it was compiled, given by setup.py (BUILT_FROM in _engine.py).
cdef extern from *:
    """
    #ifndef FASTLEASE_SOURCE_CRC
    #define FASTLEASE_SOURCE_CRC ""
    #endif
    """
    const char *FASTLEASE_SOURCE_CRC


cdef int64_t _NS_PER_MS

cpdef int64_t validity_ns(int64_t lease_ms)
cpdef int64_t renew_interval_ns(int64_t lease_ms)
cpdef int64_t renew_retry_ns(int64_t lease_ms)
cpdef int64_t request_timeout_ns(int64_t lease_ms)
cpdef int64_t cleanup_budget_ns(int64_t lease_ms)
cpdef int64_t next_backoff_ns(int64_t backoff_ns)

@cython.locals(size=Py_ssize_t)
cpdef str check_key(object key)
cpdef check_not_forked(long pid)
cpdef check_row(object row, str key)


@cython.final
cdef class KeyTemplate:
    cdef readonly str template
    cdef readonly tuple names
    cdef tuple _literals

    @cython.locals(i=Py_ssize_t, n=Py_ssize_t, end=Py_ssize_t)
    cpdef str resolve(self, tuple values)


@cython.final
cdef class CallKey:
    cdef readonly KeyTemplate template
    cdef object _binder

    cpdef str resolve(self, tuple args, dict kwargs)


@cython.final
cdef class ObservationCache:
    cdef readonly Py_ssize_t capacity
    cdef dict _entries
    cdef Mutex _mutex

    cpdef int64_t observe(self, tuple cache_key, str owner, str version, int64_t lease_ms, int64_t now_ns) except? -1
    cpdef forget(self, tuple cache_key)


@cython.final
cdef class ReleaseSignals:
    cdef dict _queues
    cdef Mutex _mutex
    cdef dict _contended

    cpdef wait(self, object clock, tuple cache_key, object ticket, double timeout_s)
    cpdef leave(self, tuple cache_key, object ticket, bint acquired)
    cpdef notify(self, tuple cache_key)
    cpdef released(self, tuple cache_key, bint others_waiting, int64_t now_ns)
    cpdef bint should_yield(self, tuple cache_key, int64_t now_ns) except -1


@cython.final
cdef class Lease:
    cdef readonly str table
    cdef readonly str key
    cdef readonly int64_t lease_ms
    cdef readonly int64_t wait_ms
    cdef readonly int64_t max_hold_ms
    cdef object _on_lost
    cdef object _lost_event
    cdef int64_t _hold_until_ns
    cdef bint _renewal_stopped
    cdef long _pid
    cdef object _client
    cdef object _store
    cdef object _clock
    cdef object _mono
    cdef object _wall
    cdef object _observations
    cdef RenewalScheduler _scheduler
    cdef ReleaseSignals _signals
    cdef tuple _cache_key
    cdef Mutex _mutex
    cdef readonly int state
    cdef readonly object lost_cause
    cdef readonly object owner
    cdef readonly object version
    cdef readonly object fencing_token
    cdef int64_t _valid_until_mono_ns
    cdef int64_t _wall_stamp_ns
    cdef int64_t _valid_until_wall_ns
    cdef object _pending
    cdef object _renew_pending
    cdef int _renew_errors
    # Read and written by the scheduler under its lock; public because heap entries are untyped tuples.
    cdef public int64_t _renew_at_ns
    cdef public bint _renewing
    cdef int64_t _link_id
    cdef tuple _delegation_base
    cdef object _link
    cdef object _listener
    cdef object _observer
    cdef object _observed
    cdef int64_t _hint_ns
    cdef int64_t _seen_unchanged_ns, _seen_lease_ms
    cdef object _first_seen, _last_seen
    cdef bint _row_seen
    cdef int64_t _acquire_start_ns
    cdef bint _others_waiting
    cdef object _marked_owner
    cdef bint _cancelled
    cdef object _ticket
    cdef object _feed
    cdef object _watch
    cdef int64_t _writes, _reads, _conditional_failures, _request_failures
    cdef int64_t _wait_timeouts, _cleanup_failures, _wait_ns
    cdef int64_t _renew_writes, _renew_reads, _renew_conditional_failures, _renew_request_failures
    cdef int64_t _renewals
    cdef double _rcu, _wcu

    cdef _bind(self, Engine engine)
    cpdef add_capacity(self, double rcu, double wcu)
    cpdef check_process(self)
    cdef double _timeout_s(self, int64_t deadline_ns, int64_t now_ns) except? -1.0
    cdef bint _valid_at(self, int64_t mono_ns, int64_t wall_ns) noexcept
    @cython.locals(span=int64_t)
    cdef void _set_validity(self, int64_t mono_ns, int64_t wall_ns) noexcept
    cdef bint _mark_lost(self, str cause) except -1
    cdef str _lapse_cause(self)
    cdef _announce_lost(self, str cause)
    cdef _wait_turn(self, ReleaseSignals signals, int64_t delay_ns, bint after_attempt)
    @cython.locals(state=int)
    cdef _fail_acquisition(self, int64_t start_ns, object error)
    cdef _mark_waiting(self, str owner, str version, int64_t deadline_ns)
    cdef object _put_or_read(self, int64_t deadline_ns)
    @cython.locals(now_ns=int64_t)
    cdef object _read(self, int64_t deadline_ns)
    cdef bint _put(self, int64_t deadline_ns) except -1
    cdef bint _take_over(self, str seen_owner, str seen_version, int64_t deadline_ns) except -1
    cdef bint _reconcile_or_keep_pending(self, int64_t deadline_ns) except -1
    cdef object _reconcile_acquisition(self, int64_t deadline_ns)
    @cython.locals(start_ns=int64_t, deadline_ns=int64_t, backoff_ns=int64_t, delay_ns=int64_t,
                   remaining_ns=int64_t, courtesy_ns=int64_t, acquired=bint, reached=bint, signals=ReleaseSignals)
    cpdef acquire(self)
    @cython.locals(now_ns=int64_t, remaining_ns=int64_t, seen_ns=int64_t, stored_lease_ms=int64_t)
    cdef bint _attempt(self, int64_t deadline_ns) except -1
    @cython.locals(mono_ns=int64_t, wall_ns=int64_t, timeout_s=double)
    cdef bint _acquisition_write(self, int64_t deadline_ns, object seen_owner, object seen_version) except -1
    cdef bint _confirm(self, str owner, str version, int64_t mono_ns, int64_t wall_ns, object fence) except -1
    @cython.locals(deadline_ns=int64_t, retry_ns=int64_t, mono_ns=int64_t, wall_ns=int64_t, valid=bint)
    cdef int64_t _renew_step(self, int64_t now_ns) except? -1
    @cython.locals(lapsed=bint)
    cdef int64_t _confirm_renewal(self, object old_version, str new_version, int64_t mono_ns, int64_t wall_ns) except? -1
    cdef _hand_back(self, int64_t mono_ns, int64_t wall_ns)
    cdef void _count_delegated_requests(self, tuple counters)
    @cython.locals(link_id=int64_t)
    cpdef _end_delegation(self)
    @cython.locals(budget_ns=int64_t, deleted=bint, lapsed=bint, synced=bint)
    cpdef release(self)
    cdef _hold_ended(self, object error)
    cdef int64_t _pause_before_retry(self, int64_t backoff_ns, int64_t deadline_ns) except? -1
    @cython.locals(deadline_ns=int64_t, backoff_ns=int64_t, now_ns=int64_t, ambiguous=bint)
    cdef bint _delete_owned(self, object owner, int64_t budget_ns, bint raise_on_failure=*) except -1


@cython.final
cdef class RenewalScheduler:
    cdef object _clock
    cdef list _heap
    cdef int64_t _sequence
    cdef Py_ssize_t _stale
    cdef Mutex _mutex
    cdef object _wake
    cdef object _thread
    cdef object _workers
    cdef bint _closed
    cdef bint _manual
    cdef int64_t _late_count, _late_max_ns, _late_total_ns

    cpdef check_open(self)
    cpdef schedule(self, Lease lease, int64_t due_ns)
    @cython.locals(earliest=bint)
    cdef _push_locked(self, Lease lease, int64_t due_ns)
    @cython.locals(other=Lease)
    cpdef bint holds(self, tuple cache_key, Lease besides) except -1
    cpdef bint cancel(self, Lease lease) except -1
    @cython.locals(due_ns=int64_t, late_ns=int64_t)
    cdef Lease _pop_due(self, int64_t now_ns)
    cdef _reschedule(self, Lease lease, int64_t next_ns)


@cython.final
cdef class Engine:
    cdef readonly long pid
    cdef readonly object store
    cdef readonly object clock
    cdef readonly object observations
    cdef readonly RenewalScheduler scheduler
    cdef readonly ReleaseSignals signals
    cdef public object release_feed
    cdef public object link
    cdef public object renewal_listener
    cdef public object observer
