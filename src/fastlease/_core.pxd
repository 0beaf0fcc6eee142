# The native core's C-level interface, for the compiled engine (_engine.pxd cimports Mutex).
cimport cython


@cython.final
cdef class Mutex:
    cdef cython.pymutex _mutex

    cpdef acquire(self)
    cpdef release(self)
