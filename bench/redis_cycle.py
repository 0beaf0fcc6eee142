"""Uncontended acquire+release cycles on one redis-server and on a Redis Cluster: fastlease against the Redis
locks people use.

Side by side in one run, in interleaved rounds (machine noise of ±25% then hits every contender alike),
each on its own key, on one redis-server and one three-node Redis Cluster (no replicas), both started
here (127.0.0.1, no persistence) and stopped by PID at the end:
  * fastlease with the compiled engine (c) and the same engine interpreted (py): one script to acquire (with the
    fencing token), one to release; on the cluster each request goes to the node of its key's slot;
  * on the single node: redis-py's ``Lock``, python-redis-lock and the seed article's SET NX PX + Lua release
    (``bench/redis_peers.py``); on the cluster: redis-py's ``Lock`` on a ``redis.cluster.RedisCluster``.
Reported: median and best cycles/s, wall time per cycle, client CPU per cycle (process CPU time: every
thread of this process, divided by the cycles) and round trips per cycle (counted, in an untimed pass:
each reply this thread read from a redis-py connection, one per request it sent and waited for). Every
client uses redis-py's connections (its pure-Python parser unless hiredis is installed; the same for all).

Run: ``.venv/bin/python bench/redis_cycle.py [--cycles N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import threading
import time
from contextlib import ExitStack
from typing import Any, Callable

import redis
import redis.connection
import redis_peers

from fastlease import SyncDistributedLock, _impl
from fastlease.redis import RedisClient
from fastlease.testing.redis_cluster import RedisClusterServer
from fastlease.testing.redis_server import RedisServer

compiled = _impl.load("c")  # built by make test; missing, the module fails to collect (never skips)
interpreted = _impl.load("py")
#: Cycles of the untimed pass that counts round trips.
COUNTED_CYCLES = 200
#: The contenders whose figures the summary compares, on the single node and on the cluster.
OURS, CLUSTER_OURS, CLUSTER_PEER = "fastlease, c", "cluster: fastlease, c", "cluster: redis-py"


def measure(cycle: Callable[[], None], count: int) -> tuple[float, float]:
    """(cycles per second, CPU microseconds per cycle)."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(count):
        cycle()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return count / wall, cpu / count * 1e6


def round_trips(cycle: Callable[[], None], count: int = COUNTED_CYCLES) -> float:
    """Round trips per cycle: the replies this thread reads from any redis-py connection during ``count``
    cycles (no contender pipelines, so each is one request sent and waited for; a MOVED reply would count
    too). Replies read by other threads (fastlease's release feed) are not requests of the cycle."""
    original = redis.connection.AbstractConnection.read_response
    counting = threading.get_ident()
    replies = 0

    def read_response(self: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal replies
        if threading.get_ident() == counting:
            replies += 1
        return original(self, *args, **kwargs)

    redis.connection.AbstractConnection.read_response = read_response  # type: ignore[method-assign]
    try:
        for _ in range(count):
            cycle()
    finally:
        redis.connection.AbstractConnection.read_response = original  # type: ignore[method-assign]
    return replies / count


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
    with ExitStack() as stack:  # unwinds in reverse: the clients first, then the nodes, each by its PID
        server = stack.enter_context(RedisServer())
        cluster = stack.enter_context(RedisClusterServer())

        def client(made: Any) -> Any:
            stack.callback(made.close)
            return made

        plain = client(redis.Redis.from_url(server.url))
        contenders = {
            OURS: fastlease_cycle(client(RedisClient(server.url, _engine_module=compiled)), "cycle-c"),
            "fastlease, py": fastlease_cycle(client(RedisClient(server.url, _engine_module=interpreted)), "cycle-py"),
            **{name: peer_cycle(name, plain) for name in redis_peers.GUARDS},
            CLUSTER_OURS: fastlease_cycle(client(RedisClient(cluster.url, _engine_module=compiled)), "cycle-c"),
            "cluster: fastlease, py": fastlease_cycle(client(RedisClient(cluster.url, _engine_module=interpreted)),
                                                      "cycle-py"),
            CLUSTER_PEER: peer_cycle("redis-py", client(redis_peers.cluster_client(cluster.url))),
        }
        print(f"# redis_cycle: {args.rounds} interleaved rounds x {args.cycles} cycles, redis-server "
              f"{plain.info('server')['redis_version']} (one node, and a cluster of {len(cluster.nodes)} primaries), "
              f"redis-py {redis.__version__}, Python {platform.python_version()}, {platform.machine()}, "
              f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC")
        rates: dict[str, list[float]] = {name: [] for name in contenders}
        cpus: dict[str, list[float]] = {name: [] for name in contenders}
        for cycle in contenders.values():
            measure(cycle, 200)  # warm-up: connections, scripts, slot maps, threads
        trips = {name: round_trips(cycle) for name, cycle in contenders.items()}
        for _ in range(args.rounds):
            for name, cycle in contenders.items():
                rate, cpu = measure(cycle, args.cycles)
                rates[name].append(rate)
                cpus[name].append(cpu)
    print("uncontended acquire+release")
    print(f"{'lock':<24}{'median cycles/s':>16}{'best cycles/s':>15}{'us/cycle':>10}{'CPU us/cycle':>14}"
          f"{'round trips':>13}")
    for name in contenders:
        median = statistics.median(rates[name])
        print(f"{name:<24}{median:>16,.0f}{max(rates[name]):>15,.0f}{1e6 / median:>10.1f}"
              f"{statistics.median(cpus[name]):>14.1f}{trips[name]:>13.2f}")

    def against(ours: str, peers: list[str]) -> str:
        rate, cpu = statistics.median(rates[ours]), statistics.median(cpus[ours])
        return ", ".join(f"{peer} {rate / statistics.median(rates[peer]):.2f}x its cycles/s at "
                         f"{cpu / statistics.median(cpus[peer]):.2f}x its client CPU" for peer in peers)

    print(f"{OURS} against: " + against(OURS, list(redis_peers.GUARDS)))
    print(f"{CLUSTER_OURS} against: " + against(CLUSTER_OURS, [CLUSTER_PEER, OURS]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
