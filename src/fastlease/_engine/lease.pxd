# Augmenting declarations for lease.py: cythonize reads them beside the source and compiles the same
# code with C layouts and types. The interpreted engine never sees this file, so nothing here may change
# behaviour: only attribute layouts, argument and local types, and method dispatch.
# Every integer typed int64_t holds nanoseconds or milliseconds, as its name says; all fit in 63 bits.

cimport cython
from libc.stdint cimport int64_t

from fastlease._engine.waiting cimport WaitingLease
from fastlease._engine.keys cimport check_key, check_row
from fastlease._engine.contention cimport ReleaseSignals
from fastlease._engine.timing cimport (cleanup_budget_ns, next_backoff_ns, renew_interval_ns, renew_retry_ns,
                                      request_timeout_ns, validity_ns)

cdef extern from "source_crc.h":  # BUILT_FROM in lease.py: the CRC-32 of the source, from setup.py
    const char *FASTLEASE_SOURCE_CRC


cdef int64_t _NS_PER_MS



# Not final: slots.SlotLease (a semaphore's acquisition) overrides _attempt (and WaitingLease's _wait_turn and
# _wait_ran_out); every other C method is final, so that calls to it stay direct (not through the class's table of methods).
cdef class Lease(WaitingLease):
    @cython.locals(state=int)
    @cython.final
    cdef _fail_acquisition(self, int64_t start_ns, object error)
    @cython.final
    cdef object _put_or_read(self, int64_t deadline_ns)
    @cython.final
    cdef bint _put_settled(self, int64_t deadline_ns) except -1
    @cython.locals(now_ns=int64_t)
    @cython.final
    cdef object _read(self, int64_t deadline_ns, bint in_line=*)
    @cython.final
    cdef bint _put(self, int64_t deadline_ns) except -1
    @cython.final
    cdef bint _take_over(self, str seen_owner, str seen_version, int64_t deadline_ns) except -1
    @cython.final
    cdef bint _reconcile_or_keep_pending(self, int64_t deadline_ns) except -1
    @cython.final
    cdef object _reconcile_acquisition(self, int64_t deadline_ns)
    @cython.locals(start_ns=int64_t, deadline_ns=int64_t, backoff_ns=int64_t, delay_ns=int64_t,
                   remaining_ns=int64_t, acquired=bint, reached=bint, signals=ReleaseSignals, poll_ms=int64_t)
    cpdef acquire(self)
    @cython.final
    cdef _begin_acquisition(self)
    @cython.locals(turn=bint)
    cdef bint _attempt(self, int64_t deadline_ns) except -1
    @cython.locals(now_ns=int64_t, remaining_ns=int64_t, seen_ns=int64_t, stored_lease_ms=int64_t)
    @cython.final
    cdef bint _contend(self, object row, int64_t deadline_ns) except -1
    @cython.locals(mono_ns=int64_t, wall_ns=int64_t, timeout_s=double)
    @cython.final
    cdef bint _acquisition_write(self, int64_t deadline_ns, object seen_owner, object seen_version) except -1
    @cython.locals(counted_mono_ns=int64_t, counted_wall_ns=int64_t, renew_at_ns=int64_t)
    @cython.final
    cdef bint _confirm(self, str owner, str version, int64_t mono_ns, int64_t wall_ns, object fence,
                       int64_t shift_ns=*) except -1
    @cython.final
    cdef tuple _new_offer(self, int64_t mono_ns)
    @cython.locals(mono_ns=int64_t, wall_ns=int64_t, shift_ns=int64_t)
    @cython.final
    cdef bint _take_handed(self, str version, object fence) except -1
    @cython.locals(budget_ns=int64_t, deleted=bint)
    cpdef release(self)
    @cython.locals(lapsed=bint, synced=bint)
    @cython.final
    cdef bint _begin_release(self) except -1
    @cython.final
    cdef object _loss_at_release(self, bint deleted)
    @cython.final
    cdef _hold_ended(self, object error)
    @cython.final
    cdef int64_t _pause_before_retry(self, int64_t backoff_ns, int64_t deadline_ns) except? -1
    @cython.final
    cdef bint _delete_owned(self, object owner, int64_t budget_ns, bint raise_on_failure=*) except -1
    @cython.locals(backoff_ns=int64_t, now_ns=int64_t, ambiguous=bint, applied=bint, landed_now=bint, timeout_s=double)
    @cython.final
    cdef object _write_reconciled(self, object owner, object write, object landed, int64_t deadline_ns)
