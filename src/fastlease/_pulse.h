/* The renewal pulse's native thread, in C because it must never take the GIL: _core.pyx declares what
 * it uses of this file (``cdef extern from "_pulse.h"``) and wraps it in ``Pulse``; see the comment there
 * for what the thread does and the frames it writes. setup.py compiles this file into _core and counts
 * it in _core's source CRC, so a change here alone also marks a build stale (fastlease/_impl.py). */
#ifndef FASTLEASE_PULSE_H
#define FASTLEASE_PULSE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "pythread.h"
#ifndef _WIN32
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <time.h>
#include <unistd.h>
#ifdef __APPLE__
#include <crt_externs.h>
#define environ (*_NSGetEnviron())   /* a shared library on macOS cannot link environ itself */
#else
extern char **environ;
#endif
#define FL_HAVE_PULSE 1
#else
#define FL_HAVE_PULSE 0
#endif

#define FL_FRAME_HEAD 12
#define FL_WRITE_MAX 4096
#define FL_BUFFER_MAX (16u << 20)

/* Ownership: the struct has two references, the Python object's (dropped only by its
   __dealloc__, so never while one of its methods runs) and the thread's (dropped when it exits).
   Each is dropped under the struct's mutex, and whoever drops the last one frees the struct.
   close() only sets `stop` and closes the pipe, under that mutex: every method, whichever thread
   calls it and whenever close() or the thread's exit happen, finds the struct allocated. */
typedef struct {
#if FL_HAVE_PULSE
    pthread_mutex_t mutex;
#endif
    int fd;              /* -1 once closed */
    int interval_ms;
    int refs;            /* the Python object and the thread; the last one frees */
    int stop;
    uint64_t next_id;    /* the last frame id handed out (fl_pulse_reserve_id) */
    uint64_t pulses;     /* pulse frames written */
    char *buf;           /* staged frames, whole frames from offset 0 */
    size_t len, cap;
    char **argv;         /* the process the thread starts first (NULL: none), and the fds it gets */
    int give[2];
    long child;          /* its pid once started; -errno if it could not be; 0 before */
} fl_pulse;

static void fl_put_head(char *at, uint32_t len, uint64_t id) {
    memcpy(at, &len, 4);
    memcpy(at + 4, &id, 8);
}

static int fl_reserve(fl_pulse *p, size_t more) {
    size_t want = p->len + more, cap = p->cap ? p->cap : 1024;
    char *grown;
    if (want > FL_BUFFER_MAX) return -1;
    while (cap < want) cap *= 2;
    if (cap == p->cap) return 0;
    grown = (char *)realloc(p->buf, cap);
    if (!grown) return -1;
    p->buf = grown;
    p->cap = cap;
    return 0;
}

#if FL_HAVE_PULSE
static void fl_unref_locked_and_unlock(fl_pulse *p) {
    int last = --p->refs == 0;
    pthread_mutex_unlock(&p->mutex);
    if (last) {
        int i;
        if (p->argv) {                /* stopped before it started the process */
            for (i = 0; i < 2; i++) if (p->give[i] >= 0) close(p->give[i]);
            for (i = 0; p->argv[i]; i++) free(p->argv[i]);
            free(p->argv);
        }
        pthread_mutex_destroy(&p->mutex);
        if (p->fd >= 0) close(p->fd);
        free(p->buf);
        free(p);
    }
}

/* Under the mutex: stop, drop what is staged, close the pipe (the renewal process sees EOF). */
static void fl_stop_locked(fl_pulse *p) {
    p->stop = 1;
    p->len = 0;
    if (p->fd >= 0) {
        close(p->fd);
        p->fd = -1;
    }
}

/* Under the mutex: write whole staged frames while the pipe takes them. */
static void fl_flush_locked(fl_pulse *p) {
    size_t done = 0;
    if (p->fd < 0) return;
    while (done < p->len) {
        size_t chunk = 0;
        ssize_t wrote;
        while (done + chunk < p->len) {
            uint32_t flen;
            memcpy(&flen, p->buf + done + chunk, 4);
            if (chunk && chunk + 4 + flen > FL_WRITE_MAX) break;
            chunk += 4 + flen;
        }
        wrote = write(p->fd, p->buf + done, chunk);
        if (wrote != (ssize_t)chunk) break;   /* full (EAGAIN) or closed: keep them staged */
        done += chunk;
    }
    if (done) {
        memmove(p->buf, p->buf + done, p->len - done);
        p->len -= done;
    }
}

/* Start the renewal process from this thread: no GIL needed, so it starts even when the thread
   that acquired the first lease goes straight into a long GIL-holding call. The two fds were
   made inheritable for it, and are closed here once it has them. */
static void fl_spawn_locked(fl_pulse *p) {
    posix_spawnattr_t attr;
    posix_spawn_file_actions_t actions;
    sigset_t none;
    pid_t pid;
    int rc, i;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);  /* not the holder's stdin */
    posix_spawnattr_init(&attr);
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&attr, &none);  /* not this thread's all-blocked mask */
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
    rc = posix_spawn(&pid, p->argv[0], &actions, &attr, p->argv, environ);
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&actions);
    p->child = rc == 0 ? (long)pid : -(long)rc;
    for (i = 0; i < 2; i++) if (p->give[i] >= 0) close(p->give[i]);
    for (i = 0; p->argv[i]; i++) free(p->argv[i]);
    free(p->argv);
    p->argv = NULL;
}

/* Started by PyThread_start_new_thread (CPython's own thread start, not pthread_create: wheels
   then need no glibc symbol newer than manylinux_2_28); it never takes the GIL. */
static void fl_pulse_main(void *arg) {
    fl_pulse *p = (fl_pulse *)arg;
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, NULL);   /* this thread's mask on Linux: signals are the main thread's */
    pthread_mutex_lock(&p->mutex);
    if (p->argv && !p->stop) fl_spawn_locked(p);
    pthread_mutex_unlock(&p->mutex);
    for (;;) {
        struct timespec pause;
        pthread_mutex_lock(&p->mutex);
        if (p->stop) break;
        if (p->len == 0 && fl_reserve(p, FL_FRAME_HEAD) == 0) {
            /* a pulse only when nothing is waiting: a blocked pipe gets no pile of pulses */
            fl_put_head(p->buf, 8, 0);
            p->len = FL_FRAME_HEAD;
            fl_flush_locked(p);
            if (p->len == 0) p->pulses++;
            else p->len = 0;                  /* not written: drop it */
        } else {
            fl_flush_locked(p);
        }
        pthread_mutex_unlock(&p->mutex);
        pause.tv_sec = p->interval_ms / 1000;
        pause.tv_nsec = (long)(p->interval_ms % 1000) * 1000000L;
        nanosleep(&pause, NULL);
    }
    fl_unref_locked_and_unlock(p);
}
#endif

/* NULL on failure (errno set). The fd is duplicated: the pulse owns its copy. */
static fl_pulse *fl_pulse_start(int fd, int interval_ms, char **argv, int give_a, int give_b) {
#if FL_HAVE_PULSE
    fl_pulse *p = (fl_pulse *)calloc(1, sizeof(fl_pulse));
    if (!p) return NULL;
    p->argv = argv;
    p->give[0] = give_a;
    p->give[1] = give_b;
    p->fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    if (p->fd < 0) { free(p); return NULL; }
    fcntl(p->fd, F_SETFL, fcntl(p->fd, F_GETFL) | O_NONBLOCK);
    p->interval_ms = interval_ms;
    p->refs = 2;
    pthread_mutex_init(&p->mutex, NULL);
    if (PyThread_start_new_thread(fl_pulse_main, p) == PYTHREAD_INVALID_THREAD_ID) {
        pthread_mutex_destroy(&p->mutex);
        close(p->fd);
        free(p);
        errno = EAGAIN;
        return NULL;
    }
    return p;
#else
    (void)fd; (void)interval_ms; (void)argv; (void)give_a; (void)give_b;
    return NULL;
#endif
}

static long fl_pulse_child(fl_pulse *p) {
#if FL_HAVE_PULSE
    long child;
    pthread_mutex_lock(&p->mutex);
    child = p->child;
    pthread_mutex_unlock(&p->mutex);
    return child;
#else
    (void)p;
    return 0;
#endif
}

/* A frame id never handed out before by this pulse (ids start at 1; 0 is the pulse frame). */
static uint64_t fl_pulse_reserve_id(fl_pulse *p) {
#if FL_HAVE_PULSE
    uint64_t id;
    pthread_mutex_lock(&p->mutex);
    id = ++p->next_id;
    pthread_mutex_unlock(&p->mutex);
    return id;
#else
    (void)p;
    return 0;
#endif
}

static int fl_pulse_stage(fl_pulse *p, uint64_t id, const char *data, size_t size) {
#if FL_HAVE_PULSE
    int ok = -1;
    if (size + FL_FRAME_HEAD > FL_WRITE_MAX) return -1;
    pthread_mutex_lock(&p->mutex);
    if (!p->stop && fl_reserve(p, FL_FRAME_HEAD + size) == 0) {
        fl_put_head(p->buf + p->len, (uint32_t)(8 + size), id);
        memcpy(p->buf + p->len + FL_FRAME_HEAD, data, size);
        p->len += FL_FRAME_HEAD + size;
        ok = 0;
    }
    pthread_mutex_unlock(&p->mutex);
    return ok;
#else
    (void)p; (void)id; (void)data; (void)size;
    return -1;
#endif
}

/* 1 if the frame was still staged and is now taken back, 0 if it was written (or never staged). */
static int fl_pulse_unstage(fl_pulse *p, uint64_t id) {
#if FL_HAVE_PULSE
    size_t at = 0;
    int found = 0;
    pthread_mutex_lock(&p->mutex);
    while (at < p->len) {
        uint32_t flen;
        uint64_t fid;
        memcpy(&flen, p->buf + at, 4);
        memcpy(&fid, p->buf + at + 4, 8);
        if (fid == id) {
            memmove(p->buf + at, p->buf + at + 4 + flen, p->len - at - 4 - flen);
            p->len -= 4 + flen;
            found = 1;
            break;
        }
        at += 4 + flen;
    }
    pthread_mutex_unlock(&p->mutex);
    return found;
#else
    (void)p; (void)id;
    return 0;
#endif
}

static uint64_t fl_pulse_count(fl_pulse *p) {
#if FL_HAVE_PULSE
    uint64_t n;
    pthread_mutex_lock(&p->mutex);
    n = p->pulses;
    pthread_mutex_unlock(&p->mutex);
    return n;
#else
    (void)p;
    return 0;
#endif
}

/* A forked child: close its copy of the pipe; the struct is never touched again (its mutex may
   be held by a thread that does not exist here). */
static void fl_pulse_forget(fl_pulse *p) {
#if FL_HAVE_PULSE
    if (p->fd >= 0) close(p->fd);
#else
    (void)p;
#endif
}

/* close(): the thread stops within one interval; the struct stays until both references go. */
static void fl_pulse_stop(fl_pulse *p) {
#if FL_HAVE_PULSE
    pthread_mutex_lock(&p->mutex);
    fl_stop_locked(p);
    pthread_mutex_unlock(&p->mutex);
#else
    (void)p;
#endif
}

/* The Python object's reference, dropped by its __dealloc__ only. */
static void fl_pulse_release(fl_pulse *p) {
#if FL_HAVE_PULSE
    pthread_mutex_lock(&p->mutex);
    fl_stop_locked(p);
    fl_unref_locked_and_unlock(p);
#else
    (void)p;
#endif
}

#endif /* FASTLEASE_PULSE_H */
