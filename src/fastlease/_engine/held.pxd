# Augmenting declarations for held.py: cythonize reads them beside the source and compiles the same
# code with C layouts and types. The interpreted engine never sees this file, so nothing here may change
# behaviour: only attribute layouts, argument and local types, and method dispatch.
# Every integer typed int64_t holds nanoseconds or milliseconds, as its name says; all fit in 63 bits.

cimport cython
from libc.stdint cimport int64_t

from fastlease._core cimport Mutex
from fastlease._engine.engine cimport Engine, check_not_forked
from fastlease._engine.keys cimport check_key
from fastlease._engine.scheduler cimport Renewable, RenewalScheduler
from fastlease._engine.contention cimport ReleaseSignals
from fastlease._engine.timing cimport (check_lease_arguments, cleanup_budget_ns, next_backoff_ns,
                                      renew_interval_ns, renew_retry_ns, request_timeout_ns, validity_ns)

cdef extern from "source_crc.h":  # BUILT_FROM in held.py: the CRC-32 of the source, from setup.py
    const char *FASTLEASE_SOURCE_CRC


cdef int64_t _NS_PER_MS





cdef class HeldLease(Renewable):
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
    cdef tuple _signal_key
    cdef str _kind
    cdef Mutex _mutex
    cdef readonly int state
    cdef readonly object lost_cause
    cdef readonly object owner
    cdef public str owner_prefix
    cdef readonly object version
    cdef readonly object fencing_token
    cdef int64_t _valid_until_mono_ns
    cdef int64_t _wall_stamp_ns
    cdef int64_t _valid_until_wall_ns
    cdef object _pending
    cdef object _renew_pending
    cdef int _renew_errors
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
    cdef object _line
    cdef object _line_key
    cdef object _freed_key
    cdef object _offer_owner
    cdef tuple _offers
    cdef object _handed
    cdef object _waiter
    cdef bint _turn
    cdef int64_t _writes, _reads, _conditional_failures, _request_failures
    cdef int64_t _wait_timeouts, _cleanup_failures, _wait_ns
    cdef int64_t _renew_writes, _renew_reads, _renew_conditional_failures, _renew_request_failures
    cdef int64_t _renewals
    cdef double _rcu, _wcu

    cdef _init_ownership(self)
    cdef _init_renewal(self)
    cdef _init_waiting(self)
    cdef _init_counters(self)
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
    @cython.locals(deadline_ns=int64_t, retry_ns=int64_t, valid=bint)
    cdef int64_t _renew_step(self, int64_t now_ns) except? -1
    @cython.locals(mono_ns=int64_t, wall_ns=int64_t)
    cdef int64_t _write_renewal(self, str owner, str version, int64_t deadline_ns, int64_t retry_ns) except? -1
    @cython.locals(lapsed=bint)
    cdef int64_t _confirm_renewal(self, object old_version, str new_version, int64_t mono_ns, int64_t wall_ns) except? -1
    cdef _hand_back(self, int64_t mono_ns, int64_t wall_ns, int64_t renew_at_ns)
    cdef void _count_delegated_requests(self, tuple counters)
    @cython.locals(link_id=int64_t)
    cpdef _end_delegation(self, bint wait=*)
