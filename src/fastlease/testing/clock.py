"""``FakeClock``: monotonic and wall clocks that move only when a test moves them.

It replaces both clocks of a client (``MemoryClient(clock=FakeClock())``). Waiting on it moves time
instead of sleeping, and moving time runs every renewal that falls due on the way, in order, in the
calling thread, so tests of takeover and renewal are exact and instant.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["FakeClock"]


class FakeClock:
    """Monotonic and wall clocks that move only when told to."""

    def __init__(self, *, monotonic_ns: int = 10**12, wall_ns: int = 1_767_225_600 * 10**9) -> None:
        self._monotonic_ns = monotonic_ns
        self._wall_ns = wall_ns
        self._lock = threading.RLock()
        self._schedulers: list[Any] = []

    def monotonic_ns(self) -> int:
        """The monotonic clock, in ns: it moves only by :meth:`advance`."""
        return self._monotonic_ns

    def time_ns(self) -> int:
        """The wall clock, in ns since the epoch: it moves with :meth:`advance` and by :meth:`jump_wall`."""
        return self._wall_ns

    def attach_scheduler(self, scheduler: Any) -> bool:
        """Called by a client's renewal scheduler: this clock runs its renewals as time moves."""
        with self._lock:
            self._schedulers.append(scheduler)
        return True

    def advance(self, seconds: float) -> None:
        """Move both clocks forward, stopping at each due renewal to run it (an ideal renewal thread)."""
        if not seconds >= 0:
            raise ValueError(f"FakeClock.advance takes seconds >= 0, got {seconds!r}")
        with self._lock:
            target_ns = self._monotonic_ns + int(seconds * 1e9)
            while True:
                due = [d for d in (s.next_due_ns() for s in self._schedulers) if d and d <= target_ns]
                step_to = min(due) if due else target_ns
                if step_to > self._monotonic_ns:
                    self._wall_ns += step_to - self._monotonic_ns
                    self._monotonic_ns = step_to
                if not due:
                    return
                for scheduler in self._schedulers:
                    scheduler.run_due()

    def jump_wall(self, seconds: float) -> None:
        """Move only the wall clock (negative: backwards), as NTP or an operator would."""
        with self._lock:
            self._wall_ns += int(seconds * 1e9)

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        """Waiting moves time by ``timeout_s`` unless the event is already set."""
        if not event.is_set():
            self.advance(timeout_s)
        return event.is_set()
