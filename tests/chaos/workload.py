"""The guarded counter: every worker loops acquire -> read the counter -> write counter+1 -> release.

The write commits only under the lease, the way users are told to do it on each store:

* SQLite: one ``BEGIN IMMEDIATE`` transaction with ``lease.check_in(connection)``;
* DynamoDB: one ``SyncTransaction`` with ``lease.check_in(tx)``;
* PostgreSQL: one psycopg transaction with ``lease.check_in(connection)``, which locks the lease row
  in it, so no takeover commits before the transaction ends;
* Redis, Redis Cluster and memory: a fencing-token check (a Redis script; a critical section in
  memory) on the read *and* on the write. The read refuses a token lower than the highest seen and
  records its own as the highest seen; the write refuses a token lower than the highest seen. Fencing
  only the write is not enough for a read-modify-write: an old holder (token 1) reads v and is paused
  past its lease, the new holder (token 2) reads v, the old holder's late write lands first (1 is still
  the newest token the resource has seen) and writes v+1, then the new holder writes v+1 too: a double
  commit. The resource must see the token on every access, so the new holder's read raises the highest
  seen to 2 and the old holder's write is refused. A refused read or write commits nothing; the worker
  goes on.

Each commit also appends (value, owner, token) to a commit log in the same atomic write, so commits of
a worker killed right after are counted. The checker reads the counter and the log afterwards.
"""

from __future__ import annotations

import mmap
import os
import random
import struct
import threading
import time
import uuid
from typing import Any, Optional

LEASE_S = 1.0
WAIT_S = 10.0
TABLE = "chaos_locks"
KEY = "counter"
COUNTER_TABLE = "chaos_counter"
COMMITS_TABLE = "chaos_commits"
#: DynamoDB: the commit log is spread over tables of this many commits each. moto copies every table a
#: transaction touches (to roll back), so one ever-growing log table would make each commit slower and
#: slower (33 ms at 4,000 items, measured), stalling the serialised server; real DynamoDB does not.
COMMITS_PER_TABLE = 200
COMMIT_TABLES = 200


def commits_table(value: int) -> str:
    return f"{COMMITS_TABLE}_{value // COMMITS_PER_TABLE}"
CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": "us-east-1"}

#: Redis: the counter, the highest token seen and the commit log, which the fenced scripts below touch
#: together. On a Redis Cluster they carry the lease's hash tag (the key, ``{counter}``), so that each
#: script touches one slot, and a migration of the lease's slot moves them along with the lease.
REDIS_KEYS = {"redis": ("chaos:counter", "chaos:max_token", "chaos:commits"),
              "redis-cluster": tuple(f"chaos:{{{KEY}}}:{name}" for name in ("counter", "max_token", "commits"))}

#: Redis: the fenced read. KEYS: counter, max token. ARGV: token. The counter's value, or nil (None) for
#: a token lower than the highest seen; the reader's token becomes the highest seen.
FENCED_READ = """
local newest = tonumber(redis.call('GET', KEYS[2]) or '0')
local token = tonumber(ARGV[1])
if token < newest then return false end
if token > newest then redis.call('SET', KEYS[2], ARGV[1]) end
return tonumber(redis.call('GET', KEYS[1]) or '0')
"""
#: Redis: the fenced write. KEYS: counter, max token, log. ARGV: value, token, owner.
FENCED_INCREMENT = """
local newest = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[2]) < newest then return 0 end
redis.call('SET', KEYS[2], ARGV[2])
redis.call('SET', KEYS[1], ARGV[1])
redis.call('RPUSH', KEYS[3], ARGV[1] .. '|' .. ARGV[3] .. '|' .. ARGV[2])
return 1
"""


class JumpingClock:
    """The system clocks, but the wall clock is offset by the harness (a shared 8-byte file): the
    engine must only ever lose a lease early on a jump, never hold it longer."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "r+b")  # noqa: SIM115 - lives as long as the worker
        self._map = mmap.mmap(self._file.fileno(), 8)

    def monotonic_ns(self) -> int:
        return time.monotonic_ns()

    def time_ns(self) -> int:
        return time.time_ns() + struct.unpack("q", self._map[:8])[0]

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        return event.wait(timeout_s)

    def attach_scheduler(self, scheduler: Any) -> bool:
        return False


def set_wall_offset(path: str, offset_ns: int) -> None:
    with open(path, "r+b") as handle:
        handle.write(struct.pack("q", offset_ns))


# ---- one increment per store ---------------------------------------------------------------------
def _increment_sqlite(lease: Any, path: str) -> bool:
    import sqlite3

    connection = sqlite3.connect(path, isolation_level=None, timeout=5)
    try:
        connection.execute("BEGIN IMMEDIATE")
        try:
            lease.check_in(connection)
            (value,) = connection.execute("SELECT value FROM counter WHERE id = 1").fetchone()
            connection.execute("UPDATE counter SET value = ? WHERE id = 1", (value + 1,))
            connection.execute("INSERT INTO commits (value, owner, token) VALUES (?, ?, ?)",
                               (value + 1, lease.owner, lease.fencing_token))
            connection.execute("COMMIT")
            return True
        except BaseException:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            raise
    finally:
        connection.close()


def _increment_dynamodb(lease: Any, client: Any, plain: Any) -> bool:
    from fastlease.dynamodb import SyncTransaction

    item = plain.get_item(TableName=COUNTER_TABLE, Key={"id": {"S": KEY}}, ConsistentRead=True).get("Item")
    value = int(item["value"]["N"]) if item else 0
    with SyncTransaction(client) as tx:
        lease.check_in(tx)
        tx.put(COUNTER_TABLE, {"id": KEY, "value": value + 1})
        tx.put(commits_table(value + 1), {"id": uuid.uuid4().hex, "value": value + 1, "owner": lease.owner})
    return True


def application_name(pid: int) -> str:
    """PostgreSQL: the application_name of worker ``pid``'s connections (its client's, its renewal
    process's and the counter's), by which the harness finds the holder's backends to drop them."""
    return f"fastlease-chaos-{pid}"


#: PostgreSQL: the counter's requests; 2 s bounds each (a dropped connection or a stopped peer), as the
#: socket timeouts of the other stores' counter clients do.
PG_TIMEOUTS = "-c statement_timeout=2000 -c lock_timeout=2000"


class PostgresCounter:
    """The worker's connection for the counter, opened again after the harness dropped it."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.connection: Any = None

    def open(self) -> Any:
        import psycopg

        if self.connection is None or self.connection.closed or self.connection.broken:
            if self.connection is not None:
                self.connection.close()
            self.connection = psycopg.connect(self.target, options=PG_TIMEOUTS, connect_timeout=2)
        return self.connection

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()


def _increment_postgres(lease: Any, counter: PostgresCounter, work_s: float) -> bool:
    """The work happens between the read and the write, inside the checked-in transaction, so a pause
    often lands there: the takeover must then wait for this transaction to end."""
    connection = counter.open()
    with connection.transaction():
        lease.check_in(connection)
        (value,) = connection.execute(f"SELECT value FROM {COUNTER_TABLE} WHERE id = 1").fetchone()
        time.sleep(work_s)  # the work (a pause may land here)
        connection.execute(f"UPDATE {COUNTER_TABLE} SET value = %s WHERE id = 1", (value + 1,))
        connection.execute(f"INSERT INTO {COMMITS_TABLE} (value, owner, token) VALUES (%s, %s, %s)",
                           (value + 1, lease.owner, lease.fencing_token))
    return True


def _increment_redis(lease: Any, plain: Any, keys: tuple[str, str, str]) -> bool:
    """False when the fence refused the read or the write (a newer holder has been seen): no commit.
    ``keys``: the store's ``REDIS_KEYS``."""
    counter, max_token, commits = keys
    value = plain.eval(FENCED_READ, 2, counter, max_token, lease.fencing_token)
    if value is None:
        return False
    return bool(plain.eval(FENCED_INCREMENT, 3, counter, max_token, commits, int(value) + 1, lease.fencing_token,
                           lease.owner))


class MemoryTarget:
    """The memory store's counter, fenced in a critical section (workers are threads): the read and the
    write each refuse a token lower than the highest seen, and the read records its token as the highest
    seen (see the module's docstring for why the read is fenced too)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.value = 0
        self.newest = 0  # the highest token seen, by a read or a write
        self.commits: list[tuple[int, str, int]] = []

    def read(self, token: int) -> Optional[int]:
        """The value, or None (refused) for a token lower than the highest seen."""
        with self.lock:
            if token < self.newest:
                return None
            self.newest = token
            return self.value

    def write(self, value: int, token: int, owner: str) -> bool:
        with self.lock:
            if token < self.newest:
                return False
            self.newest, self.value = token, value
            self.commits.append((value, owner, token))
            return True


# ---- the worker ----------------------------------------------------------------------------------
def make_client(store: str, target: str, clock: Any, plain: Any = None) -> Any:
    if store == "sqlite":
        from fastlease import SQLiteClient

        return SQLiteClient(target, clock=clock)
    if store in ("redis", "redis-cluster"):
        from fastlease.redis import RedisClient

        return RedisClient(target, clock=clock)
    if store == "postgres":
        from fastlease import PostgresClient

        return PostgresClient(target, clock=clock)
    from fastlease.dynamodb import DynamoDBClient

    # Built on the retry-free client: SyncTransaction commits through it, never resending a commit.
    return DynamoDBClient(plain if plain is not None else plain_client(store, target), clock=clock)


def plain_client(store: str, target: str) -> Any:
    """The worker's own client for the counter: no automatic retries, so an ambiguous write is never
    sent twice behind its back (the commit log tells what happened)."""
    if store == "redis":
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        return redis.Redis.from_url(target, retry=Retry(NoBackoff(), 0), socket_timeout=2)
    if store == "redis-cluster":
        return cluster_client(target)
    if store == "dynamodb":
        import boto3
        from botocore.config import Config

        return boto3.client("dynamodb", endpoint_url=target, **CREDENTIALS,
                            config=Config(retries={"total_max_attempts": 1}, read_timeout=2, connect_timeout=2))
    if store == "postgres":
        return PostgresCounter(target)
    return None


def cluster_client(url: str) -> Any:
    """redis-py's ``RedisCluster`` on the nodes of a ``redis+cluster://`` URL, resending nothing whose
    outcome is unknown (no retries after a dropped connection or a timeout; MOVED, ASK and TRYAGAIN, which
    say that the command did not run, are still followed)."""
    from redis.backoff import NoBackoff
    from redis.cluster import ClusterNode, RedisCluster
    from redis.retry import Retry

    nodes = [ClusterNode(host, int(port)) for host, _, port in
             (address.rpartition(":") for address in url.split("://", 1)[1].split(","))]
    return RedisCluster(startup_nodes=nodes, retry=Retry(NoBackoff(), 0), socket_timeout=2)


def work(store: str, target: str, clock_path: Optional[str], stop_at: float, seed: int, events: Any) -> None:
    """A worker process: loop until ``stop_at`` (on the monotonic clock, which is system-wide on
    Linux); report each acquisition ("held", pid, owner, t) and each error ("error", pid, name, t)."""
    from fastlease import LockLost, LockNotAcquired, SyncDistributedLock
    from fastlease.exceptions import FastleaseError

    rng = random.Random(seed)
    clock = JumpingClock(clock_path) if clock_path else None
    pid = os.getpid()
    if store == "postgres":
        from psycopg.conninfo import make_conninfo

        target = make_conninfo(target, application_name=application_name(pid))
    plain = plain_client(store, target)
    client = make_client(store, target, clock, plain)
    deadline = stop_at
    try:
        while time.monotonic() < deadline:  # bounded by the deadline
            # Waits end soon after the run does, so that the harness is not kept waiting.
            wait_s = max(0.5, min(WAIT_S, deadline - time.monotonic() + 1.0))
            guard = SyncDistributedLock(client, table=TABLE, key=KEY, lease_duration=LEASE_S, wait_timeout=wait_s)
            try:
                with guard as lease:
                    events.put(("held", pid, lease.owner, time.time()))
                    work_s = rng.uniform(0.0, 0.05)
                    if store != "postgres":
                        time.sleep(work_s)  # work before the write (a pause may land here)
                    if store == "sqlite":
                        committed = _increment_sqlite(lease, target)
                    elif store == "dynamodb":
                        committed = _increment_dynamodb(lease, client, plain)
                    elif store == "postgres":
                        committed = _increment_postgres(lease, plain, work_s)
                    else:
                        committed = _increment_redis(lease, plain, REDIS_KEYS[store])
                    if not committed:  # the fence refused the read or the write: nothing committed
                        events.put(("error", pid, "FenceRefused", time.time()))
            except (LockLost, LockNotAcquired, FastleaseError, OSError, ValueError) as error:
                events.put(("error", pid, type(error).__name__, time.time()))
            except Exception as error:  # noqa: BLE001 - a store error from the counter client
                events.put(("error", pid, type(error).__name__, time.time()))
            time.sleep(rng.uniform(0.0, 0.02))
    finally:
        client.close()
        if isinstance(plain, PostgresCounter):
            plain.close()
