"""The lease engine: the protocol, written once, as pairs of a ``.py`` source and its ``.pxd``.

Each module below is both engines. Imported as it is, it is the pure-Python engine; ``cythonize``
compiles it, with the augmenting declarations in the ``.pxd`` beside it (``cdef class`` layouts, typed
attributes and locals), into the compiled one. ``fastlease._impl`` picks which one a process uses.
This face is never compiled: it names what the layers above use, whichever engine it is.

The modules, each importing only those before it:

* ``timing``: limits and timing rules, clocks, the native core's mutex and tokens;
* ``keys``: the key check, the strict reading of stored rows, and key templates;
* ``contention``: what a client remembers of contended keys: the observation cache (the takeover
  rule's memory) and its release signals (handoff inside one client);
* ``scheduler``: the renewal scheduler, and what it asks of a lease (``Renewable``);
* ``engine``: the engine's state per client, the observer it tells, fork detection;
* ``held``: a lease's state and how it is kept (validity, loss, renewal here or by the renewal process);
* ``waiting``: a lease while it waits: its sleeps, its wake-ups, the store's line of waiters;
* ``lease``: the lease's acquisition and release;
* ``slots``: a semaphore's acquisition, a lease on the first free one of its slot keys.
"""

from __future__ import annotations

from . import contention, engine, held, keys, lease, scheduler, slots, timing, waiting
from .contention import ObservationCache, ReleaseSignals
from .engine import Engine, Observer, check_not_forked, current_pid, describe_store_error
from .held import STATE_NAMES, HeldLease
from .keys import (
    SEMAPHORE_OWNER,
    CallKey,
    KeyTemplate,
    check_holder_kind,
    check_key,
    check_row,
    holder_kind,
)
from .lease import Lease
from .scheduler import Renewable, RenewalScheduler
from .slots import MAX_LIMIT, SLOT_SEPARATOR, SlotLease, check_limit, slot_keys
from .timing import (
    DELEGATE_MIN_LEASE_MS,
    LOOK_FIRST_AFTER_HANDOVER_MS,
    MAX_DURATION_MS,
    MAX_KEY_BYTES,
    MIN_LEASE_MS,
    OBSERVATION_CACHE_SIZE,
    POLL_INTERVAL_MS,
    PROTOCOL_V1,
    RENEWAL_WORKERS,
    SYSTEM_CLOCK,
    WAITING_MARK_AFTER_MS,
    YIELD_WINDOW_MS,
    Clock,
    SystemClock,
    new_token,
)

#: The engine's modules, in the order they import each other (tests/test_layers.py checks it); fastlease._impl
#: checks each for a stale build.
MODULES = (timing, keys, contention, scheduler, engine, held, waiting, lease, slots)


def _implementation() -> str:
    compiled = {"py" if (module.__file__ or "").endswith((".py", ".pyc")) else "c" for module in MODULES}
    # A build whose every module compiled is "c"; if only some did (a compiler that failed on one),
    # "mixed", which fastlease._impl does not run as either.
    return compiled.pop() if len(compiled) == 1 else "mixed"


#: "c" for the compiled engine, "py" for the interpreted one.
IMPLEMENTATION = _implementation()

__all__ = [
    "DELEGATE_MIN_LEASE_MS", "LOOK_FIRST_AFTER_HANDOVER_MS", "MAX_DURATION_MS", "MAX_KEY_BYTES", "MIN_LEASE_MS",
    "OBSERVATION_CACHE_SIZE",
    "POLL_INTERVAL_MS", "PROTOCOL_V1", "RENEWAL_WORKERS", "STATE_NAMES", "SYSTEM_CLOCK", "WAITING_MARK_AFTER_MS",
    "YIELD_WINDOW_MS", "IMPLEMENTATION", "MODULES", "CallKey", "Clock", "Engine", "HeldLease", "KeyTemplate",
    "Lease", "ObservationCache", "Observer", "ReleaseSignals", "Renewable", "RenewalScheduler", "SystemClock",
    "check_key", "check_not_forked", "check_row", "current_pid", "describe_store_error", "new_token",
    "MAX_LIMIT", "SEMAPHORE_OWNER", "SLOT_SEPARATOR", "SlotLease", "check_holder_kind", "check_limit", "holder_kind",
    "slot_keys",
]
