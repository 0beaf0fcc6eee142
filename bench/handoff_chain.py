"""Where one handoff's time goes on Redis: fastlease's wake-up chain beside python-redis-lock's.

Two worker processes alternate on one key (acquire, 5 ms of work, release), ``--holds`` times each, on a
redis-server started here; the parent watches the server with MONITOR, whose stamps are the server's
wall clock. The workers stamp their own steps on the same clock. fastlease's release hands the lease
over to the waiter in its own script (docs/protocol.md, "The handover on Redis"), so its chain is:

* the release's PUBLISH runs on the server (after its handover's INCR of the fencing counter);
* the waiter finds the message readable (``read_response`` is entered on the feed's connection: by the
  waiting thread itself, which reads it while it waits in line, or by the listener thread), and parses it;
* the waiting thread holds the lease (its ``with`` block begins).

python-redis-lock's waiter blocks in BLPOP on its own connection: from the release's signal (``lpush``)
to the next ``SET NX`` of the other worker on the server, then to that worker's ``with`` block.

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
    feed = client.store.release_feed
    stamps: dict[str, int] = {}
    connect = feed._connect

    def stamped_connect() -> Any:  # the feed's connection: stamp each reply read, and by which thread
        connection = connect()
        read_response = connection.read_response

        def stamped_read() -> Any:
            readable = time.time_ns()
            reply = read_response()
            # A message (not a confirmation) before the hold that ends the chain: the latest such woke it.
            if pubsub_event(reply)[0] == "message":
                stamps["readable"], stamps["parsed"] = readable, time.time_ns()
                stamps["by_waiter"] = int(threading.current_thread() is threading.main_thread())
            return reply

        connection.read_response = stamped_read
        return connection

    feed._connect = stamped_connect
    chains = []
    out.put("ready")  # (connected and imported: the two start together)
    start.wait()
    try:
        for _ in range(holds):
            stamps.clear()
            with SyncDistributedLock(client, table="locks", key=KEY, lease_duration=30, wait_timeout=5):
                chain = {**stamps, "held": time.time_ns()}
                time.sleep(WORK_S)
                chain["released"] = time.time_ns()
            chains.append(chain)
    finally:
        client.close()
    out.put(chains)


def peer_worker(url: str, holds: int, start: Any, out: Any) -> None:
    import redis

    client = redis.Redis.from_url(url)
    client.ping()
    chains = []
    out.put("ready")
    start.wait()
    for _ in range(holds):
        with redis_peers.python_redis_lock(client, KEY):
            chain = {"held": time.time_ns()}
            time.sleep(WORK_S)
            chain["released"] = time.time_ns()
        chains.append(chain)
    out.put(chains)


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
        if [out.get(timeout=60) for _ in workers] != ["ready"] * len(workers):
            raise RuntimeError("a worker did not get ready")
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


def before(stamps: list[int], when: int) -> int:
    """The latest of the sorted ``stamps`` before ``when`` (-1: none)."""
    at = bisect.bisect_right(stamps, when) - 1
    return stamps[at] if at >= 0 else -1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--holds", type=int, default=300, help="acquisitions per worker (default 300)")
    holds = parser.parse_args().holds
    events, chains = run("fastlease", holds)
    publishes = sorted(int(when * 1e9) for when, _, command in events if command.startswith("PUBLISH"))
    releases = sorted(chain["released"] for chain in chains)
    steps: dict[str, list[int]] = {"release": [], "readable": [], "parsed": [], "held": [], "whole": []}
    woken = []
    for chain in chains:
        publish = before(publishes, chain.get("readable", -1))
        released = before(releases, publish)
        if "readable" not in chain or publish < 0 or released < 0:
            continue  # acquired without a wake-up (the key was free)
        woken.append(chain)
        steps["release"].append(publish - released)
        steps["readable"].append(chain["readable"] - publish)
        steps["parsed"].append(chain["parsed"] - chain["readable"])
        steps["held"].append(chain["held"] - chain["parsed"])
        steps["whole"].append(chain["held"] - released)
    print(f"fastlease, {len(steps['whole'])} handoffs: from the holder's release to the next hold "
          f"{median_us(steps['whole'])}")
    print(f"  the release runs on the server (its handover, its PUBLISH)  {median_us(steps['release'])}")
    by_waiter = sum(chain.get("by_waiter", 0) for chain in woken)
    print(f"  -> the waiter finds the message readable                    {median_us(steps['readable'])}"
          f"  (read by the waiting thread itself: {by_waiter} of {len(woken)})")
    print(f"  -> it has parsed the message                                {median_us(steps['parsed'])}")
    print(f"  -> the waiting thread holds the lease                       {median_us(steps['held'])}")
    events, chains = run("redis_lock", holds)
    releases = sorted(chain["released"] for chain in chains)
    helds = sorted(chain["held"] for chain in chains)
    peer: dict[str, list[int]] = {"release": [], "set": [], "held": [], "whole": []}
    for signal, acquired in handoffs(events, "lpush", "SET"):
        released, at = before(releases, signal), bisect.bisect_left(helds, acquired)
        if released < 0 or at >= len(helds):
            continue
        peer["release"].append(signal - released)
        peer["set"].append(acquired - signal)
        peer["held"].append(helds[at] - acquired)
        peer["whole"].append(helds[at] - released)
    print(f"python-redis-lock, {len(peer['whole'])} handoffs: from the holder's release to the next hold "
          f"{median_us(peer['whole'])}")
    print(f"  the release runs on the server (its signal, lpush)          {median_us(peer['release'])}")
    print(f"  -> the waiter's BLPOP returns and its SET NX runs            {median_us(peer['set'])}")
    print(f"  -> the waiting thread holds the lock                        {median_us(peer['held'])}")


if __name__ == "__main__":
    main()
