# Augmenting declarations for contention.py: cythonize reads them beside the source and compiles the same
# code with C layouts and types. The interpreted engine never sees this file, so nothing here may change
# behaviour: only attribute layouts, argument and local types, and method dispatch.
# Every integer typed int64_t holds nanoseconds or milliseconds, as its name says; all fit in 63 bits.

cimport cython
from libc.stdint cimport int64_t

from fastlease._core cimport Mutex

cdef extern from "source_crc.h":  # BUILT_FROM in contention.py: the CRC-32 of the source, from setup.py
    const char *FASTLEASE_SOURCE_CRC


cdef int64_t _NS_PER_MS

cdef _remember(dict releases, tuple cache_key, int64_t now_ns)


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
    cdef dict _handed

    cpdef wait(self, object clock, tuple cache_key, object ticket, double timeout_s, object reader=*)
    cpdef leave(self, tuple cache_key, object ticket, bint acquired)
    cpdef notify(self, tuple cache_key)
    cpdef released(self, tuple cache_key, bint others_waiting, int64_t now_ns)
    cpdef handed_over(self, tuple cache_key, int64_t now_ns)
    cpdef bint look_first(self, tuple cache_key, int64_t now_ns) except -1
    cpdef bint should_yield(self, tuple cache_key, int64_t now_ns) except -1
