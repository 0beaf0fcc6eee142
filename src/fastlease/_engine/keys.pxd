# Augmenting declarations for keys.py: cythonize reads them beside the source and compiles the same
# code with C layouts and types. The interpreted engine never sees this file, so nothing here may change
# behaviour: only attribute layouts, argument and local types, and method dispatch.

cimport cython
from libc.stdint cimport int64_t

cdef extern from "source_crc.h":  # BUILT_FROM in keys.py: the CRC-32 of the source, from setup.py
    const char *FASTLEASE_SOURCE_CRC


@cython.locals(size=Py_ssize_t)
cpdef str check_key(object key)
cpdef check_row(object row, str key)
cpdef check_holder_kind(str owner, str kind, str key)
cpdef str holder_kind(str owner)


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
