"""``StillClock``: a FakeClock that waiting does not move, for tests that must know a lease's stamps exactly.

FakeClock moves its time by a wait's whole timeout whenever a thread waits, so a waiter's clock runs on by
its polls while the test watches. Here a wait is a short real one and moves nothing: the clock stands where
the test left it, so the stamp a waiter took before its last read is the clock's reading when it holds."""

from __future__ import annotations

import threading

from fastlease.testing import FakeClock

#: The longest real wait, so that a waiter polling on a still clock still sees a release within this.
REAL_WAIT_S = 0.05


class StillClock(FakeClock):
    """A FakeClock whose time only ``advance`` moves: ``wait`` waits for the event in real time, briefly."""

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        return event.wait(min(timeout_s, REAL_WAIT_S))
