"""Uncontended acquire+release cycles per second on the in-memory store, side by side in one run:
fastlease's compiled core (c), its pure-Python twin (py) and pydynox 1.8.0's MemoryBackend.

Rounds are interleaved so that machine noise (±25% on shared 2-core hosts) hits every contender alike;
the median and best round of each are printed, with the ratios. Run: ``make bench`` or
``.venv/bin/python bench/memory_cycle.py [--cycles N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from typing import Callable

import fastlease._core as compiled
import fastlease._core_py as twin
from fastlease import MemoryClient, SyncDistributedLock


def fastlease_cycle(core) -> tuple[Callable[[int], None], Callable[[], None]]:
    client = MemoryClient(_core=core)

    def run(cycles: int) -> None:
        for _ in range(cycles):
            with SyncDistributedLock(client, table="locks", key="bench"):
                pass

    return run, client.close


def pydynox_cycle() -> tuple[Callable[[int], None], Callable[[], None]]:
    from pydynox.lock import SyncDistributedLock as PydynoxLock
    from pydynox.testing import MemoryBackend

    backend = MemoryBackend()
    backend.__enter__()
    client = backend.client
    client.sync_create_table("locks", partition_key=("key", "S"))

    def run(cycles: int) -> None:
        for _ in range(cycles):
            with PydynoxLock(client, table="locks", key="bench"):
                pass

    return run, lambda: backend.__exit__(None, None, None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=20_000, help="cycles per round (default 20000)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    args = parser.parse_args()

    contenders = {"c": fastlease_cycle(compiled), "py": fastlease_cycle(twin)}
    try:
        import pydynox

        contenders[f"pydynox {pydynox.__version__}"] = pydynox_cycle()
    except ImportError:
        print("pydynox is not installed (make bench installs it); comparing c and py only", file=sys.stderr)

    for run, _ in contenders.values():
        run(1000)  # warm-up
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(args.rounds):
        for name, (run, _) in contenders.items():
            start = time.perf_counter()
            run(args.cycles)
            rates[name].append(args.cycles / (time.perf_counter() - start))
    for _, close in contenders.values():
        close()

    print(f"# memory_cycle: {args.rounds} interleaved rounds x {args.cycles} cycles, "
          f"Python {platform.python_version()}, {platform.machine()}, {time.strftime('%Y-%m-%d')}")
    print(f"{'implementation':<16}{'median cycles/s':>17}{'best cycles/s':>15}{'us/cycle':>10}")
    medians = {}
    for name, values in rates.items():
        medians[name] = statistics.median(values)
        print(f"{name:<16}{medians[name]:>17,.0f}{max(values):>15,.0f}{1e6 / medians[name]:>10.2f}")
    print(f"c / py: {medians['c'] / medians['py']:.2f}x")
    for name in medians:
        if name.startswith("pydynox"):
            print(f"c / {name}: {medians['c'] / medians[name]:.2f}x   "
                  f"py / {name}: {medians['py'] / medians[name]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
