"""Handoff between contenders: 4 workers loop on one key (acquire, 5 ms of work, release) for a while.

Side by side in one run:
  * threads sharing one client on the in-memory store: fastlease and pydynox 1.8.0;
  * processes (spawn), one client each, against one serialised moto DynamoDB server: the same two;
  * processes against one redis-server (started here): fastlease with its wake-up on release, fastlease
    polling only (``wake_on_release=False``), redis-py's ``Lock`` (polls every 0.1 s),
    python-redis-lock (BLPOP wake-up) and the seed article's hand-written SET NX PX loop (polls every
    0.05 s);
  * processes against a three-node Redis Cluster (started here, ``fastlease.testing.redis_cluster``):
    fastlease with its wake-up on release (sharded pub/sub), fastlease polling only, and redis-py's
    ``Lock`` on a ``redis.cluster.RedisCluster``.
Only fastlease reports its reads (n/a for the others). Each process starts its clock once all of them
have imported and connected.

Reported: handoff latency p50/p99 (from one holder's release to the next acquisition by another
worker, on the system-wide monotonic clock), each worker's share of the acquisitions, and reads per
acquisition and per waiting second; under each row, how long the holds lasted (the work, and whatever
delayed the holder's return from it).
Run: ``.venv/bin/python bench/handoff.py [--seconds 8] [--stores memory,dynamodb,redis,redis-cluster]
[--workers 4]``; ``--workers 17`` keeps 16 processes waiting while one holds (how reads grow with the waiters).
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import statistics
import sys
import threading
import time
from contextlib import contextmanager
from typing import Any

WORKERS = 4
WORK_S = 0.005
TABLE = "handoff_locks"
#: The Redis peers (bench/redis_peers.py), run only in the Redis section.
REDIS_PEERS = ("redis-py", "redis_lock", "article")
#: bench/semaphore.py's setups: fastlease's Semaphore of SEMAPHORE_LIMIT, and the semaphore built by hand
#: from that many redis-py Locks (bench/redis_peers.py).
SEMAPHORE = "semaphore"
SEMAPHORE_PEERS = ("redis-py-semaphore",)
SEMAPHORE_LIMIT = 3
#: The sections of a run, in order (``--stores``).
SECTIONS = ("memory", "dynamodb", "redis", "redis-cluster")
#: Width of the setup column.
LABEL_WIDTH = 40
#: The PostgreSQL reference (bench/postgres_cycle.py): a session-level advisory lock, blocking
#: (``pg_advisory_lock``) on the worker's own autocommit connection, given up after 5 s (lock_timeout).
ADVISORY = "advisory"
ADVISORY_KEY = 0x666C_6861_6E64  # one bigint key for the handoff, outside the cycle bench's
#: How long a worker process may take to import and connect, and then to see the start signal.
READY_TIMEOUT_S = 60.0
#: From the start signal to the common start: enough for every ready worker to wake up first.
START_MARGIN_S = 0.1
CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": "us-east-1"}


def run_worker(library: str, client: Any, seconds: float, start_at: float) -> dict[str, Any]:
    """Loop until the shared deadline; return hold intervals, reads and waiting time."""
    if library == "fastlease":
        from fastlease import LockNotAcquired, SyncDistributedLock

        def guard() -> Any:
            return SyncDistributedLock(client, table=TABLE, key="hot", lease_duration=30, wait_timeout=5)
    elif library == SEMAPHORE:
        from fastlease import LockNotAcquired, Semaphore

        def guard() -> Any:
            return Semaphore(client, table=TABLE, key="hot", limit=SEMAPHORE_LIMIT, lease_duration=30, wait_timeout=5)
    elif library in REDIS_PEERS or library in SEMAPHORE_PEERS:
        import redis_peers

        LockNotAcquired = redis_peers.NotAcquired  # type: ignore[misc,assignment]  # noqa: N806

        def guard() -> Any:
            return redis_peers.GUARDS[library](client, "hot")
    elif library == ADVISORY:
        import psycopg

        LockNotAcquired = psycopg.errors.LockNotAvailable  # type: ignore[misc,assignment]  # noqa: N806
        client.execute("SET lock_timeout = '5s'")

        @contextmanager
        def guard() -> Any:
            client.execute("SELECT pg_advisory_lock(%s)", (ADVISORY_KEY,))
            try:
                yield
            finally:
                client.execute("SELECT pg_advisory_unlock(%s)", (ADVISORY_KEY,))
    else:
        from pydynox.exceptions import LockNotAcquired  # type: ignore[no-redef]
        from pydynox.lock import SyncDistributedLock as PydynoxLock

        def guard() -> Any:
            return PydynoxLock(client, table=TABLE, key="hot", lease_duration=30, wait_timeout=5)

    holds, waits, reads, writes, waited_ms = [], [], 0, 0, 0.0
    while time.monotonic() < start_at:
        time.sleep(0.001)
    deadline = start_at + seconds
    while time.monotonic() < deadline:
        lock = guard()
        tried = time.monotonic()
        try:
            with lock:
                acquired = time.monotonic()
                time.sleep(WORK_S)
                released = time.monotonic()
        except LockNotAcquired:
            continue
        finally:
            metrics = getattr(lock, "metrics", None)
            if metrics is not None:
                reads += metrics.read_requests
                writes += metrics.write_requests
                waited_ms += metrics.wait_ms
        holds.append((acquired, released))
        waits.append(acquired - tried)
    if library in REDIS_PEERS or library in SEMAPHORE_PEERS or library == ADVISORY:
        return {"holds": holds, "waits": waits, "reads": None, "waited_ms": 0.0}
    feed = getattr(getattr(client, "store", None), "release_feed", None)  # (the release messages it read)
    return {"holds": holds, "waits": waits, "reads": reads, "writes": writes, "waited_ms": waited_ms,
            "messages": None if feed is None else feed.received}


def process_worker(library: str, endpoint: str, seconds: float, start: Any, go: Any, out: Any) -> None:
    """One worker process: connect, say "ready" on ``out``, wait for ``go``, run from ``start.value`` (the
    parent sets it once every worker is ready) and send the result on ``out``."""
    if endpoint.startswith("sqlite:"):
        from fastlease import SQLiteClient

        client: Any = SQLiteClient(endpoint[len("sqlite:"):])
    elif endpoint.startswith(("redis://", "redis+cluster://")):
        from fastlease.redis import RedisClient

        if library in REDIS_PEERS or library in SEMAPHORE_PEERS:
            import redis
            import redis_peers

            client = (redis.Redis.from_url(endpoint) if endpoint.startswith("redis://")
                      else redis_peers.cluster_client(endpoint))
        else:
            client = RedisClient(endpoint, wake_on_release=library != "fastlease-polling")
            library = "fastlease" if library == "fastlease-polling" else library
    elif endpoint.startswith("postgresql://"):
        if library == ADVISORY:
            import psycopg

            client = psycopg.connect(endpoint, autocommit=True)
        else:
            from fastlease.postgres import PostgresClient

            if library == "fastlease-lineless":  # its table has no line: the store says so once, as expected
                logging.getLogger("fastlease.stores.postgres").setLevel(logging.ERROR)
                library = "fastlease"
            client = PostgresClient(endpoint)
    elif library == "fastlease":
        import boto3

        from fastlease.dynamodb import DynamoDBClient

        client = DynamoDBClient(session=boto3.session.Session(**CREDENTIALS), endpoint_url=endpoint)
    else:
        from pydynox import DynamoDBClient as PydynoxClient

        client = PydynoxClient(region="us-east-1", access_key="testing", secret_key="testing", endpoint_url=endpoint)
    out.send("ready")
    if not go.wait(READY_TIMEOUT_S):
        out.send({"holds": [], "waits": [], "reads": 0, "waited_ms": 0.0, "error": "no start signal from the parent"})
        return
    try:
        out.send(run_worker(library, client, seconds, start.value))
    except BaseException as error:  # reported by the parent, not lost with the process
        out.send({"holds": [], "waits": [], "reads": 0, "waited_ms": 0.0, "error": f"{type(error).__name__}: {error}"})


def summarise(name: str, results: list[dict[str, Any]]) -> None:
    for worker, result in enumerate(results):
        if "error" in result:
            print(f"  ({name}: worker {worker} failed: {result['error']})")
    timeline = sorted((start, end, worker) for worker, result in enumerate(results) for start, end in result["holds"])
    # A handoff is the gap from one holder's release to the next acquisition by *another* worker;
    # a worker taking the key straight back is not a handoff (and is what starves the others).
    handoffs = [max(0.0, nxt[0] - cur[1]) * 1000 for cur, nxt in zip(timeline, timeline[1:]) if nxt[2] != cur[2]]
    total = len(timeline)
    shares = [len(result["holds"]) / total * 100 if total else 0.0 for result in results]
    # Beyond 4 workers, the lowest and highest shares (each worker's would not fit the column).
    share_text = " ".join(f"{s:4.0f}%" for s in shares) if len(shares) <= 4 else \
        f"min {min(shares):.0f}% max {max(shares):.0f}%"
    p50 = statistics.median(handoffs) if handoffs else float("nan")
    p99 = sorted(handoffs)[int(len(handoffs) * 0.99)] if handoffs else float("nan")
    if any(result["reads"] is None for result in results):
        read_columns = f"{'n/a':>11}{'n/a':>14}"
    else:
        reads = sum(result["reads"] for result in results)
        waited_s = sum(result["waited_ms"] for result in results) / 1000
        read_columns = f"{reads / max(total, 1):>11.2f}{reads / max(waited_s, 1e-9):>14.1f}"
    print(f"{name:<{LABEL_WIDTH}}{total:>7}{p50:>10.2f}{p99:>10.1f}   {share_text:<23}"
          + read_columns)
    # How long each hold lasted, its WORK_S of sleep included: time that another thread or process took
    # from the holder's return from that sleep shows here, and costs holds as a slow handoff would.
    lengths = sorted((end - start) * 1000 for start, end, _ in timeline)
    if lengths:
        print(f"  (holds lasted {statistics.fmean(lengths):.2f} ms on average, p99 "
              f"{lengths[int(len(lengths) * 0.99)]:.1f} ms, for {WORK_S * 1000:g} ms of work)")
    messages = [result.get("messages") for result in results]
    if messages and all(count is not None for count in messages) and sum(messages):  # (none when polling only)
        per_acquisition = sum(messages) / max(total, 1)
        print(f"  (release messages read by all the workers' feeds: {per_acquisition:.2f} per acquisition)")
    if total and all(result.get("writes") is not None for result in results):  # (fastlease's rows)
        writes = sum(result["writes"] for result in results) / total
        print(f"  (writes per acquisition, its release's included: {writes:.2f})")


def threads_on_memory(library: str, seconds: float, workers: int = WORKERS) -> list[dict[str, Any]]:
    if library == "fastlease":
        from fastlease import MemoryClient

        client: Any = MemoryClient()
        backend = None
    else:
        from pydynox.testing import MemoryBackend

        backend = MemoryBackend()
        backend.__enter__()
        client = backend.client
        client.sync_create_table(TABLE, partition_key=("key", "S"))
    results: list[Any] = [None] * workers
    start_at = time.monotonic() + 0.2

    def work(index: int) -> None:
        results[index] = run_worker(library, client, seconds, start_at)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 30)
    if backend is not None:
        backend.__exit__(None, None, None)
    else:
        client.close()
    return results


def processes_on(library: str, endpoint: str, seconds: float, workers: int = WORKERS) -> list[dict[str, Any]]:
    """``workers`` spawned processes, one client each, on the store at ``endpoint`` (moto, redis://,
    redis+cluster://, postgresql:// or sqlite:PATH), all starting at one moment once every one is ready."""
    context = multiprocessing.get_context("spawn")
    start, go = context.Value("d", 0.0), context.Event()
    pipes, processes = [], []
    for _ in range(workers):
        receiver, sender = context.Pipe(duplex=False)
        process = context.Process(target=process_worker, args=(library, endpoint, seconds, start, go, sender))
        process.start()
        pipes.append(receiver)
        processes.append(process)
    try:
        silent = {"holds": [], "waits": [], "reads": 0, "waited_ms": 0.0, "error": "no report (the process died)"}
        ready, ready_by = [], time.monotonic() + READY_TIMEOUT_S
        for pipe in pipes:  # a worker that died or hangs before it is ready is left out (and reported)
            try:
                ready.append(pipe.poll(max(0.0, ready_by - time.monotonic())) and pipe.recv() == "ready")
            except EOFError:
                ready.append(False)
        start.value = time.monotonic() + START_MARGIN_S
        go.set()
        results = []
        for pipe, started in zip(pipes, ready):
            if not started:
                results.append({**silent, "error": f"not ready within {READY_TIMEOUT_S:g} s (died or hung)"})
                continue
            try:
                results.append(pipe.recv() if pipe.poll(seconds + 60) else silent)
            except EOFError:
                results.append(silent)
        return results
    finally:
        for process in processes:
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join(5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # 8 s a setup keeps the whole run (12 setups) near two minutes on a 2-core machine.
    parser.add_argument("--seconds", type=float, default=8.0, help="each setup's run (default 8)")
    parser.add_argument("--stores", default=",".join(SECTIONS),
                        help=f"comma-separated sections to run (default {','.join(SECTIONS)})")
    parser.add_argument("--workers", type=int, default=WORKERS,
                        help=f"contenders per setup (default {WORKERS}; 17 puts 16 processes in wait)")
    args = parser.parse_args()
    if not 2 <= args.workers <= 64:
        parser.error(f"--workers must be in 2..64, got {args.workers}")
    args.stores = set(args.stores.split(","))
    if args.stores - set(SECTIONS):
        parser.error(f"unknown section(s) {', '.join(sorted(args.stores - set(SECTIONS)))}: "
                     f"choose from {','.join(SECTIONS)}")
    print(f"# handoff: {args.workers} workers, {WORK_S * 1000:g} ms critical section, {args.seconds:g} s each, "
          f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC")
    print(f"{'setup':<{LABEL_WIDTH}}{'holds':>7}{'p50 ms':>10}{'p99 ms':>10}   {'share per worker':<23}"
          f"{'reads/acq':>11}{'reads/s wait':>14}")
    if "memory" in args.stores:
        for library in ("fastlease", "pydynox"):
            summarise(f"{library}: threads, memory", threads_on_memory(library, args.seconds, args.workers))
    if "dynamodb" in args.stores:
        dynamodb_section(args.seconds, args.workers)
    if "redis" in args.stores:
        redis_section(args.seconds, args.workers)
    if "redis-cluster" in args.stores:
        redis_cluster_section(args.seconds, args.workers)
    return 0


def dynamodb_section(seconds: float, workers: int) -> None:
    import boto3

    from fastlease.testing.moto_server import MotoServer

    with MotoServer() as server:
        boto3.client("dynamodb", endpoint_url=server.endpoint_url, **CREDENTIALS).create_table(
            TableName=TABLE,
            AttributeDefinitions=[{"AttributeName": "key", "AttributeType": "S"}],
            KeySchema=[{"AttributeName": "key", "KeyType": "HASH"}],
            BillingMode="PAY_PER_REQUEST",
        )
        for library in ("fastlease", "pydynox"):
            summarise(f"{library}: processes, DynamoDB", processes_on(library, server.endpoint_url, seconds, workers))


def redis_section(seconds: float, workers: int) -> None:
    from fastlease.testing.redis_server import RedisServer

    with RedisServer() as server:
        for library, label in (("fastlease", "fastlease: processes, Redis"),
                               ("fastlease-polling", "fastlease, polling only: Redis"),
                               *((peer, f"{peer}: processes, Redis") for peer in REDIS_PEERS)):
            summarise(label, processes_on(library, server.url, seconds, workers))


def redis_cluster_section(seconds: float, workers: int) -> None:
    """The Redis setups on a three-node cluster of this run's own (stopped by its nodes' PIDs, also on an
    error); the peer is redis-py's ``Lock`` on a ``redis.cluster.RedisCluster``."""
    from fastlease.testing.redis_cluster import RedisClusterServer

    with RedisClusterServer() as cluster:
        for library, label in (("fastlease", "fastlease: processes, Redis Cluster"),
                               ("fastlease-polling", "fastlease, polling only: Redis Cluster"),
                               ("redis-py", "redis-py: processes, Redis Cluster")):
            summarise(label, processes_on(library, cluster.url, seconds, workers))


if __name__ == "__main__":
    sys.exit(main())
