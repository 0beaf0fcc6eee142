# cython: language_level=3, embedsignature=True, freethreading_compatible=True, annotation_typing=False
"""The engine's state per client (``Engine``), what it tells an observer, and the process it belongs to."""

from __future__ import annotations

import os

from .._typing import Protocol
from .contention import ObservationCache, ReleaseSignals
from .scheduler import RenewalScheduler
from .timing import SYSTEM_CLOCK

TYPE_CHECKING = False  # typing is not imported at run time: see _typing.py
if TYPE_CHECKING:  # annotations only
    from typing import Any, Callable, Optional

    from .held import HeldLease
    from .timing import Clock

BUILT_FROM = "" if __file__.endswith((".py", ".pyc")) else FASTLEASE_SOURCE_CRC.decode("ascii")  # type: ignore[name-defined]  # noqa: F821


# ---------------------------------------------------------------------------------------------
# Fork detection: clients and guards record the PID they were made in
# ---------------------------------------------------------------------------------------------
_process_id = os.getpid()


def _note_fork() -> None:
    global _process_id
    _process_id = os.getpid()


os.register_at_fork(after_in_child=_note_fork)


def current_pid() -> int:
    """This process's id, kept current across fork without a system call per use."""
    return _process_id


def check_not_forked(pid: int) -> None:
    """Raise RuntimeError if an object made in process ``pid`` is used in a forked child."""
    if pid != _process_id:
        raise RuntimeError(
            "fastlease client or guard used in a forked child process: its renewal thread and "
            "observations belong to the parent. Create the client in the worker process "
            "(after fork, or use the multiprocessing 'spawn' start method)."
        )


# ---------------------------------------------------------------------------------------------
# Observer: told of each lease's events (fastlease.otel provides one)
# ---------------------------------------------------------------------------------------------
class Observer(Protocol):
    """What a client's ``engine.observer`` is told, if it is set (``fastlease.otel.instrument`` sets
    one). ``None``, the default, costs one attribute check per event. Each hook runs in the thread of
    its event, outside the lease's mutex, and must not raise. A lease takes the observer when it is
    made, so setting or clearing it changes leases made afterwards."""

    def acquired(self, lease: HeldLease, wait_ns: int) -> Any:
        """The caller's thread: the acquisition is confirmed after ``wait_ns`` on the client's clock.
        Returns this hold's record (not None), handed to the hooks below until the hold ends."""

    def acquire_failed(self, lease: HeldLease, wait_ns: int, error: Optional[BaseException]) -> None:
        """The caller's thread: the acquisition was abandoned after ``wait_ns``; ``error`` is None when
        the wait budget ran out or it was cancelled (it raises LockNotAcquired), else what ended it."""

    def renewed(self, lease: HeldLease, hold: Any, renewals: int) -> None:
        """``renewals`` more confirmed renewals of the hold: one at a time from this process's renewal
        thread, or as many as a report of the renewal process applies (in the thread that applied it).
        Together they are the hold's ``metrics.renewals``."""

    def lost(self, lease: HeldLease, hold: Any, cause: str) -> None:
        """The lease was lost (``stolen``, ``expired``, ``unreachable``, ``cancelled``), once per
        lease, in the thread that found the loss (usually the renewal thread)."""

    def released(self, lease: HeldLease, hold: Any, error: Optional[BaseException]) -> None:
        """The hold is over (the caller's thread): released, with ``error`` None, or the release
        raised ``error`` (LockLost with the cause, LockReleaseError). Once per hold."""

    def idempotent_call(self, table: str, outcome: str) -> None:
        """The idempotency layer: a call on record table ``table`` was entered as ``hit`` (replays a
        stored outcome) or ``miss`` (runs), or refused as ``in_flight`` or ``mismatch``."""


def describe_store_error(error: BaseException) -> str:
    """``StoreError`` text for messages, led by the type of the failure under it when there is one
    (``ConnectionRefusedError: ...``), which is what a reader looks for first."""
    cause = error.__cause__ if error.__cause__ is not None else error
    return f"{type(cause).__name__}: {error}"


# ---------------------------------------------------------------------------------------------
# The engine's state per client
# ---------------------------------------------------------------------------------------------
class Engine:
    """What the engine keeps once per client: the store adapter, the clock, the observation cache,
    the renewal scheduler, the same-process release signals and the store's release feed. A client
    makes one (``client.engine``), and every lease of the client reads it; nothing else of the client.
    """

    def __init__(self, store: Any, clock: Optional[Clock] = None, observations: Any = None) -> None:
        self.pid = current_pid()  # using the client in a forked child raises RuntimeError
        self.store = store
        self.clock: Clock = clock if clock is not None else SYSTEM_CLOCK
        # An ObservationCache of this engine, or a SharedObservationCache that wraps one.
        self.observations = observations if observations is not None else ObservationCache()
        self.scheduler = RenewalScheduler(self.clock)
        self.signals = ReleaseSignals()
        # Stores that can report releases made by other processes (Redis pub/sub) set this before
        # the first lease; None means waiters poll.
        self.release_feed: Any = None
        # The store, set with the feed where it keeps a line of waiters per key (``read_in_line``,
        # ``put_in_turn``, ``leave_line``): a release then wakes the next waiter alone. None: no line.
        self.line: Any = None
        # The client's renewal process (``_renewal_link.RenewalLink``), set by clients whose store it
        # can renew; None keeps every renewal in this process.
        self.link: Any = None
        # The renewal process's own engine sets this: called after each confirmed renewal.
        self.renewal_listener: Optional[Callable[[HeldLease], None]] = None
        # Told of every lease's events (fastlease.otel.instrument sets one), or None: see Observer.
        self.observer: Optional[Observer] = None

    def close(self) -> None:
        """Stop renewing: held leases lapse locally at their validity; others recover their rows."""
        self.scheduler.close()
        if self.link is not None:
            self.link.close()
