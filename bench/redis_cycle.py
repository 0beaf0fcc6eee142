"""Uncontended acquire+release cycles on one redis-server: fastlease against the Redis locks people use.

Side by side in one run, on one redis-server started here (127.0.0.1, no persistence), in interleaved
rounds (machine noise of ±25% then hits every contender alike), each on its own key:
  * fastlease with the compiled engine (c) and the same engine interpreted (py): one script to acquire (with the
    fencing token), one to release;
  * redis-py's ``Lock``, python-redis-lock and the seed article's SET NX PX + Lua release
    (``bench/redis_peers.py``).
Reported: median and best cycles/s, wall time per cycle, and client CPU per cycle (process CPU time:
every thread of this process, divided by the cycles). Every client is on the same server and all use
redis-py's connections (its pure-Python parser unless hiredis is installed; the same for all).

Run: ``.venv/bin/python bench/redis_cycle.py [--cycles N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from typing import Any, Callable

import redis
import redis_peers

from fastlease import SyncDistributedLock, _impl
from fastlease.redis import RedisClient
from fastlease.testing.redis_server import RedisServer

compiled = _impl.load("c")  # built by make test; missing, the module fails to collect (never skips)
interpreted = _impl.load("py")


def measure(cycle: Callable[[], None], count: int) -> tuple[float, float]:
    """(cycles per second, CPU microseconds per cycle)."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(count):
        cycle()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return count / wall, cpu / count * 1e6


def fastlease_cycle(client: RedisClient, key: str) -> Callable[[], None]:
    def cycle() -> None:
        with SyncDistributedLock(client, table="bench", key=key):
            pass

    return cycle


def peer_cycle(name: str, client: Any) -> Callable[[], None]:
    guard = redis_peers.GUARDS[name]

    def cycle() -> None:
        with guard(client, f"cycle-{name}"):
            pass

    return cycle


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=3_000, help="cycles per round (default 3000)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    args = parser.parse_args()
    with RedisServer() as server:
        fastlease_c = RedisClient(server.url, _engine_module=compiled)
        fastlease_py = RedisClient(server.url, _engine_module=interpreted)
        plain = redis.Redis.from_url(server.url)
        contenders = {
            "fastlease, c": fastlease_cycle(fastlease_c, "cycle-c"),
            "fastlease, py": fastlease_cycle(fastlease_py, "cycle-py"),
            **{name: peer_cycle(name, plain) for name in redis_peers.GUARDS},
        }
        print(f"# redis_cycle: {args.rounds} interleaved rounds x {args.cycles} cycles, redis-server "
              f"{plain.info('server')['redis_version']}, redis-py {redis.__version__}, Python "
              f"{platform.python_version()}, {platform.machine()}, {time.strftime('%Y-%m-%d')}")
        try:
            rates: dict[str, list[float]] = {name: [] for name in contenders}
            cpus: dict[str, list[float]] = {name: [] for name in contenders}
            for cycle in contenders.values():
                measure(cycle, 200)  # warm-up: connections, scripts, threads
            for _ in range(args.rounds):
                for name, cycle in contenders.items():
                    rate, cpu = measure(cycle, args.cycles)
                    rates[name].append(rate)
                    cpus[name].append(cpu)
        finally:
            fastlease_c.close()
            fastlease_py.close()
            plain.close()
    print("uncontended acquire+release")
    print(f"{'lock':<16}{'median cycles/s':>16}{'best cycles/s':>15}{'us/cycle':>10}{'CPU us/cycle':>14}")
    for name in contenders:
        median = statistics.median(rates[name])
        print(f"{name:<16}{median:>16,.0f}{max(rates[name]):>15,.0f}{1e6 / median:>10.1f}"
              f"{statistics.median(cpus[name]):>14.1f}")
    ours = statistics.median(rates["fastlease, c"])
    ours_cpu = statistics.median(cpus["fastlease, c"])
    print("fastlease c against: " + ", ".join(
        f"{name} {ours / statistics.median(rates[name]):.2f}x cycles/s, "
        f"{statistics.median(cpus[name]) / ours_cpu:.2f}x its CPU" for name in redis_peers.GUARDS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
