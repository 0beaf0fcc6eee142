"""The embedded SQLite store: uncontended cycles per second, and handoff between processes.

Side by side in one run:
  * uncontended acquire+release cycles on a SQLite file (WAL) with fastlease's compiled core (c) and its
    interpreted engine (py), and the same on the in-memory store as the engine-only reference, in
    interleaved rounds (machine noise of ±25% then hits every contender alike);
  * 4 processes on one key of one SQLite file, 5 ms critical section (``bench/handoff.py``'s workload and
    report: handoff p50/p99, shares, reads). pydynox has no SQLite store, so it has no column here.

Run: ``.venv/bin/python bench/sqlite_cycle.py [--cycles N] [--rounds R] [--seconds S]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import handoff

from fastlease import MemoryClient, SQLiteClient, SyncDistributedLock, _impl

compiled = _impl.load("c")
interpreted = _impl.load("py")


def cycles(client: Any, count: int) -> float:
    start = time.perf_counter()
    for _ in range(count):
        with SyncDistributedLock(client, table="locks", key="bench"):
            pass
    return count / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=5_000, help="cycles per round (default 5000)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--seconds", type=float, default=10.0, help="handoff run (default 10)")
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="fastlease-bench-")
    clients = {
        "sqlite, c": SQLiteClient(os.path.join(directory, "c.db"), _engine_module=compiled),
        "sqlite, py": SQLiteClient(os.path.join(directory, "py.db"), _engine_module=interpreted),
        "memory, c": MemoryClient(_engine_module=compiled),
        "memory, py": MemoryClient(_engine_module=interpreted),
    }
    print(f"# sqlite_cycle: {args.rounds} interleaved rounds x {args.cycles} cycles, Python "
          f"{platform.python_version()}, {platform.machine()}, {time.strftime('%Y-%m-%d')}")
    try:
        rates: dict[str, list[float]] = {name: [] for name in clients}
        for client in clients.values():
            cycles(client, 200)  # warm-up: tables, connections, threads
        for _ in range(args.rounds):
            for name, client in clients.items():
                rates[name].append(cycles(client, args.cycles))
        print("uncontended acquire+release")
        print(f"{'store, implementation':<24}{'median cycles/s':>16}{'best cycles/s':>15}{'us/cycle':>10}")
        for name, values in rates.items():
            median = statistics.median(values)
            print(f"{name:<24}{median:>16,.0f}{max(values):>15,.0f}{1e6 / median:>10.2f}")
        sqlite_c = statistics.median(rates["sqlite, c"])
        print(f"sqlite c / py: {sqlite_c / statistics.median(rates['sqlite, py']):.2f}x   "
              f"sqlite c / memory c: {sqlite_c / statistics.median(rates['memory, c']):.3f}x")
    finally:
        for client in clients.values():
            client.close()
    print()
    print(f"# handoff: {handoff.WORKERS} processes, one key of one SQLite file, "
          f"{handoff.WORK_S * 1000:g} ms critical section, {args.seconds:g} s")
    print(f"{'setup':<{handoff.LABEL_WIDTH}}{'holds':>7}{'p50 ms':>10}{'p99 ms':>10}   {'share per worker':<23}"
          f"{'reads/acq':>11}{'reads/s wait':>14}")
    handoff.summarise("fastlease: processes, SQLite",
                      handoff.processes_on("fastlease", "sqlite:" + os.path.join(directory, "handoff.db"),
                                           args.seconds))
    shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
