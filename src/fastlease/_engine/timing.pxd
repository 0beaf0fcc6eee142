# Augmenting declarations for timing.py: cythonize reads them beside the source and compiles the same
# code with C layouts and types. The interpreted engine never sees this file, so nothing here may change
# behaviour: only attribute layouts, argument and local types, and method dispatch.
# Every integer typed int64_t holds nanoseconds or milliseconds, as its name says; all fit in 63 bits.

cimport cython
from libc.stdint cimport int64_t

cdef extern from "source_crc.h":  # BUILT_FROM in timing.py: the CRC-32 of the source, from setup.py
    const char *FASTLEASE_SOURCE_CRC


cdef int64_t _NS_PER_MS

cpdef int64_t validity_ns(int64_t lease_ms)
cpdef int64_t renew_interval_ns(int64_t lease_ms)
cpdef int64_t renew_retry_ns(int64_t lease_ms)
cpdef int64_t request_timeout_ns(int64_t lease_ms)
cpdef int64_t cleanup_budget_ns(int64_t lease_ms)
cpdef int64_t next_backoff_ns(int64_t backoff_ns)
cpdef check_lease_arguments(object lease_ms, object wait_ms, object max_hold_ms, object on_lost)
