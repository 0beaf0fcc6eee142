# Augmenting declarations for waiting.py: cythonize reads them beside the source and compiles the same
# code with C layouts and types. The interpreted engine never sees this file, so nothing here may change
# behaviour: only attribute layouts, argument and local types, and method dispatch.
# Every integer typed int64_t holds nanoseconds or milliseconds, as its name says; all fit in 63 bits.

cimport cython
from libc.stdint cimport int64_t

from fastlease._engine.held cimport HeldLease
from fastlease._engine.contention cimport ReleaseSignals
from fastlease._engine.timing cimport request_timeout_ns

cdef extern from "source_crc.h":  # BUILT_FROM in waiting.py: the CRC-32 of the source, from setup.py
    const char *FASTLEASE_SOURCE_CRC


cdef int64_t _NS_PER_MS
cdef int64_t _LONGEST_POLL_NS


# Not final: slots.SlotLease overrides _wait_turn and _wait_ran_out; every other C method is final.
cdef class WaitingLease(HeldLease):
    cdef _wait_turn(self, ReleaseSignals signals, int64_t delay_ns, bint after_attempt)
    @cython.final
    cdef _prepare_a_place(self, ReleaseSignals signals, int64_t start_ns)
    @cython.locals(courtesy_ns=int64_t)
    @cython.final
    cdef _let_a_waiter_go_first(self, ReleaseSignals signals)
    cdef object _wait_ran_out(self, object last_error, bint reached)
    @cython.final
    cdef _mark_waiting(self, str owner, str version, int64_t deadline_ns)
    @cython.final
    cdef _leave_line(self)
    @cython.final
    cdef _end_wait(self, ReleaseSignals signals, bint acquired)
    @cython.final
    cdef int64_t _poll_ms(self) except -1
