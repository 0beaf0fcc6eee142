# cython: language_level=3, embedsignature=True, freethreading_compatible=True
# cython: boundscheck=False, wraparound=False
"""The native core: only what has to be written in C. The protocol itself is the engine,
``_engine.py``, written once and compiled from that same source.

* ``Mutex``: the lock of the engine's short critical sections (a lease's state, the observation
  cache, the release signals). On ``pymutex``, taking and releasing it from the compiled engine are
  two C calls; a ``threading.Lock`` costs a Python method call with argument parsing each way, on
  every hold's path. ``_core_fallback.Mutex`` is ``threading.Lock``.
* Owner and version tokens: UUID4 strings formatted in C from a pooled ``os.urandom`` buffer. Every
  acquisition and every renewal makes one, so this is on the hot path; ``_core_fallback.py`` is the
  small pure-Python equivalent the interpreted engine uses. The pool is emptied in a forked child,
  so parent and child never share randomness.
"""

cimport cython
from cpython.unicode cimport PyUnicode_DecodeASCII
from libc.string cimport memcpy

import os

@cython.final
cdef class Mutex:
    """A non-reentrant lock for short critical sections; ``with mutex:`` or acquire()/release()."""

    cpdef acquire(self):
        """Take the lock, waiting (with the GIL released) while another thread holds it."""
        self._mutex.acquire()
        return True

    cpdef release(self):
        """Release the lock, which the caller holds."""
        self._mutex.release()

    def __enter__(self):
        self._mutex.acquire()
        return self

    def __exit__(self, *exc_info):
        self._mutex.release()


cdef unsigned char _pool[4096]
cdef Py_ssize_t _pool_left = 0
cdef cython.pymutex _pool_mutex
cdef const char* _HEX = b"0123456789abcdef"


cdef str _new_token():
    global _pool_left
    cdef unsigned char raw[16]
    cdef char text[36]
    cdef bytes fresh
    cdef int i, j = 0
    cdef bint taken = False
    while not taken:
        with _pool_mutex:
            if _pool_left >= 16:
                _pool_left -= 16
                memcpy(raw, _pool + _pool_left, 16)
                taken = True
        if not taken:
            fresh = os.urandom(4096)  # outside the mutex: a Python call may switch threads
            with _pool_mutex:
                if _pool_left < 16:
                    memcpy(_pool, <const char*>fresh, 4096)
                    _pool_left = 4096
    raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
    for i in range(16):
        if i == 4 or i == 6 or i == 8 or i == 10:
            text[j] = b'-'
            j += 1
        text[j] = _HEX[raw[i] >> 4]
        text[j + 1] = _HEX[raw[i] & 0x0F]
        j += 2
    return PyUnicode_DecodeASCII(text, 36, NULL)


def new_token():
    """A random UUID4 string: used for every owner and every version."""
    return _new_token()


def _hold_pool_for_fork():
    # Held across fork() so that no other thread can be inside the pool when the process is copied:
    # a child must neither inherit a locked mutex nor the parent's unused random bytes.
    _pool_mutex.acquire()


def _resume_pool_in_parent():
    _pool_mutex.release()


def _empty_pool_in_child():
    global _pool_left
    _pool_left = 0
    _pool_mutex.release()


os.register_at_fork(
    before=_hold_pool_for_fork, after_in_parent=_resume_pool_in_parent, after_in_child=_empty_pool_in_child
)
