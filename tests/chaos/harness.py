"""The reliability harness: worker processes run the guarded counter (``workload.py``) on one store while
the harness injects faults; then the checker proves mutual exclusion from what the store recorded.

Faults, one at a time at random moments, from one printed seed:

* ``kill_holder`` / ``kill_waiter``: SIGKILL (the worker is replaced by a fresh one);
* ``pause_holder``: SIGSTOP for 1.5 leases, then SIGCONT;
* ``lost_response``, ``late_commit``, ``stall``, ``partition``, ``reset``: the TCP fault proxy
  (DynamoDB and Redis, whose clients all go through it);
* ``drop_connection`` (PostgreSQL): ``pg_terminate_backend`` on every backend of the holder (its
  client's connections, its renewal process's and the counter's, found in ``pg_stat_activity`` by the
  worker's ``application_name``), whatever they are doing: a transaction open then is rolled back;
* ``drop_connection`` (Redis Cluster): on the node that serves the key's slot, ``CLIENT PAUSE ...
  WRITE`` for 60 ms (scripts sent meanwhile wait on the server), then ``CLIENT KILL TYPE normal``, which
  drops every client's connection to it (workers', their renewal processes' and the counter's) with the
  scripts still waiting unanswered; applied up to 50 ms after it is drawn, as on PostgreSQL;
* ``migrate_slot`` (Redis Cluster): the key's slot, with the lease, its fencing counter and the guarded
  counter (which share its hash tag), moves to the next node, as ``redis-cli --cluster reshard`` moves
  one: clients are sent on by ``ASK``, ``TRYAGAIN`` and then ``MOVED``;
* ``clock_jump``: every worker's wall clock jumps a lease forward or back (the engine's clock);
* memory runs its workers as threads: no signals there, so a holder *stalls* past its lease instead,
  and the store's fault hook loses responses and commits late.

On Redis, Redis Cluster and memory the counter's read is fenced as well as its write (``workload.py``
says why: a fence on the write alone lets an old holder's late write and the new holder's write both
commit the same value); a refused read or write commits nothing and is counted as ``FenceRefused``.
SQLite, DynamoDB and PostgreSQL commit the write in a transaction that ``check_in`` guards.

The checker: the final counter equals the number of commits (no lost update); each value is committed
once (no double commit); once a lease changes hands, its old owner never commits again (no stale
commit; on fenced stores the tokens never go down); after each killed or paused holder, another worker
holds the key within the recovery bound.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import sqlite3
import tempfile
import threading
import time
from multiprocessing.connection import wait as wait_for_pipes
from typing import Any, Callable, Optional

from . import workload
from .proxy import FAULTS as PROXY_FAULTS
from .proxy import FaultProxy

SPAWN = multiprocessing.get_context("spawn")
#: Another worker must hold the key within this long of a holder's kill or pause: a lease of
#: observation after the last renewal seen (lease + lease/3), polls, request timeouts, and a proxy
#: fault that may overlap (up to 1.2 s).
RECOVERY_BOUND_S = 2 * workload.LEASE_S + 1.2 + 1.0
STORES = ("memory", "sqlite", "redis", "redis-cluster", "dynamodb", "postgres")
#: Faults of one store only, beside the ones every process store gets.
STORE_FAULTS = {"postgres": ("drop_connection",), "redis-cluster": ("drop_connection", "migrate_slot")}
#: Redis Cluster's drop_connection: how long the node holds writes before the connections are dropped.
CLUSTER_DROP_PAUSE_S = 0.06
#: Holder faults applied up to 50 ms (the work's length) after they are drawn (see _run_processes).
DELAYED_FAULTS = {"postgres": ("pause_holder", "drop_connection"), "redis-cluster": ("drop_connection",)}
#: PostgreSQL: the holder's backends, terminated; the count of those it had.
DROP_BACKENDS = "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s"


class _Worker:
    def __init__(self, store: str, target: str, clock_path: str, stop_at: float, seed: int) -> None:
        receiver, sender = SPAWN.Pipe(duplex=False)
        self.events = receiver
        self.process = SPAWN.Process(target=_worker_main, args=(store, target, clock_path, stop_at, seed, sender),
                                     daemon=True)
        self.process.start()
        sender.close()
        self.stopped = False
        self.finished = False  # its report pipe reached end of file: it exited, everything read


def _worker_main(store: str, target: str, clock_path: str, stop_at: float, seed: int, sender: Any) -> None:
    class PipeEvents:
        def put(self, event: tuple) -> None:
            sender.send(event)

    workload.work(store, target, clock_path, stop_at, seed, PipeEvents())


class Report(dict):
    def line(self) -> str:
        return (f"{self['store']}: {self['commits']} commits, {self['kills']} kills, {self['pauses']} pauses, "
                f"{self['injected']} injected faults, {self['clock_jumps']} clock jumps; lost updates "
                f"{self['lost_updates']}, double commits {self['double_commits']}, stale commits "
                f"{self['stale_commits']}, worst recovery {self['worst_recovery_s']:.2f} s (bound "
                f"{RECOVERY_BOUND_S:.1f} s), seed {self['seed']}")


def run(store: str, seconds: float, *, workers: int = 4, seed: Optional[int] = None,
        faults: Optional[set[str]] = None, say: Callable[[str], None] = print) -> Report:
    """One run. ``faults`` limits the kinds injected (each on its own); by default they are mixed."""
    if store not in STORES:
        raise ValueError(f"store must be one of {STORES}, got {store!r}")
    seed = random.SystemRandom().randrange(2**32) if seed is None else seed
    say(f"chaos on {store}: {workers} workers, {seconds:g} s, seed {seed}")
    if store == "memory":
        if faults:
            raise ValueError("faults= chooses among the process faults; the memory run (threads) injects "
                             "stalls, clock jumps and store faults of its own")
        return _run_memory(seconds, workers, seed, say)
    with tempfile.TemporaryDirectory(prefix="fastlease-chaos-") as directory:
        clock_path = os.path.join(directory, "wall-offset")
        with open(clock_path, "wb") as handle:
            handle.write(b"\0" * 8)
        setup = _Setup(store, directory)
        try:
            return _run_processes(setup, clock_path, seconds, workers, seed, faults, say)
        finally:
            setup.close()


class _Setup:
    """The store, its proxy, and the checker's direct view of the counter and the commit log."""

    def __init__(self, store: str, directory: str) -> None:
        self.store = store
        self.proxy: Optional[FaultProxy] = None
        self._server: Any = None
        if store == "sqlite":
            self.target = os.path.join(directory, "chaos.db")
            with sqlite3.connect(self.target) as connection:
                connection.execute("CREATE TABLE counter (id INTEGER PRIMARY KEY, value INTEGER NOT NULL)")
                connection.execute("INSERT INTO counter VALUES (1, 0)")
                connection.execute("CREATE TABLE commits (value INTEGER, owner TEXT, token INTEGER)")
            return
        if store == "postgres":
            import psycopg

            from fastlease import PostgresClient
            from fastlease.testing.postgres_server import PostgresServer

            self._server = PostgresServer()
            self.target = self.direct = self._server.start()
            admin = PostgresClient(self.direct)
            try:
                admin.create_lock_table(workload.TABLE)
            finally:
                admin.close()
            with psycopg.connect(self.direct, autocommit=True) as connection:
                connection.execute(f"CREATE TABLE {workload.COUNTER_TABLE} (id integer PRIMARY KEY, value integer)")
                connection.execute(f"INSERT INTO {workload.COUNTER_TABLE} VALUES (1, 0)")
                connection.execute(f"CREATE TABLE {workload.COMMITS_TABLE} (value integer, owner text, token bigint)")
            return
        if store == "redis-cluster":
            from fastlease.testing.redis_cluster import RedisClusterServer

            # No proxy: each node announces its own address, and clients go to the node that serves the key.
            self._server = RedisClusterServer()
            self.target = self.direct = self._server.start()
            return
        if store == "redis":
            from fastlease.testing.redis_server import RedisServer

            self._server = RedisServer()
            self.direct = self._server.start()
            port = int(self.direct.rsplit(":", 1)[1].split("/")[0])
        else:
            import boto3

            from fastlease.testing.moto_server import MotoServer

            self._server = MotoServer()
            self.direct = self._server.start(timeout_s=60)
            port = int(self.direct.rsplit(":", 1)[1])
            plain = boto3.client("dynamodb", endpoint_url=self.direct, **workload.CREDENTIALS)
            tables = [(workload.TABLE, "key"), (workload.COUNTER_TABLE, "id")]
            tables += [(workload.commits_table(n * workload.COMMITS_PER_TABLE), "id")
                       for n in range(workload.COMMIT_TABLES)]
            for table, key in tables:
                plain.create_table(TableName=table, AttributeDefinitions=[{"AttributeName": key, "AttributeType": "S"}],
                                   KeySchema=[{"AttributeName": key, "KeyType": "HASH"}], BillingMode="PAY_PER_REQUEST")
        self.proxy = FaultProxy("127.0.0.1", port)
        proxy_port = self.proxy.start()
        self.target = (f"redis://127.0.0.1:{proxy_port}/0" if store == "redis" else f"http://127.0.0.1:{proxy_port}")

    def outcome(self) -> tuple[int, list[tuple[int, str, Optional[int]]]]:
        """(final counter, commits as (value, owner, token))."""
        if self.store == "sqlite":
            with sqlite3.connect(self.target) as connection:
                (value,) = connection.execute("SELECT value FROM counter WHERE id = 1").fetchone()
                return value, [tuple(row) for row in connection.execute("SELECT value, owner, token FROM commits")]
        if self.store == "postgres":
            import psycopg

            with psycopg.connect(self.direct, autocommit=True) as connection:
                (value,) = connection.execute(f"SELECT value FROM {workload.COUNTER_TABLE} WHERE id = 1").fetchone()
                rows = connection.execute(f"SELECT value, owner, token FROM {workload.COMMITS_TABLE}").fetchall()
                return value, [tuple(row) for row in rows]
        if self.store in ("redis", "redis-cluster"):
            import redis

            plain = redis.Redis.from_url(self.direct) if self.store == "redis" else workload.cluster_client(self.direct)
            counter, _, log = workload.REDIS_KEYS[self.store]
            try:
                entries = [entry.decode().split("|") for entry in plain.lrange(log, 0, -1)]
                return int(plain.get(counter) or 0), [(int(v), o, int(t)) for v, o, t in entries]
            finally:
                plain.close()
        import boto3

        plain = boto3.client("dynamodb", endpoint_url=self.direct, **workload.CREDENTIALS)
        item = plain.get_item(TableName=workload.COUNTER_TABLE, Key={"id": {"S": workload.KEY}},
                              ConsistentRead=True).get("Item")
        commits = []
        for n in range(workload.COMMIT_TABLES):
            table = workload.commits_table(n * workload.COMMITS_PER_TABLE)
            for page in plain.get_paginator("scan").paginate(TableName=table, ConsistentRead=True):
                commits.extend((int(i["value"]["N"]), i["owner"]["S"], None) for i in page["Items"])
        return (int(item["value"]["N"]) if item else 0), commits

    def drop_connections(self, pid: int) -> int:
        """PostgreSQL: terminate every backend of worker ``pid``. Redis Cluster: drop every client connection
        to the node that serves the key, with the writes sent in the last ``CLUSTER_DROP_PAUSE_S`` waiting
        on them unanswered (the admin connection that does it is spared). How many there were."""
        if self.store == "redis-cluster":
            from fastlease.stores.redis.cluster import key_slot

            admin = self._server.admin(self._server.node_for_slot(key_slot(workload.KEY)))
            admin.client_pause(int(CLUSTER_DROP_PAUSE_S * 2000), all=False)  # unpaused below, or by itself
            try:
                threading.Event().wait(CLUSTER_DROP_PAUSE_S)  # the fault's length: writes pile up meanwhile
                return int(admin.client_kill_filter(_type="normal"))
            finally:
                admin.client_unpause()
        import psycopg

        with psycopg.connect(self.direct, autocommit=True, connect_timeout=5) as connection:
            (dropped,) = connection.execute(DROP_BACKENDS, (workload.application_name(pid),)).fetchone()
        return int(dropped)

    def migrate_slot(self) -> None:
        """Redis Cluster: move the key's slot (its lease, fencing counter and guarded counter) to the next node."""
        from fastlease.stores.redis.cluster import key_slot

        slot = key_slot(workload.KEY)
        nodes = self._server.nodes
        self._server.migrate_slot(slot, to=(nodes.index(self._server.node_for_slot(slot)) + 1) % len(nodes))

    def close(self) -> None:
        if self.proxy is not None:
            self.proxy.stop()
        if self._server is not None:
            self._server.stop()


def _run_processes(setup: _Setup, clock_path: str, seconds: float, count: int, seed: int,
                   only: Optional[set[str]], say: Callable[[str], None]) -> Report:
    rng = random.Random(seed)
    start = time.monotonic()
    deadline = start + seconds
    pool = [_Worker(setup.store, setup.target, clock_path, deadline, seed * 1000 + i) for i in range(count)]
    latest: Optional[tuple[str, Any]] = None  # (owner, worker) of the last "held" event
    helds: list[tuple[float, str]] = []
    faults: list[tuple[float, str, Optional[str]]] = []  # (time, kind, owner of the holder hit)
    errors: dict[str, int] = {}
    kills = pauses = jumps = drops = dropped_backends = migrations = 0
    resume_at: list[tuple[float, Any]] = []
    next_fault = start + 1.0 + rng.uniform(0.3, 1.0)
    kinds = ["kill_holder", "kill_waiter", "pause_holder", "clock_jump"]
    if setup.proxy is not None:
        kinds += list(PROXY_FAULTS)
    kinds += STORE_FAULTS.get(setup.store, ())
    if only:
        kinds = [kind for kind in kinds if kind in only]
        if not kinds:
            raise ValueError(f"none of the faults {sorted(only)} applies to {setup.store}")
    recovering_from: Optional[str] = None  # the owner of a killed or paused holder, until another holds
    recovering_since = 0.0
    serial = count
    # PostgreSQL: a holder fault is applied up to 50 ms (the work's length) after it is drawn. The
    # harness draws faults as it wakes on a "held" report, so undelayed they would hit the holder at the
    # start of its hold; delayed, they also land inside its checked-in transaction, where a takeover must
    # wait for it. (Only there, so that the other stores' seeds replay the faults they always did.)
    delayed: Optional[tuple[float, str, Any, Optional[str]]] = None  # (when, kind, worker, owner)

    def pause(worker: Any, now: float) -> None:
        os.kill(worker.process.pid, signal.SIGSTOP)
        worker.stopped = True
        resume_at.append((now + 1.5 * workload.LEASE_S, worker))

    while time.monotonic() < deadline + workload.WAIT_S + 5:  # bounded: workers stop at the deadline
        alive = [w for w in pool if not w.finished]
        if not alive and time.monotonic() >= deadline:
            break
        timeout_s = 0.05 if delayed is None else min(0.05, max(0.0, delayed[0] - time.monotonic()))
        for ready in wait_for_pipes([w.events for w in alive], timeout=timeout_s):
            worker = next(w for w in alive if w.events is ready)
            try:
                event = ready.recv()
            except (EOFError, OSError):
                worker.finished = True
                continue
            if event[0] == "held":
                latest = (event[2], worker)
                helds.append((event[3], event[2]))
                if event[2] != recovering_from:
                    recovering_from = None
            else:
                errors[event[2]] = errors.get(event[2], 0) + 1
        now = time.monotonic()
        for when, worker in list(resume_at):
            if now >= when:
                os.kill(worker.process.pid, signal.SIGCONT)
                worker.stopped = False
                resume_at.remove((when, worker))
        if delayed is not None and now >= delayed[0]:
            _, kind, target_worker, owner = delayed
            delayed = None
            if target_worker.process.is_alive() and not target_worker.stopped:
                if kind == "pause_holder":
                    recovering_from, recovering_since = owner, now
                    pause(target_worker, now)
                    pauses += 1
                else:
                    dropped_backends += setup.drop_connections(target_worker.process.pid)
                    drops += 1
                faults.append((time.time(), kind, owner))
        if now < next_fault or now > deadline - 1.0 or delayed is not None:
            continue
        if recovering_from is not None and now < recovering_since + RECOVERY_BOUND_S:
            continue  # one holder fault at a time: its recovery is measured without a second one on top
        next_fault = now + rng.uniform(0.6, 1.6)
        kind = rng.choice(kinds)
        target_worker, owner = None, None
        if kind in ("kill_holder", "pause_holder", "drop_connection") and latest is not None:
            owner, target_worker = latest
            if not target_worker.process.is_alive() or target_worker.stopped:
                continue
        elif kind == "kill_waiter":
            candidates = [w for w in pool if w.process.is_alive() and not w.stopped
                          and (latest is None or w is not latest[1])]
            if not candidates:
                continue
            target_worker = rng.choice(candidates)
        if kind in DELAYED_FAULTS.get(setup.store, ()) and target_worker is not None:
            delayed = (now + rng.uniform(0.0, 0.05), kind, target_worker, owner)
            continue
        if kind in ("kill_holder", "pause_holder") and target_worker is not None:
            recovering_from, recovering_since = owner, now
        if kind in ("kill_holder", "kill_waiter") and target_worker is not None:
            os.kill(target_worker.process.pid, signal.SIGKILL)
            target_worker.process.join(10)
            kills += 1
            pool.append(_Worker(setup.store, setup.target, clock_path, deadline, seed * 1000 + serial))
            serial += 1
        elif kind == "pause_holder" and target_worker is not None:
            pause(target_worker, now)
            pauses += 1
        elif kind == "clock_jump":
            workload.set_wall_offset(clock_path, rng.choice((-1, 1)) * int(workload.LEASE_S * 1e9))
            jumps += 1
        elif kind in PROXY_FAULTS and setup.proxy is not None:
            setup.proxy.set_fault(kind, rng.uniform(0.2, 1.2))
        elif kind == "migrate_slot":
            setup.migrate_slot()
            migrations += 1
        else:
            continue
        faults.append((time.time(), kind, owner))
    stop_all(pool)
    final, commits = setup.outcome()
    injected = sum(setup.proxy.injected.values()) if setup.proxy is not None else drops + migrations
    report = _check(setup.store, seed, final, commits, helds, faults, kills, pauses, jumps, injected, errors)
    if setup.store == "postgres":
        report["dropped_backends"] = dropped_backends
    if setup.store == "redis-cluster":
        report["dropped_clients"], report["migrations"] = dropped_backends, migrations
    return report


def stop_all(pool: list[Any]) -> None:
    """End every worker process of a run (``process``, ``stopped``, ``events``): a paused one is resumed,
    each gets 15 s to finish, then is killed by its PID; their pipes are closed."""
    for worker in pool:
        if worker.process.is_alive():
            if worker.stopped:
                os.kill(worker.process.pid, signal.SIGCONT)
            worker.process.join(15)
        if worker.process.is_alive():
            os.kill(worker.process.pid, signal.SIGKILL)
            worker.process.join(10)
        worker.events.close()


def _check(store: str, seed: int, final: int, commits: list, helds: list, faults: list, kills: int, pauses: int,
           jumps: int, injected: int, errors: dict) -> Report:
    values = sorted(value for value, _, _ in commits)
    double = len(values) - len(set(values))
    lost = abs(final - len(commits)) + (0 if values == list(range(1, len(values) + 1)) or double else 1)
    # Once the counter's writer changes, the old owner never commits again.
    by_value = sorted(commits)
    finished: set[str] = set()
    stale, previous = 0, None
    last_token = 0
    for _, owner, token in by_value:
        if owner != previous:
            if owner in finished:
                stale += 1
            if previous is not None:
                finished.add(previous)
            previous = owner
        if token is not None:
            if token < last_token:
                stale += 1
            last_token = max(last_token, token)
    recoveries: list[float] = []
    slowest: list[tuple[float, str, float]] = []
    helds.sort()
    for when, kind, owner in faults:
        if kind not in ("kill_holder", "pause_holder") or owner is None:
            continue
        following = [t for t, o in helds if t > when and o != owner]
        recoveries.append((following[0] - when) if following else float("inf"))
        slowest.append((recoveries[-1], kind, when))
    return Report(store=store, seed=seed, commits=len(commits), final=final, kills=kills, pauses=pauses,
                  injected=injected, clock_jumps=jumps, lost_updates=lost, double_commits=double, stale_commits=stale,
                  worst_recovery_s=max(recoveries, default=0.0), recoveries=len(recoveries), errors=errors,
                  slowest=sorted(slowest, reverse=True)[:5])


# ---- memory: threads ---------------------------------------------------------------------------------
def _run_memory(seconds: float, count: int, seed: int, say: Callable[[str], None]) -> Report:
    from fastlease import LockLost, LockNotAcquired, MemoryClient, SyncDistributedLock
    from fastlease.exceptions import FastleaseError
    from fastlease.testing import FaultInjector

    rng = random.Random(seed)
    target = workload.MemoryTarget()
    with tempfile.TemporaryDirectory(prefix="fastlease-chaos-") as directory:
        clock_path = os.path.join(directory, "wall-offset")
        with open(clock_path, "wb") as handle:
            handle.write(b"\0" * 8)
        first = MemoryClient(clock=workload.JumpingClock(clock_path))
        store = first.store
        clients = [first] + [MemoryClient(store=store, clock=workload.JumpingClock(clock_path))
                             for _ in range(count - 1)]
        deadline = time.monotonic() + seconds
        helds: list[tuple[float, str]] = []
        faults: list[tuple[float, str, Optional[str]]] = []
        errors: dict[str, int] = {}
        stall_next: list[int] = [0]
        lock = threading.Lock()

        def loop(index: int) -> None:
            thread_rng = random.Random(seed * 1000 + index)
            client = clients[index]
            while time.monotonic() < deadline:  # bounded by the deadline
                guard = SyncDistributedLock(client, table=workload.TABLE, key=workload.KEY,
                                            lease_duration=workload.LEASE_S, wait_timeout=workload.WAIT_S)
                try:
                    with guard as lease:
                        with lock:
                            helds.append((time.time(), lease.owner))
                            stall = stall_next[0] > 0
                            stall_next[0] = max(0, stall_next[0] - 1)
                        if stall:  # a holder that stops for 1.5 leases (as SIGSTOP would)
                            with lock:
                                faults.append((time.time(), "pause_holder", lease.owner))
                            time.sleep(1.5 * workload.LEASE_S)
                        # Fenced read, then fenced write: either refused commits nothing (see workload.py).
                        value = target.read(lease.fencing_token)
                        if value is not None:
                            time.sleep(thread_rng.uniform(0.0, 0.01))
                        if value is None or not target.write(value + 1, lease.fencing_token, lease.owner):
                            with lock:
                                errors["FenceRefused"] = errors.get("FenceRefused", 0) + 1
                except (LockLost, LockNotAcquired, FastleaseError) as error:
                    with lock:
                        errors[type(error).__name__] = errors.get(type(error).__name__, 0) + 1
                time.sleep(thread_rng.uniform(0.0, 0.01))

        threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(count)]
        for thread in threads:
            thread.start()
        jumps = pauses = injected = 0
        while time.monotonic() < deadline - 1.0:  # bounded by the deadline
            time.sleep(rng.uniform(0.4, 1.2))
            kind = rng.choice(["pause_holder", "clock_jump", "lost_response", "delay", "timeout"])
            if kind == "pause_holder":
                with lock:
                    stall_next[0] += 1
                pauses += 1
            elif kind == "clock_jump":
                workload.set_wall_offset(clock_path, rng.choice((-1, 1)) * int(workload.LEASE_S * 1e9))
                jumps += 1
            else:
                faults_hook = FaultInjector()
                operation = rng.choice(["put_if_absent", "update_version_if", "delete_if_owner", "read"])
                faults_hook.add(operation, kind, times=2, delay_s=0.5) if kind == "delay" else \
                    faults_hook.add(operation, kind, times=2)
                store.faults = faults_hook
                injected += 1
        for thread in threads:
            thread.join(workload.WAIT_S + 10)
        store.faults = None
        for client in clients:
            client.close()
    return _check("memory", seed, target.value, list(target.commits), helds, faults, 0, pauses, jumps, injected,
                  errors)
