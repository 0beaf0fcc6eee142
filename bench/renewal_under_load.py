"""Does a held lease survive a busy main thread? Side by side: fastlease (c) and pydynox 1.8.0, on their
in-memory stores, each holding one lease while the main thread is busy for a while in:

  (a) a pure-Python loop (the GIL is released every switch interval);
  (b) time.sleep (the GIL is free);
  (c) a GIL-holding C call, ``sum(range(n))`` calibrated to the duration.

First with a 1 s lease and 5 s of work, then (c) again with the default 30 s lease and 15 s of work.
fastlease renews from Python threads, so (c) starves them of the GIL: with the default lease that
holds up to ~17 s (renewal at 10 s, validity 27 s); with a 1 s lease it is lost. pydynox renews from
Rust without the GIL. Run: ``.venv/bin/python bench/renewal_under_load.py``.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable

from fastlease import MemoryClient, SyncDistributedLock


def calibrate_sum(seconds: float) -> int:
    n = 10_000_000
    start = time.perf_counter()
    sum(range(n))
    return int(n * seconds / (time.perf_counter() - start))


def busy(kind: str, seconds: float, sum_n: int) -> None:
    if kind == "python loop":
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            pass
    elif kind == "sleep":
        time.sleep(seconds)
    else:
        sum(range(sum_n))  # one C call: the GIL is not released until it returns


def fastlease_hold(lease_s: float, work: Callable[[], None]) -> tuple[bool, int]:
    client = MemoryClient()
    try:
        guard = SyncDistributedLock(client, table="locks", key="busy", lease_duration=lease_s)
        with guard as lease:
            work()
            held = lease.is_valid()
        return held and not guard.metrics.lost, guard.metrics.renewals
    except Exception:
        return False, guard.metrics.renewals
    finally:
        client.close()


def pydynox_hold(lease_s: float, work: Callable[[], None]) -> tuple[bool, int]:
    from pydynox.lock import SyncDistributedLock as PydynoxLock
    from pydynox.testing import MemoryBackend

    with MemoryBackend() as backend:
        client = backend.client
        client.sync_create_table("locks", partition_key=("key", "S"))
        guard: Any = PydynoxLock(client, table="locks", key="busy", lease_duration=lease_s)
        try:
            with guard as lease:
                work()
                lease.raise_if_lost()
            return True, guard.metrics.renewals
        except Exception:
            return False, guard.metrics.renewals


def main() -> int:
    scenarios = [(1.0, 5.0, kind) for kind in ("python loop", "sleep", "C call holding the GIL")]
    scenarios.append((30.0, 15.0, "C call holding the GIL"))
    print(f"# renewal_under_load, Python {sys.version.split()[0]}, {time.strftime('%Y-%m-%d')}")
    print(f"{'lease':>6} {'busy':>5}  {'main thread':<24}{'fastlease c':>18}{'pydynox 1.8.0':>18}")
    for lease_s, busy_s, kind in scenarios:
        sum_n = calibrate_sum(busy_s) if kind.startswith("C call") else 0

        def work(kind: str = kind, busy_s: float = busy_s, sum_n: int = sum_n) -> None:
            busy(kind, busy_s, sum_n)

        ours = fastlease_hold(lease_s, work)
        try:
            theirs = pydynox_hold(lease_s, work)
            theirs_text = f"{'held' if theirs[0] else 'LOST'}, {theirs[1]} renewals"
        except ImportError:
            theirs_text = "not installed"
        ours_text = f"{'held' if ours[0] else 'LOST'}, {ours[1]} renewals"
        print(f"{lease_s:>5g}s {busy_s:>4g}s  {kind:<24}{ours_text:>18}{theirs_text:>18}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
