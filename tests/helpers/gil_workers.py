"""Worker functions for tests/test_renewal_gil.py, run in ``multiprocessing`` *spawn* children.

Like ``mp_workers`` (whose client builder and helpers these use): each worker builds its own client
from the endpoint it is given (``sqlite:PATH``, a ``redis://`` URL or the moto server's address),
reports to the parent on ``out`` and takes instructions on ``ctl``; every wait is bounded. Times are
``time.monotonic()`` readings, which compare across processes (CLOCK_MONOTONIC is system-wide on
Linux and macOS).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Dict, List

from helpers.mp_workers import _outcome, _report_error, describe, expect, fastlease_client, hold_in_block, ready_for

#: The calibration: sums of at least CALIBRATION_RUN_S each, for CALIBRATION_S in all; the fastest counts
#: (this machine's speed varies from one moment to the next). Even scaled from the fastest, one long sum
#: comes out shorter than aimed, by up to a fifth here: callers aim above the length they need.
CALIBRATION_RUN_S = 0.05
CALIBRATION_S = 1.0


def gil_enabled() -> bool:
    """False on a free-threaded build running without the GIL (there a C call holds no lock)."""
    check = getattr(sys, "_is_gil_enabled", None)
    return True if check is None else bool(check())


def calibrate_sum(target_s: float) -> int:
    """N such that ``sum(range(N))`` lasts about ``target_s`` here: time smaller sums, scale the fastest."""
    n = 100_000
    for _ in range(40):  # bounded: N doubles each round, and 2**40 times the first sum outlasts any machine
        started = time.monotonic()
        sum(range(n))
        fastest = time.monotonic() - started
        if fastest >= CALIBRATION_RUN_S:
            break
        n *= 2
    until = time.monotonic() + CALIBRATION_S
    while time.monotonic() < until:
        started = time.monotonic()
        sum(range(n))
        fastest = min(fastest, time.monotonic() - started)
    # The sum stays below 2**63 up to N = 4.29e9, so it keeps its C fast path and scales linearly.
    return min(int(n * target_s / fastest), 4_000_000_000)


#: The GIL-holding call is a run of ``sum(range(N))`` C calls of about this long each.
GIL_CHUNK_S = 0.02


def hold_gil(n: int, seconds: float) -> None:
    """Hold the GIL for ``seconds``: C calls (``sum(range(n))``) back to back, with the switch interval
    raised so that no other Python thread is given the GIL between them. One long ``sum`` would be the
    same hold, but its length follows this shared machine's speed (it swings 2x); this one ends on
    time. The Ticker shows the hold: no other thread ran during it."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            sum(range(n))  # a GIL-holding C call
    finally:
        sys.setswitchinterval(previous)


class Ticker(threading.Thread):
    """A Python thread that notes the time every 10 ms: the longest gap between its notes across a call
    is how long the call kept every Python thread of the process (the renewal thread too) from running."""

    def __init__(self) -> None:
        super().__init__(name="gil-ticker", daemon=True)
        self.ticks: List[float] = []
        self._ticked = threading.Condition()
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(0.01):
            with self._ticked:
                self.ticks.append(time.monotonic())
                self._ticked.notify_all()

    def wait_tick_after(self, moment: float, timeout_s: float = 10.0) -> None:
        with self._ticked:
            if not self._ticked.wait_for(lambda: bool(self.ticks) and self.ticks[-1] > moment, timeout_s):
                raise TimeoutError(f"the ticker did not tick within {timeout_s:g} s")

    def longest_gap(self, started: float, ended: float) -> float:
        """The longest time between two consecutive notes that overlaps [started, ended] (a note was
        taken before ``started``: see ``hold_through_gil_call``; this waits for one after ``ended``)."""
        self.wait_tick_after(ended)
        self._stop_event.set()
        self.join(timeout=5)
        ticks = self.ticks
        return max((b - a for a, b in zip(ticks, ticks[1:]) if b >= started and a <= ended), default=0.0)


def hold_through_gil_call(endpoint: str, table: str, key: str, lease_s: float, renewal: str, call_s: float,
                          shape: str, out: Any, ctl: Any) -> None:
    """On "calibrate" (sent once the other processes of the test are idle: they would slow the timing
    sums), calibrate ``sum(range(N))``, report ``("ready", pid, N)`` and wait for "go".
    Then acquire ``key``, report ``("starting", pid, owner, monotonic)`` and hold the GIL for about
    ``call_s`` at once: ``shape`` "chunks" is ``hold_gil`` (C calls of GIL_CHUNK_S back to back, ending on
    time), "one" a single ``sum(range(N))`` calibrated to ``call_s``, with the switch interval as it is
    (its length follows the machine's speed). Afterwards check the lease, leave the block and report
    ``("done", pid, result)``: the call's times, what ``raise_if_lost`` and the exit raised, renewals."""
    if shape not in ("chunks", "one"):
        raise ValueError(f"shape must be 'chunks' or 'one', got {shape!r}")
    try:
        from fastlease import SyncDistributedLock

        client = fastlease_client(endpoint, renewal=renewal)

        def body(lease: Any, result: Dict[str, Any]) -> None:
            out.send(("starting", os.getpid(), lease.owner, time.monotonic()))
            result["started"] = time.monotonic()
            if shape == "one":
                sum(range(n))  # one GIL-holding C call
            else:
                hold_gil(n, call_s)
            result["ended"] = time.monotonic()
            result["raise_if_lost"] = _outcome(lease.raise_if_lost)
            result["renewals"] = lease.metrics.renewals
            link = client.engine.link
            result["renewal_pid"] = None if link is None else link.pid
            # The end of this holder's ownership as it knows it: validity (after the renewal process's
            # reports), or the release that follows at once, whichever comes first.
            result["valid_until"] = lease.valid_until()
            result["leaving"] = time.monotonic()
            result["owner"] = lease.owner

        try:
            expect(ctl, "calibrate")
            n = calibrate_sum(call_s if shape == "one" else GIL_CHUNK_S)
            ticker = Ticker()
            ticker.start()
            ticker.wait_tick_after(time.monotonic())  # ticking before the call: see Ticker.longest_gap
            ready_for(out, ctl, "go", n)
            guard = SyncDistributedLock(client, table=table, key=key, lease_duration=lease_s, wait_timeout=10)
            result = hold_in_block(guard, body)
            result.update(n=n, gil_enabled=gil_enabled(), rows_after=client.inspect(table, key),
                          longest_tick_gap=ticker.longest_gap(result["started"], result["ended"]))
        finally:
            client.close()
        out.send(("done", os.getpid(), result))
    except BaseException:  # noqa: BLE001 - reported to the parent
        _report_error(out)


def contend_once(endpoint: str, table: str, key: str, lease_s: float, wait_s: float, out: Any, ctl: Any) -> None:
    """Build a client, report ``("ready", pid)``, and on "go" try once to acquire ``key`` waiting at most
    ``wait_s``. Reports ``("done", pid, result)``: when the attempt started and ended, and its outcome."""
    try:
        from fastlease import LockNotAcquired, SyncDistributedLock

        client = fastlease_client(endpoint)
        try:
            ready_for(out, ctl, "go")
            started = time.monotonic()
            guard = SyncDistributedLock(client, table=table, key=key, lease_duration=lease_s, wait_timeout=wait_s)
            try:
                with guard:
                    ended = time.monotonic()  # acquired
                outcome = describe(None)
            except LockNotAcquired as error:
                ended = time.monotonic()
                outcome = describe(error)
        finally:
            client.close()
        out.send(("done", os.getpid(), {"started": started, "ended": ended, "outcome": outcome}))
    except BaseException:  # noqa: BLE001 - reported to the parent
        _report_error(out)


def hold_until_continued(endpoint: str, table: str, key: str, lease_s: float, out: Any, ctl: Any) -> None:
    """Acquire ``key``, wait (bounded) until the renewal process has confirmed two renewals, report
    ``("held", pid, owner, renewal process pid, renewals)`` and block reading ``ctl`` (the parent
    SIGSTOPs us there). On "continue": check the lease, leave the block, report ``("done", pid, result)``."""
    try:
        from fastlease import SyncDistributedLock

        client = fastlease_client(endpoint)

        def body(lease: Any, result: Dict[str, Any]) -> None:
            deadline = time.monotonic() + 10 * lease_s
            # Bounded poll: is_valid() applies the renewal process's reports.
            while lease.is_valid() and lease.metrics.renewals < 2 and time.monotonic() < deadline:
                threading.Event().wait(0.02)
            link = client.engine.link
            out.send(("held", os.getpid(), lease.owner, None if link is None else link.pid, lease.metrics.renewals))
            expect(ctl, "continue")
            result["raise_if_lost"] = _outcome(lease.raise_if_lost)
            result["valid"] = lease.is_valid()

        try:
            guard = SyncDistributedLock(client, table=table, key=key, lease_duration=lease_s, wait_timeout=10)
            result = hold_in_block(guard, body)
        finally:
            client.close()
        out.send(("done", os.getpid(), result))
    except BaseException:  # noqa: BLE001 - reported to the parent
        _report_error(out)
