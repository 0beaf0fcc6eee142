"""Uncontended acquire+release cycles per second on the in-memory store (``with``, decorator and
``async with``), side by side in one run:
fastlease's compiled engine (c), the same engine interpreted (py) and pydynox 1.8.0's MemoryBackend.
With opentelemetry-sdk installed, also both engines instrumented (``fastlease.otel.instrument``, rows
``c otel`` and ``py otel``): every span is made and every metric point aggregated by the SDK, nothing
is exported; the plain rows are the uninstrumented cost, one attribute check per event.

Rounds are interleaved so that machine noise (±25% on shared 2-core hosts) hits every contender alike;
the median and best round of each are printed, with the ratios. Run: ``make bench`` or
``.venv/bin/python bench/memory_cycle.py [--cycles N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import sys
import time
from typing import Any, Callable

from fastlease import DistributedLock, MemoryClient, SyncDistributedLock, _impl, distributed_lock

compiled = _impl.load("c")  # built by make test; missing, the module fails to collect (never skips)
interpreted = _impl.load("py")

Runner = Callable[[int], None]


def context_and_decorator(lock_class: Any, decorator: Any, client: Any, async_class: Any) -> dict[str, Runner]:
    """The same three workloads for every library: a ``with`` block, a decorated function, and an
    ``async with`` block run by one event loop."""

    def with_block(cycles: int) -> None:
        for _ in range(cycles):
            with lock_class(client, table="locks", key="bench"):
                pass

    @decorator(client, table="locks", key="bench:{item}")
    def decorated(item: str) -> None:
        pass

    def decorated_calls(cycles: int) -> None:
        for _ in range(cycles):
            decorated("x")

    def async_block(cycles: int) -> None:
        async def loop() -> None:
            for _ in range(cycles):
                async with async_class(client, table="locks", key="bench-async"):
                    pass

        asyncio.run(loop())

    return {"with": with_block, "decorator": decorated_calls, "async with": async_block}


def fastlease_runners(core: Any, otel: bool = False) -> tuple[dict[str, Runner], Callable[[], None]]:
    client = MemoryClient(_engine_module=core)
    if otel:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider

        from fastlease.otel import instrument

        instrument(client, tracer_provider=TracerProvider(),
                   meter_provider=MeterProvider(metric_readers=[InMemoryMetricReader()]))
    return context_and_decorator(SyncDistributedLock, distributed_lock, client, DistributedLock), client.close


def pydynox_runners() -> tuple[dict[str, Runner], Callable[[], None]]:
    from pydynox.lock import DistributedLock as PydynoxAsyncLock
    from pydynox.lock import SyncDistributedLock as PydynoxLock
    from pydynox.lock import distributed_lock as pydynox_lock
    from pydynox.testing import MemoryBackend

    backend = MemoryBackend()
    backend.__enter__()
    client = backend.client
    client.sync_create_table("locks", partition_key=("key", "S"))
    runners = context_and_decorator(PydynoxLock, pydynox_lock, client, PydynoxAsyncLock)
    return runners, lambda: backend.__exit__(None, None, None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=20_000, help="cycles per round (default 20000)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    args = parser.parse_args()

    contenders = {"c": fastlease_runners(compiled), "py": fastlease_runners(interpreted)}
    try:
        import pydynox

        contenders[f"pydynox {pydynox.__version__}"] = pydynox_runners()
    except ImportError:
        print("pydynox is not installed (make bench installs it); comparing c and py only", file=sys.stderr)
    try:
        import opentelemetry.sdk  # noqa: F401

        contenders["c otel"] = fastlease_runners(compiled, otel=True)
        contenders["py otel"] = fastlease_runners(interpreted, otel=True)
    except ImportError:
        print("opentelemetry-sdk is not installed (make bench installs it): no instrumented rows", file=sys.stderr)

    print(f"# memory_cycle: {args.rounds} interleaved rounds x {args.cycles} cycles, "
          f"Python {platform.python_version()}, {platform.machine()}, {time.strftime('%Y-%m-%d')}")
    for workload in ("with", "decorator", "async with"):
        cycles = args.cycles if workload != "async with" else max(args.cycles // 10, 100)
        for runners, _ in contenders.values():
            runners[workload](min(cycles, 1000))  # warm-up
        rates: dict[str, list[float]] = {name: [] for name in contenders}
        for _ in range(args.rounds):
            for name, (runners, _) in contenders.items():
                start = time.perf_counter()
                runners[workload](cycles)
                rates[name].append(cycles / (time.perf_counter() - start))
        print(f"\n{workload} workload: uncontended acquire+release")
        print(f"{'implementation':<16}{'median cycles/s':>17}{'best cycles/s':>15}{'us/cycle':>10}")
        medians = {}
        for name, values in rates.items():
            medians[name] = statistics.median(values)
            print(f"{name:<16}{medians[name]:>17,.0f}{max(values):>15,.0f}{1e6 / medians[name]:>10.2f}")
        print(f"c / py: {medians['c'] / medians['py']:.2f}x")
        if "c otel" in medians:
            print(f"instrumented / plain: c {medians['c otel'] / medians['c']:.2f}x   "
                  f"py {medians['py otel'] / medians['py']:.2f}x")
        for name in medians:
            if name.startswith("pydynox"):
                print(f"c / {name}: {medians['c'] / medians[name]:.2f}x   "
                      f"py / {name}: {medians['py'] / medians[name]:.2f}x")
    for _, close in contenders.values():
        close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
