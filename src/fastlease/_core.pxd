# The native core's C-level interface, for the compiled engine (the _engine/*.pxd files cimport Mutex).
cimport cython


@cython.final
cdef class Mutex:
    cdef cython.pymutex _mutex

    cpdef acquire(self)
    cpdef release(self)
