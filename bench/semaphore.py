"""Counted semaphores under contention: 8 worker processes loop on one semaphore of 3 (acquire, 5 ms of
work, release) for a while, side by side in one run on Redis, PostgreSQL and SQLite (servers started
here), and on Redis against a semaphore built by hand from 3 redis-py ``Lock``s (bench/redis_peers.py).

Reported per setup: holds per second; the wait of each acquisition (from the guard's creation to the
hold), p50 and p99; each worker's share of the holds, the lowest against the fair share (1/8); reads per
acquisition (fastlease only: the others do not count theirs); and, from the holds' intervals on the
system-wide monotonic clock, the most holders at once (at most 3 for a correct semaphore).
Run: ``.venv/bin/python bench/semaphore.py [--seconds 8] [--stores redis,postgres,sqlite]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from typing import Any

import handoff

WORKERS = 8
SECTIONS = ("redis", "postgres", "sqlite")


def summarise(name: str, results: list[dict[str, Any]], seconds: float) -> None:
    for worker, result in enumerate(results):
        if "error" in result:
            print(f"  ({name}: worker {worker} failed: {result['error']})")
    holds = [hold for result in results for hold in result["holds"]]
    waits_ms = sorted(wait * 1000 for result in results for wait in result["waits"])
    total = len(holds)
    shares = [len(result["holds"]) / total if total else 0.0 for result in results]
    # Ends sort before starts at one instant: a release and the next acquisition never count as two at once.
    most = now = 0
    for _, starts in sorted([(start, 1) for start, _ in holds] + [(end, 0) for _, end in holds]):
        now += 1 if starts else -1
        most = max(most, now)
    p50 = statistics.median(waits_ms) if waits_ms else float("nan")
    p99 = waits_ms[int(len(waits_ms) * 0.99)] if waits_ms else float("nan")
    if any(result["reads"] is None for result in results):
        reads = f"{'n/a':>9}"
    else:
        reads = f"{sum(result['reads'] for result in results) / max(total, 1):>9.2f}"
    print(f"{name:<34}{total / seconds:>8.1f}{p50:>9.1f}{p99:>9.1f}{min(shares) * WORKERS:>11.2f}{reads}{most:>9}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--stores", default=",".join(SECTIONS), help=f"comma-separated, of {', '.join(SECTIONS)}")
    args = parser.parse_args()
    chosen = args.stores.split(",")
    unknown = sorted(set(chosen) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown stores {unknown}: choose from {', '.join(SECTIONS)}")
    print(f"{WORKERS} processes on a semaphore of {handoff.SEMAPHORE_LIMIT}, {handoff.WORK_S * 1000:g} ms of work "
          f"per hold, {args.seconds:g} s each, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"{'setup':<34}{'holds/s':>8}{'p50 ms':>9}{'p99 ms':>9}{'min share':>11}{'reads':>9}{'most':>9}")
    print(f"{'':<34}{'':>8}{'wait':>9}{'wait':>9}{'(of fair)':>11}{'/ acq':>9}{'at once':>9}")
    run = lambda library, endpoint: handoff.processes_on(library, endpoint, args.seconds, WORKERS)  # noqa: E731
    if "redis" in chosen:
        from fastlease.testing.redis_server import RedisServer

        with RedisServer() as server:
            summarise("fastlease Semaphore: Redis", run(handoff.SEMAPHORE, server.url), args.seconds)
            summarise("3 redis-py Locks by hand: Redis", run("redis-py-semaphore", server.url), args.seconds)
    if "postgres" in chosen:
        from fastlease import PostgresClient
        from fastlease.testing.postgres_server import PostgresServer

        with PostgresServer() as server:
            admin = PostgresClient(server.dsn)
            admin.create_lock_table(handoff.TABLE)
            admin.close()
            summarise("fastlease Semaphore: PostgreSQL", run(handoff.SEMAPHORE, server.dsn), args.seconds)
    if "sqlite" in chosen:
        with tempfile.TemporaryDirectory() as directory:
            endpoint = f"sqlite:{directory}/semaphore.db"
            summarise("fastlease Semaphore: SQLite", run(handoff.SEMAPHORE, endpoint), args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
