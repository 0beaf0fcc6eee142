# Augmenting declarations for scheduler.py: cythonize reads them beside the source and compiles the same
# code with C layouts and types. The interpreted engine never sees this file, so nothing here may change
# behaviour: only attribute layouts, argument and local types, and method dispatch.
# Every integer typed int64_t holds nanoseconds or milliseconds, as its name says; all fit in 63 bits.

cimport cython
from libc.stdint cimport int64_t

from fastlease._core cimport Mutex

cdef extern from "source_crc.h":  # BUILT_FROM in scheduler.py: the CRC-32 of the source, from setup.py
    const char *FASTLEASE_SOURCE_CRC


cdef class Renewable:
    # Read and written by the scheduler under its lock; public because heap entries are untyped tuples.
    cdef public int64_t _renew_at_ns
    cdef public bint _renewing


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
    cpdef schedule(self, Renewable lease, int64_t due_ns)
    @cython.locals(earliest=bint)
    cdef _push_locked(self, Renewable lease, int64_t due_ns)
    @cython.locals(other=Renewable)
    cpdef bint holds(self, tuple cache_key, Renewable besides) except -1
    cpdef bint cancel(self, Renewable lease) except -1
    @cython.locals(due_ns=int64_t, late_ns=int64_t)
    cdef Renewable _pop_due(self, int64_t now_ns)
    cdef _reschedule(self, Renewable lease, int64_t next_ns)
