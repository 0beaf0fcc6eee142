# cython: language_level=3, embedsignature=True, freethreading_compatible=True
# cython: boundscheck=False, wraparound=False
"""The native core: only what has to be written in C. The protocol itself is the engine,
``_engine/``, written once and compiled from those same sources.

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
from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_DecodeASCII
from libc.errno cimport errno
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy, strdup
from posix.types cimport pid_t
from posix.unistd cimport getpid

import os

# The CRC-32 of this file as it was compiled, given by setup.py: fastlease._impl compares it with the
# source beside the module and does not use a build that is older than its source.
cdef extern from *:
    """
    #ifndef FASTLEASE_SOURCE_CRC
    #define FASTLEASE_SOURCE_CRC ""
    #endif
    """
    const char *FASTLEASE_SOURCE_CRC

BUILT_FROM = FASTLEASE_SOURCE_CRC.decode("ascii")

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


# ---- the renewal pulse -----------------------------------------------------------------------
# A native thread that never takes the GIL: every interval it writes a pulse frame, and any staged
# frames before it, to the renewal process's pipe (fastlease._renewal_link). It keeps writing while
# another thread of this process holds the GIL for seconds (a long C call), so the renewal process
# knows the holder is alive; it stops when the whole process is stopped (SIGSTOP, a frozen Lambda),
# and it does not exist in a forked child, so the renewal process stops renewing for both.
#
# Frames: u32 length (of what follows), u64 id, payload; id 0 with no payload is a pulse. Writes are
# of whole frames, at most PIPE_BUF bytes each, so a non-blocking write to the pipe is all or nothing
# and a frame is never split: a staged frame that has not been written can still be taken back.
# The thread is C, in _pulse.h; here is what of it Pulse uses.
cdef extern from "_pulse.h":
    ctypedef struct fl_pulse:
        pass
    int FL_HAVE_PULSE
    fl_pulse* fl_pulse_start(int fd, int interval_ms, char** argv, int give_a, int give_b) nogil
    long fl_pulse_child(fl_pulse* p) nogil
    int fl_pulse_stage(fl_pulse* p, unsigned long long id, const char* data, size_t size) nogil
    int fl_pulse_unstage(fl_pulse* p, unsigned long long id) nogil
    unsigned long long fl_pulse_count(fl_pulse* p) nogil
    unsigned long long fl_pulse_reserve_id(fl_pulse* p) nogil
    void fl_pulse_stop(fl_pulse* p) nogil
    void fl_pulse_release(fl_pulse* p) nogil
    void fl_pulse_forget(fl_pulse* p) nogil


@cython.final
cdef class Pulse:
    """The renewal pulse (see above): ``Pulse(fd, interval_ms, argv, give)`` starts the native thread
    on a duplicate of ``fd``; the thread first starts the process ``argv`` (an absolute path first),
    which inherits the two fds of ``give`` (made inheritable; the pulse closes them once it has).
    ``native`` is True: it keeps going while another thread holds the GIL."""

    # Set once by __cinit__; only __dealloc__ drops the reference (and a forked child, at fork, while
    # it has one thread, forgets it): no method can find it freed, or NULL once it was not.
    cdef fl_pulse* _pulse
    cdef pid_t _pid
    cdef readonly dict leases  # registration id -> lease, for the leases registered through register()
    native = True

    def __cinit__(self, int fd, int interval_ms, argv=None, give=(-1, -1)):
        cdef char** c_argv = NULL
        cdef Py_ssize_t i
        cdef bytes arg
        if not FL_HAVE_PULSE:
            raise OSError("the native renewal pulse needs POSIX threads")
        if interval_ms < 1:
            raise ValueError(f"interval_ms must be at least 1, got {interval_ms}")
        if argv is not None:
            args = [os.fsencode(a) for a in argv]
            c_argv = <char**>calloc(len(args) + 1, sizeof(char*))
            if c_argv == NULL:
                raise MemoryError()
            for i in range(len(args)):
                arg = args[i]
                c_argv[i] = strdup(arg)
        self._pulse = fl_pulse_start(fd, interval_ms, c_argv, give[0], give[1])
        if self._pulse == NULL:
            if c_argv != NULL:
                i = 0
                while c_argv[i] != NULL:
                    free(c_argv[i])
                    i += 1
                free(c_argv)
            raise OSError(errno, "could not start the renewal pulse thread")
        self._pid = getpid()
        self.leases = {}

    def register(self, lease, str table, str key, str owner, str version, long long lease_ms, fence,
                 long long mono_ns, long long wall_ns, long long hold_until_ns, long long renew_at_ns,
                 long long store_id):
        """Stage a lease's registration (read by ``_renewal_process._adopt``) and remember the lease:
        its registration id, or 0 if it could not be staged. On every hold's path: no marshal, one C
        call."""
        cdef Py_ssize_t sizes[4]
        cdef const char* parts[4]
        cdef char frame[4096]
        cdef size_t at = 0
        cdef long long numbers[7]
        cdef int i, ok
        cdef unsigned long long frame_id
        if not self._usable():
            return 0
        parts[0] = PyUnicode_AsUTF8AndSize(table, &sizes[0])
        parts[1] = PyUnicode_AsUTF8AndSize(key, &sizes[1])
        parts[2] = PyUnicode_AsUTF8AndSize(owner, &sizes[2])
        parts[3] = PyUnicode_AsUTF8AndSize(version, &sizes[3])
        if sizes[0] + sizes[1] + sizes[2] + sizes[3] + 8 + 56 + 12 > 4096:
            return 0
        numbers[0] = lease_ms
        numbers[1] = -1 if fence is None else <long long>fence
        numbers[2] = mono_ns
        numbers[3] = wall_ns
        numbers[4] = hold_until_ns
        numbers[5] = renew_at_ns
        numbers[6] = store_id
        memcpy(frame, numbers, 56)
        at = 56
        for i in range(4):
            memcpy(frame + at, &sizes[i], 2)  # little-endian u16 (the suite runs on x86-64 and arm64)
            memcpy(frame + at + 2, parts[i], sizes[i])
            at += 2 + sizes[i]
        frame_id = fl_pulse_reserve_id(self._pulse)
        self.leases[frame_id] = lease  # before staging: its first report may come at once
        with nogil:
            ok = fl_pulse_stage(self._pulse, frame_id, frame, at)
        if ok != 0:
            del self.leases[frame_id]
            return 0
        return frame_id

    def take_back(self, unsigned long long frame_id):
        """Unstage a registration not written yet and forget its lease: True if it was not written."""
        cdef int found
        if not self._usable():
            return False
        with nogil:
            found = fl_pulse_unstage(self._pulse, frame_id)
        if found == 1:
            self.leases.pop(frame_id, None)
            return True
        return False

    @property
    def child(self):
        """The started process's id (also after close()); 0 while not started yet, or negative
        (-errno) if it failed."""
        return fl_pulse_child(self._pulse) if self._usable() else 0

    cdef bint _usable(self):
        # In a forked child the thread does not exist and its mutex may be held: never touch it.
        return self._pulse != NULL and self._pid == getpid()

    def stage(self, unsigned long long frame_id, bytes payload):
        """Queue a frame for the next pulse; False if it cannot be (too big, the pulse stopped)."""
        cdef const char* data = payload
        cdef size_t size = len(payload)
        cdef int ok
        if frame_id == 0 or not self._usable():
            return False
        with nogil:
            ok = fl_pulse_stage(self._pulse, frame_id, data, size)
        return ok == 0

    def unstage(self, unsigned long long frame_id):
        """Take a staged frame back: True if it had not been written yet (and now never will be)."""
        cdef int found
        if not self._usable():
            return False
        with nogil:
            found = fl_pulse_unstage(self._pulse, frame_id)
        return found == 1

    @property
    def pulses(self):
        """Pulse frames written so far."""
        return fl_pulse_count(self._pulse) if self._usable() else 0

    def forget_in_child(self):
        """In a forked child (from an at-fork handler, while the child has one thread): close this
        process's copy of the pipe, and never use the pulse again."""
        if self._pulse != NULL and self._pid != getpid():
            fl_pulse_forget(self._pulse)
            self._pulse = NULL

    def close(self):
        """Stop the thread (within one interval) and close the pipe; staged frames are dropped. Safe
        from any thread, during any other method, and more than once; afterwards nothing more is
        staged or written."""
        if self._usable():
            with nogil:
                fl_pulse_stop(self._pulse)

    def __dealloc__(self):
        if self._pulse != NULL and self._pid == getpid():
            fl_pulse_release(self._pulse)
