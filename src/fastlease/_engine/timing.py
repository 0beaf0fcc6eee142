# cython: language_level=3, embedsignature=True, freethreading_compatible=True, annotation_typing=False
"""The engine's ground floor: its limits and timing rules, its clocks, and the native core's pieces.

Every derived duration of the protocol is computed here, once (docs/protocol.md, "Limits" and "Timeouts
and budgets"). The engine's other modules import from this one and from nothing else of the engine
above it.
"""

from __future__ import annotations

import threading
import time

from .._typing import Protocol

TYPE_CHECKING = False  # typing is not imported at run time: see _typing.py
if TYPE_CHECKING:  # annotations only
    from typing import Any

#: "c" when this module runs compiled (its file is the extension module), "py" when interpreted.
IMPLEMENTATION = "py" if __file__.endswith((".py", ".pyc")) else "c"
#: The CRC-32 of this file as it was compiled (a C constant from setup.py): fastlease._impl compares it
#: with the file beside it. Interpreted: "". Every module of the engine has one.
BUILT_FROM = "" if IMPLEMENTATION == "py" else FASTLEASE_SOURCE_CRC.decode("ascii")  # type: ignore[name-defined]  # noqa: F821

if IMPLEMENTATION == "c":
    # The compiled engine takes its tokens (pooled urandom, formatted in C) and its critical sections'
    # lock from the native core.
    from .._core import Mutex as _Mutex
    from .._core import new_token as _new_token
else:
    from .._core_fallback import Mutex as _Mutex  # type: ignore[assignment]  # threading.Lock: same methods
    from .._core_fallback import new_token as _new_token
new_mutex = _Mutex  # what the engine's modules make their critical sections' locks with
new_token = _new_token  # a fresh owner or version token (36 characters)

#: Waited on for plain back-off sleeps that honour an injected clock: never set.
NEVER_SET = threading.Event()

# ---------------------------------------------------------------------------------------------
# Limits and timing rules (docs/protocol.md, "Limits" and "Timeouts and budgets"). All derived
# timings are here.
# ---------------------------------------------------------------------------------------------
PROTOCOL_V1 = 1
MIN_LEASE_MS = 100
MAX_DURATION_MS = 86_400_000
MAX_KEY_BYTES = 2048
OBSERVATION_CACHE_SIZE = 4096
#: Contended waiters poll the store about this often (jittered 50%..150%), whatever their own lease:
#: it bounds cross-process handoff, while same-process waiters are woken at once on release.
POLL_INTERVAL_MS = 125
#: A waiter with a place in the store's line of waiters for its key, whose watch the release feed has
#: confirmed, polls this often instead (jittered alike): the release that gives it the turn wakes it
#: alone, and the poll only keeps its place (the store's bound, 1.5 s on Redis, is over twice the
#: longest poll) and recovers a lost wake-up.
POLL_IN_LINE_MS = 3 * POLL_INTERVAL_MS
#: After releasing a key that others are waiting for, a client gives them the next turn if it comes
#: back for the same key within this window (see ReleaseSignals).
YIELD_WINDOW_MS = 2 * POLL_INTERVAL_MS
#: A client whose release handed a key over to the head of its line (``HANDED_OVER``) and that comes
#: back for the key within this window looks before it writes: its first step is a read in line, not a
#: put, since the key is held by that waiter (a put would fail, and cost a round trip: measured in
#: docs/benchmarks.md). Past the window the key is as likely free, and a put comes first again.
LOOK_FIRST_AFTER_HANDOVER_MS = POLL_INTERVAL_MS
#: A contender that has waited this long marks the holder's row ``waiting`` (once per hold): the
#: holder, wherever it runs, then yields the next turn on release.
WAITING_MARK_AFTER_MS = 2 * POLL_INTERVAL_MS
#: First back-off after a transient store error while waiting; doubles up to POLL_INTERVAL_MS * 5.
ERROR_BACKOFF_MS = 25
#: A renewal thread with nothing to renew for this long exits; the next acquisition starts another.
SCHEDULER_IDLE_EXIT_MS = 30_000
#: Renewal requests run on up to this many worker threads per client, so one slow request (up to its
#: timeout) delays no other lease's renewal; the scheduler thread itself only waits and dispatches.
#: With the scheduler thread and the native pulse thread (``_renewal_link``), the renewal path of a
#: client runs four threads at most, however many leases it holds.
RENEWAL_WORKERS = 2
#: Leases at least this long are renewed by the client's renewal process (``_renewal_link``), which
#: keeps renewing while this process's GIL is held; its first renewal, lease/3 after the acquisition,
#: comes well after the registration reaches it (within one pulse, 100 ms). Shorter leases renew here.
DELEGATE_MIN_LEASE_MS = 1000
#: The PX a release hands a lease over with, to the head of its line (``WaiterLine.hands_over``; on
#: PostgreSQL the row's lease_ms), where the lease is longer: a waiter that died in line holds the key this
#: long at most, as long as its place would have lasted (the store's 1.5 s). Its validity counts from the
#: stamp before the read that left its offer, over this span, until its first renewal sets the whole lease.
HANDED_LEASE_MS = 1500
#: That first renewal is due this long after the stamp, not at once: a hold shorter than this (the usual
#: case where keys are handed over) writes nothing more, and a renewal that fails fast still has its retry
#: (min(lease/12, 1 s) later) before the handed validity ends, 0.9 × 1.5 s after the stamp.
HANDED_FIRST_RENEWAL_MS = 250

_NS_PER_MS = 1_000_000


def validity_ns(lease_ms: int) -> int:
    """Ownership stays valid for 90% of the lease, counted from the stamp taken before the write."""
    return lease_ms * 900_000


def renew_interval_ns(lease_ms: int) -> int:
    """Renewal runs every lease/3."""
    return lease_ms * _NS_PER_MS // 3


def renew_retry_ns(lease_ms: int) -> int:
    """After an unconfirmed renewal the retry comes after min(lease/12, 1 s)."""
    return min(lease_ms * _NS_PER_MS // 12, 1_000_000_000)


def request_timeout_ns(lease_ms: int) -> int:
    """Each request is bounded by min(lease/3, 5 s)."""
    return min(lease_ms * _NS_PER_MS // 3, 5_000_000_000)


def cleanup_budget_ns(lease_ms: int) -> int:
    """Release, reconciliation included, has a total budget of min(0.6 * lease, 10 s)."""
    return min(lease_ms * 600_000, 10_000_000_000)


def seconds_text(duration_ns: int) -> str:
    """A duration for messages, in seconds ("0.5s", "35s"). Declared nowhere in timing.pxd, so its
    argument stays a Python int when compiled: the division is never a C integer division."""
    return f"{duration_ns / 1e9:g}s"


def next_backoff_ns(backoff_ns: int) -> int:
    """After another transient store error the back-off doubles, up to five poll intervals."""
    return min(backoff_ns * 2, POLL_INTERVAL_MS * 5 * _NS_PER_MS)


NS_PER_MS = _NS_PER_MS  # the same, for the engine's other modules (a C constant in each when compiled)

_random: Any = None


def jitter() -> float:
    """A uniform float in [0, 1), to spread polls and back-offs. Only waits use it, so ``random`` (1-3 ms
    of ``import fastlease``) is imported at the first one."""
    global _random
    if _random is None:
        from random import random as _random
    return float(_random())


# ---------------------------------------------------------------------------------------------
# Clocks
# ---------------------------------------------------------------------------------------------
class Clock(Protocol):
    """What a client's ``clock`` argument provides (:class:`fastlease.testing.FakeClock` is one). Every
    reading is an int of nanoseconds; the default is the process's own clocks."""

    def monotonic_ns(self) -> int:
        """A monotonic reading (ns): validity, waits and observations of other holders count on it."""

    def time_ns(self) -> int:
        """The wall clock (ns since the epoch): a jump backwards ends the validity of held leases."""

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for ``event``; return whether it is set."""

    def attach_scheduler(self, scheduler: Any) -> bool:
        """Called once by each client's renewal scheduler: True if this clock runs the scheduler's due
        renewals itself (``scheduler.run_due()`` as time moves), False to have it start a thread."""


class SystemClock:
    """The process's monotonic and wall clocks; waits are real waits on an event."""

    monotonic_ns = staticmethod(time.monotonic_ns)
    time_ns = staticmethod(time.time_ns)

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for ``event``; return whether it is set."""
        return event.wait(timeout_s)

    def attach_scheduler(self, scheduler: Any) -> bool:
        """Return True if this clock drives the scheduler itself (fake clocks do); False starts a thread."""
        return False


SYSTEM_CLOCK = SystemClock()


def check_lease_arguments(lease_ms: int, wait_ms: int, max_hold_ms: int, on_lost: object) -> None:
    """Refuse a lease's durations (ints of milliseconds, as the API layer converted them) or ``on_lost``
    with an error that names the value, before anything is written."""
    if type(lease_ms) is not int or not MIN_LEASE_MS <= lease_ms <= MAX_DURATION_MS:
        raise ValueError(f"lease_ms must be an int in {MIN_LEASE_MS}-{MAX_DURATION_MS}, got {lease_ms!r}")
    if type(wait_ms) is not int or not 0 <= wait_ms <= MAX_DURATION_MS:
        raise ValueError(f"wait_ms must be an int in 0-{MAX_DURATION_MS}, got {wait_ms!r}")
    if type(max_hold_ms) is not int or not (max_hold_ms == 0 or MIN_LEASE_MS <= max_hold_ms <= MAX_DURATION_MS):
        raise ValueError(
            f"max_hold_ms must be 0 or an int in {MIN_LEASE_MS}-{MAX_DURATION_MS}, got {max_hold_ms!r}"
        )
    if on_lost is not None and not callable(on_lost):
        raise TypeError(f"on_lost must be a callable taking a LockLost, or None, got {type(on_lost).__name__}")
