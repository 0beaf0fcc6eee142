"""Where one handoff's time goes on Redis: fastlease's wake-up chain beside python-redis-lock's.

Two worker processes alternate on one key (acquire, 5 ms of work, release), ``--holds`` times each, on a
redis-server started here; the parent watches the server with MONITOR, whose stamps are the server's
wall clock. fastlease's workers also stamp their own steps on the same clock:

* the release's PUBLISH runs on the server;
* the waiter's listener thread finds the message readable (``read_response`` is entered), and parses it;
* the waiting thread, woken by the listener, calls the store's ``put_in_turn``;
* that put runs on the server (its INCR of the fencing counter).

python-redis-lock's waiter blocks in BLPOP on its own connection: only the server's two stamps are
known, from the release's signal (``lpush``) to the next ``SET NX`` of the other worker.

MONITOR makes the server and the parent busier, so every figure is larger than without it; they
compare within one run. Medians of the handoffs between the two workers (a worker that takes the key
straight back is not a handoff).
Run: ``.venv/bin/python bench/handoff_chain.py [--holds 300]``
"""

from __future__ import annotations

import argparse
import bisect
import multiprocessing
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import redis_peers  # noqa: E402  (bench/ is not a package)

WORK_S = 0.005
KEY = "hot"


def fastlease_worker(url: str, holds: int, start: Any, out: Any) -> None:
    """Hold the key ``holds`` times; report, per acquisition, the stamps of its wake-up chain (ns)."""
    from fastlease import SyncDistributedLock
    from fastlease.redis import RedisClient
    from fastlease.stores.redis.replies import pubsub_event

    client = RedisClient(url)
    store, feed = client.store, client.store.release_feed
    stamps: dict[str, int] = {}
    connect, put_in_turn = feed._connect, store.put_in_turn

    def stamped_connect() -> Any:  # the listener's connection: stamp each reply read
        connection = connect()
        read_response = connection.read_response

        def stamped_read() -> Any:
            readable = time.time_ns()
            reply = read_response()
            # A message (not a confirmation) before the put that ends the chain: the latest such woke it.
            if pubsub_event(reply)[0] == "message" and "put" not in stamps:
                stamps["readable"], stamps["parsed"] = readable, time.time_ns()
            return reply

        connection.read_response = stamped_read
        return connection

    def stamped_put(*args: Any, **options: Any) -> Any:
        if "readable" in stamps:  # (an acquisition's first attempt is a put too, before any message)
            stamps.setdefault("put", time.time_ns())
        return put_in_turn(*args, **options)

    feed._connect, store.put_in_turn = stamped_connect, stamped_put
    chains = []
    start.wait()
    try:
        for _ in range(holds):
            stamps.clear()
            with SyncDistributedLock(client, table="locks", key=KEY, lease_duration=30, wait_timeout=5):
                chains.append(dict(stamps))
                time.sleep(WORK_S)
    finally:
        client.close()
    out.put(chains)


def peer_worker(url: str, holds: int, start: Any, out: Any) -> None:
    import redis

    client = redis.Redis.from_url(url)
    start.wait()
    for _ in range(holds):
        with redis_peers.python_redis_lock(client, KEY):
            time.sleep(WORK_S)
    out.put([])


def run(library: str, holds: int) -> tuple[list[tuple[float, str, str]], list[dict[str, int]]]:
    """One setup on a server of its own: MONITOR's (time, client, command) and the workers' stamps."""
    import redis

    from fastlease.testing.redis_server import RedisServer

    server = RedisServer()
    url = server.start()
    events: list[tuple[float, str, str]] = []
    watching = threading.Event()

    def monitor() -> None:
        try:
            with redis.Redis.from_url(url).monitor() as feed:
                watching.set()
                for command in feed.listen():
                    events.append((command["time"], command["client_port"], command["command"]))
        except redis.ConnectionError:  # the server stopped
            pass

    threading.Thread(target=monitor, daemon=True).start()
    context = multiprocessing.get_context("spawn")
    start, out = context.Event(), context.Queue()
    target = fastlease_worker if library == "fastlease" else peer_worker
    workers = [context.Process(target=target, args=(url, holds, start, out)) for _ in range(2)]
    try:
        if not watching.wait(10):
            raise RuntimeError("MONITOR did not start within 10 s: no server stamps to measure with")
        for worker in workers:
            worker.start()
        start.set()
        chains = [chain for _ in workers for chain in out.get(timeout=120)]
        for worker in workers:
            worker.join(30)
        return events, chains
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.kill()
        server.stop()


def handoffs(events: list[tuple[float, str, str]], release: str, acquire: str) -> list[tuple[int, int]]:
    """(release, next acquisition by the other worker), server stamps in ns. Commands a script runs carry
    no client port: they belong to the last EVALSHA (or SET) that did."""
    pairs, last, caller = [], None, ""
    for when, port, command in events:
        if port:
            caller = port
        if command.startswith(release):
            last = (int(when * 1e9), caller)
        elif command.startswith(acquire) and last is not None:
            if caller != last[1]:
                pairs.append((last[0], int(when * 1e9)))
            last = None
    return pairs


def median_us(values: list[int]) -> str:
    return f"{statistics.median(values) / 1000:,.0f} µs" if values else "n/a"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--holds", type=int, default=300, help="acquisitions per worker (default 300)")
    holds = parser.parse_args().holds
    events, chains = run("fastlease", holds)
    pairs = handoffs(events, "PUBLISH", "INCR")
    publishes = [release for release, _ in pairs]
    incrs = sorted(acquired for _, acquired in pairs)
    steps: dict[str, list[int]] = {"readable": [], "parsed": [], "put": [], "on the server": []}
    for chain in chains:
        if not {"readable", "parsed", "put"} <= chain.keys():
            continue  # acquired without a wake-up (the key was free)
        at = bisect.bisect_right(publishes, chain["readable"]) - 1
        done = bisect.bisect_left(incrs, chain["put"])
        if at < 0 or done >= len(incrs):
            continue
        steps["readable"].append(chain["readable"] - publishes[at])
        steps["parsed"].append(chain["parsed"] - chain["readable"])
        steps["put"].append(chain["put"] - chain["parsed"])
        steps["on the server"].append(incrs[done] - chain["put"])
    print(f"fastlease, {len(pairs)} handoffs: release's PUBLISH to its next put on the server "
          f"{median_us([acquired - release for release, acquired in pairs])}")
    print(f"  PUBLISH -> listener finds it readable   {median_us(steps['readable'])}")
    print(f"  parsing the message                     {median_us(steps['parsed'])}")
    print(f"  -> waiting thread calls put_in_turn     {median_us(steps['put'])}")
    print(f"  -> the put runs on the server           {median_us(steps['on the server'])}")
    events, _ = run("redis_lock", holds)
    pairs = handoffs(events, "lpush", "SET")
    print(f"python-redis-lock, {len(pairs)} handoffs: release's signal (lpush) to the next SET NX on the server "
          f"{median_us([acquired - release for release, acquired in pairs])}")


if __name__ == "__main__":
    main()
