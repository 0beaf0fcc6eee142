# Augmenting declarations for slots.py: cythonize reads them beside the source and compiles the same
# code with C layouts and types. The interpreted engine never sees this file, so nothing here may change
# behaviour: only attribute layouts, argument and local types, and method dispatch.

cimport cython
from libc.stdint cimport int64_t

from fastlease._engine.keys cimport check_key
from fastlease._engine.contention cimport ReleaseSignals
from fastlease._engine.lease cimport Lease

cdef extern from "source_crc.h":  # BUILT_FROM in slots.py: the CRC-32 of the source, from setup.py
    const char *FASTLEASE_SOURCE_CRC


cdef int64_t _NS_PER_MS


# Not final: Cython refuses a final class that overrides an inherited cdef method.
cdef class SlotLease(Lease):
    cdef readonly str semaphore_key
    cdef readonly int limit
    cdef readonly int slot
    cdef tuple _slot_keys
    cdef list _slots_seen
    cdef list _slot_watches

    cpdef acquire(self)
    cdef _wait_turn(self, ReleaseSignals signals, int64_t delay_ns, bint after_attempt)

    @cython.locals(first=int, slot=int, hint_ns=int64_t)
    cdef bint _attempt(self, int64_t deadline_ns) except -1
    cdef bint _attempt_in_line(self, object freed, int64_t deadline_ns) except -1
    @cython.locals(now_ns=int64_t, free=int, slot=int, hint_ns=int64_t, poll_ns=int64_t)
    cdef bint _attempt_every_slot(self, int64_t deadline_ns) except -1
    cdef _aim(self, int slot)
    cdef object _wait_ran_out(self, object last_error, bint reached)
