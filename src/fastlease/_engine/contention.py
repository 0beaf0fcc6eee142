# cython: language_level=3, embedsignature=True, freethreading_compatible=True, annotation_typing=False
"""What a client remembers of contended keys: when it first saw each contended row unchanged (the
takeover rule's observation cache), and its own waiters and releases (handoff inside one client)."""

from __future__ import annotations

from .timing import LOOK_FIRST_AFTER_HANDOVER_MS, OBSERVATION_CACHE_SIZE, YIELD_WINDOW_MS, new_mutex
from .timing import NS_PER_MS as _NS_PER_MS

TYPE_CHECKING = False  # typing is not imported at run time: see _typing.py
if TYPE_CHECKING:  # annotations only
    import threading
    from typing import Callable, Optional

    from .timing import Clock

BUILT_FROM = "" if __file__.endswith((".py", ".pyc")) else FASTLEASE_SOURCE_CRC.decode("ascii")  # type: ignore[name-defined]  # noqa: F821


# ---------------------------------------------------------------------------------------------
# Observation cache
# ---------------------------------------------------------------------------------------------
class ObservationCache:
    """When this client first saw each contended row unchanged, on its own monotonic clock.

    A takeover is allowed only after the same (owner, version, lease_ms) has been seen for the stored
    lease_ms: clocks of different machines are never compared. Bounded LRU; evicting an entry only
    restarts that row's observation, so it can delay recovery but never allow an early takeover.
    """

    def __init__(self, capacity: int = OBSERVATION_CACHE_SIZE) -> None:
        if type(capacity) is not int or capacity < 1:
            raise ValueError(f"observation cache capacity must be a positive int, got {capacity!r}")
        self.capacity = capacity
        # cache_key -> (owner, version, lease_ms, first seen ns); insertion order is the LRU order.
        self._entries: dict[tuple[str, str], tuple[str, str, int, int]] = {}
        self._mutex = new_mutex()

    def observe(self, cache_key: tuple[str, str], owner: str, version: str, lease_ms: int, now_ns: int) -> int:
        """Record a sighting; return how long (ns) this exact row has been seen unchanged."""
        with self._mutex:
            entries = self._entries
            entry = entries.pop(cache_key, None)
            if entry is None or entry[0] != owner or entry[1] != version or entry[2] != lease_ms:
                entry = (owner, version, lease_ms, now_ns)
                if len(entries) >= self.capacity:
                    del entries[next(iter(entries))]
            entries[cache_key] = entry  # re-inserted last: the dict's order is the LRU order
            return now_ns - entry[3]

    def forget(self, cache_key: tuple[str, str]) -> None:
        with self._mutex:
            self._entries.pop(cache_key, None)

    def __len__(self) -> int:
        return len(self._entries)


# ---------------------------------------------------------------------------------------------
# Same-process wake-up on release
# ---------------------------------------------------------------------------------------------
class ReleaseSignals:
    """Handoff between this client's waiters and others: wake-ups on release, and turn-taking.

    * This client's waiters on a key queue up in arrival order (each with its own ticket, an Event).
      When this client releases the key, only the oldest waiter is woken, at once; the others sleep to
      their next poll. That makes handoff inside a process first-come first-served and keeps a herd
      of waiters from all reading the row on every release. A waiter that gives up passes a wake-up it
      did not use on to the next. A missed wake-up only leaves a waiter to its next poll; it can never
      admit one, since the waiter still has to win the conditional write.
    * Turn-taking: a releaser that loops straight back would always beat waiters asleep between
      polls. So a new acquisition within ``YIELD_WINDOW_MS`` of this client's release first yields
      (waits a little longer than the longest poll interval, queued behind this client's waiters)
      when there is present evidence that others want the key: this client has other threads queued
      for it, or the released row carried a ``waiting`` mark, or while waiting for that turn this
      client saw a mark it had not made. A contender (in any process) marks the holder's row once it
      has waited ``WAITING_MARK_AFTER_MS``. Only present evidence counts: remembering past
      contention would let every former holder yield at once and leave the key idle. (Measured, a
      winner that yields merely because its own wait was long does worse: the key idles while
      former holders sit out their courtesy waits, and whoever returns first takes a long run.)
    * Where a release handed the key over to the head of the store's line, a new acquisition of it by
      this client within ``LOOK_FIRST_AFTER_HANDOVER_MS`` reads (in line) before it writes
      (``look_first``): the key is that waiter's, so a put would only fail.
    """

    def __init__(self) -> None:
        # cache_key -> [ticket, ...], oldest first; removed when empty
        self._queues: dict[tuple[str, str], list[threading.Event]] = {}
        self._mutex = new_mutex()
        # cache_key -> this client's last release of a key that others wait for. Bounded; empty on
        # the uncontended path.
        self._contended: dict[tuple[str, str], int] = {}
        # cache_key -> this client's last release that handed the key over (HANDED_OVER). Bounded alike;
        # an entry is taken by the next acquisition of the key.
        self._handed: dict[tuple[str, str], int] = {}

    def wait(self, clock: Clock, cache_key: tuple[str, str], ticket: threading.Event, timeout_s: float,
             reader: Optional[Callable[[threading.Event, float], bool]] = None) -> None:
        """Wait up to ``timeout_s`` (or until woken), queued behind earlier waiters on the key; with
        ``reader`` (the release feed's ``wait_reading``, on the system clock), waiting in it instead."""
        with self._mutex:
            queue = self._queues.get(cache_key)
            if queue is None:
                queue = self._queues[cache_key] = []
            if ticket not in queue:
                queue.append(ticket)
        if reader is None:
            clock.wait(ticket, timeout_s)
        else:
            reader(ticket, timeout_s)

    def leave(self, cache_key: tuple[str, str], ticket: threading.Event, acquired: bool) -> None:
        """The waiter's acquisition is over; without the lease, it hands an unused wake-up on."""
        with self._mutex:
            queue = self._queues.get(cache_key)
            if queue is None or ticket not in queue:
                return
            was_head = queue[0] is ticket
            queue.remove(ticket)
            if not queue:
                del self._queues[cache_key]
            elif was_head and ticket.is_set() and not acquired:
                queue[0].set()

    def notify(self, cache_key: tuple[str, str]) -> None:
        """This client released the key: wake its oldest waiter."""
        if self._queues:  # the uncontended release skips the mutex
            with self._mutex:
                queue = self._queues.get(cache_key)
                head = queue[0] if queue else None
            if head is not None:
                head.set()

    def released(self, cache_key: tuple[str, str], others_waiting: bool, now_ns: int) -> None:
        """This client released ``cache_key``; ``others_waiting`` if the row carried a waiting mark."""
        if others_waiting or self._contended:
            with self._mutex:
                if others_waiting:
                    _remember(self._contended, cache_key, now_ns)
                else:
                    self._contended.pop(cache_key, None)
        self.notify(cache_key)

    def handed_over(self, cache_key: tuple[str, str], now_ns: int) -> None:
        """This client's release of ``cache_key`` handed it over to the head of the store's line."""
        with self._mutex:
            _remember(self._handed, cache_key, now_ns)

    def look_first(self, cache_key: tuple[str, str], now_ns: int) -> bool:
        """Should a new acquisition of ``cache_key`` read before it writes? True once, within
        ``LOOK_FIRST_AFTER_HANDOVER_MS`` of this client's release that handed the key over."""
        if not self._handed:  # the usual path skips the mutex
            return False
        with self._mutex:
            handed_ns = self._handed.pop(cache_key, None)
        return handed_ns is not None and now_ns - handed_ns < LOOK_FIRST_AFTER_HANDOVER_MS * _NS_PER_MS

    def should_yield(self, cache_key: tuple[str, str], now_ns: int) -> bool:
        """Should a new acquisition of ``cache_key`` let other contenders go first?"""
        if self._queues and cache_key in self._queues:
            return True
        released_ns = self._contended.get(cache_key)
        return released_ns is not None and now_ns - released_ns < YIELD_WINDOW_MS * _NS_PER_MS

    def __len__(self) -> int:
        """Keys with waiters queued."""
        return len(self._queues)


def _remember(releases: dict[tuple[str, str], int], cache_key: tuple[str, str], now_ns: int) -> None:
    """Under the signals' mutex: record this client's release of ``cache_key`` at ``now_ns`` as the newest
    in ``releases``, which keeps OBSERVATION_CACHE_SIZE keys at most (the oldest goes first)."""
    releases.pop(cache_key, None)
    if len(releases) >= OBSERVATION_CACHE_SIZE:
        del releases[next(iter(releases))]
    releases[cache_key] = now_ns
