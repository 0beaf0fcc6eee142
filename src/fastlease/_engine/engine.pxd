# Augmenting declarations for engine.py: cythonize reads them beside the source and compiles the same
# code with C layouts and types. The interpreted engine never sees this file, so nothing here may change
# behaviour: only attribute layouts, argument and local types, and method dispatch.

cimport cython
from libc.stdint cimport int64_t

from fastlease._engine.contention cimport ObservationCache, ReleaseSignals
from fastlease._engine.scheduler cimport RenewalScheduler

cdef extern from "source_crc.h":  # BUILT_FROM in engine.py: the CRC-32 of the source, from setup.py
    const char *FASTLEASE_SOURCE_CRC


cpdef check_not_forked(long pid)


@cython.final
cdef class Engine:
    cdef readonly long pid
    cdef readonly object store
    cdef readonly object clock
    cdef readonly object observations
    cdef readonly RenewalScheduler scheduler
    cdef readonly ReleaseSignals signals
    cdef public object release_feed
    cdef public object line
    cdef public object link
    cdef public object renewal_listener
    cdef public object observer
