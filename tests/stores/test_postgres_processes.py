"""Leases across real processes on PostgreSQL: contention, a guarded counter written through ``check_in``
inside each process's own transaction, SIGSTOPped holders before and after their ``check_in``, SIGKILL.

Workers run in ``multiprocessing`` *spawn* children (``mp_workers``), each with its own clients and its
own psycopg connection for the counter. Every wait is bounded, and every child is SIGKILLed by its PID
and joined when its test ends (the ``children`` fixture). Each test gets an empty database
(``postgres_db``): the lock table ``locks``, the counter (one row, 0) and its commit log.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any, Iterator, Optional

import psycopg
import pytest

from fastlease import PostgresClient, SyncDistributedLock
from fastlease._engine import POLL_INTERVAL_MS
from helpers import mp_workers
from helpers.processes import (
    JOIN_S,
    MAX_TAKEOVER_S,
    MIN_TAKEOVER_S,
    Children,
    assert_exclusive,
    kill_and_reap,
    receive,
    run_contenders,
)
from helpers.waiting import wait_until

TABLE = "locks"
LEASE_S = 1.0  # the lease of holders that get SIGKILLed or SIGSTOPped
CONTENDERS, ROUNDS = 16, 4
COUNTER_PROCESSES, COUNTER_ROUNDS = 4, 10
#: A takeover after a SIGKILL: one stored lease of unchanged observation (the engine polls right when it
#: ends), plus one poll interval, plus this for the requests (a read and the takeover write, each well under
#: 50 ms alone) on a 2-core machine that other test processes share.
REQUEST_SLACK_S = 0.25
#: Bound for seeing the takeover blocked behind a stopped holder's transaction: a lease of observation,
#: then the takeover's first attempt, and after its lock_timeout (lease/3) a second one.
BLOCKED_BOUND_S = 10.0


@pytest.fixture
def dsn(postgres_db: str) -> Iterator[str]:
    """The empty database, with the lock table, the counter at 0 and an empty commit log."""
    client = PostgresClient(postgres_db)
    try:
        client.create_lock_table(TABLE)
    finally:
        client.close()
    with psycopg.connect(postgres_db, autocommit=True) as connection:
        connection.execute("CREATE TABLE counter (id integer PRIMARY KEY, value integer NOT NULL)")
        connection.execute("INSERT INTO counter VALUES (1, 0)")
        connection.execute("CREATE TABLE commits (value integer NOT NULL, owner text NOT NULL)")
    yield postgres_db


@pytest.fixture
def admin(dsn: str) -> Iterator[Any]:
    """The test's own view of the tables (autocommit: every read sees what is committed)."""
    with psycopg.connect(dsn, autocommit=True) as connection:
        yield connection


def lease_owner(admin: Any, key: str) -> Optional[str]:
    row = admin.execute(f"SELECT owner FROM {TABLE} WHERE key = %s", (key,)).fetchone()
    return None if row is None else row[0]


def counter_and_log(admin: Any) -> tuple[int, list[tuple[int, str]]]:
    (value,) = admin.execute("SELECT value FROM counter WHERE id = 1").fetchone()
    return value, [tuple(row) for row in admin.execute("SELECT value, owner FROM commits ORDER BY value")]


def stop(pid: int) -> None:
    """SIGSTOP ``pid`` and block until the kernel reports it stopped (WUNTRACED reaps nothing)."""
    os.kill(pid, signal.SIGSTOP)
    waited_pid, status = os.waitpid(pid, os.WUNTRACED)
    assert waited_pid == pid and os.WIFSTOPPED(status), f"child not stopped: status {status}"


def resume(child: Any) -> None:
    """Tell a stopped child to go on (the message waits in its pipe), then SIGCONT it."""
    child.ctl.send("go")
    os.kill(child.proc.pid, signal.SIGCONT)


# ---- contention -----------------------------------------------------------------------------------
def test_sixteen_processes_never_hold_a_key_at_the_same_time(children: Children, dsn: str, admin: Any) -> None:
    holds = run_contenders(children, dsn, TABLE, "hot", CONTENDERS, ROUNDS, True, 2.0)
    assert len(holds) == CONTENDERS * ROUNDS
    assert len({hold[2] for hold in holds}) == len(holds), "an owner id was reused"
    assert_exclusive(holds, CONTENDERS)
    row = admin.execute(f"SELECT owner, fence FROM {TABLE} WHERE key = 'hot'").fetchone()
    assert row == (None, CONTENDERS * ROUNDS)  # every hold released; one fence step per acquisition


def test_a_counter_guarded_by_check_in_counts_every_commit(children: Children, dsn: str, admin: Any) -> None:
    workers = [children.start(mp_workers.pg_counter, dsn, TABLE, "counter", COUNTER_ROUNDS, 2.0)
               for _ in range(COUNTER_PROCESSES)]
    for worker in workers:
        receive(worker, "ready")
    for worker in workers:
        worker.ctl.send("start")
    commits = [receive(worker, "done")[2] for worker in workers]
    for worker in workers:
        worker.proc.join(timeout=JOIN_S)
        assert worker.proc.exitcode == 0
    value, log = counter_and_log(admin)
    assert sum(commits) == COUNTER_PROCESSES * COUNTER_ROUNDS  # no transaction was refused
    assert value == sum(commits), f"lost updates: counter {value}, commits {commits}"
    assert [logged for logged, _ in log] == list(range(1, value + 1))
    assert len({owner for _, owner in log}) == len(log)  # each commit under its own acquisition


# ---- a SIGSTOPped holder --------------------------------------------------------------------------
def test_a_holder_stopped_before_check_in_is_refused_after_a_takeover(
    children: Children, dsn: str, admin: Any
) -> None:
    key = "stopped-before"
    child = children.start(mp_workers.pg_stop_in_transaction, dsn, TABLE, key, LEASE_S, False)
    _, pid, child_owner, _ = receive(child, "held")
    stop(pid)
    client = PostgresClient(dsn)
    connection = psycopg.connect(dsn)
    try:
        started = time.monotonic()
        with SyncDistributedLock(client, table=TABLE, key=key, lease_duration=5.0, wait_timeout=10) as lease:
            waited = time.monotonic() - started
            assert lease_owner(admin, key) == lease.owner != child_owner
            with connection.transaction():
                mp_workers.pg_increment(lease, connection)
            resume(child)
            _, _, outcomes = receive(child, "done")
            lease.raise_if_lost()  # the resumed holder changed nothing of ours
            assert lease_owner(admin, key) == lease.owner
        assert MIN_TAKEOVER_S <= waited < MAX_TAKEOVER_S, f"took over after {waited:.3f} s"
    finally:
        connection.close()
        client.close()
    child.proc.join(timeout=JOIN_S)
    assert child.proc.exitcode == 0
    assert outcomes["valid_before_stop"] is True
    # Resumed past its lease, the holder's check_in refuses at once on its own clock (its renewals had
    # failed meanwhile: "unreachable"; else "expired"); the lease row says the same: "stolen".
    refused = outcomes["transaction"]
    assert refused["type"] == "LockLost" and refused["cause"] in ("unreachable", "expired"), refused
    row_check = outcomes["row_check"]
    assert (row_check["type"], row_check.get("cause")) == ("LockLost", "stolen"), row_check
    assert outcomes["exit"]["type"] == "LockLost" and outcomes["state"] == "lost", outcomes
    assert counter_and_log(admin) == (1, [(1, lease.owner)]), "the stopped holder's write landed"


def test_a_holder_stopped_after_check_in_holds_off_the_takeover_until_it_commits(
    children: Children, dsn: str, admin: Any
) -> None:
    """The holder's transaction keeps its FOR KEY SHARE lock on the lease row while it is stopped, past
    its lease: the takeover waits (each try ends at its lock_timeout and is retried) and commits only once
    the holder's transaction has committed, after it. Nothing is unsafe: the two writes are in order."""
    key = "stopped-after"
    child = children.start(mp_workers.pg_stop_in_transaction, dsn, TABLE, key, LEASE_S, True)
    _, pid, child_owner, backend = receive(child, "held")
    stop(pid)
    client = PostgresClient(dsn)
    taken: list[Any] = []
    contender_errors: list[BaseException] = []

    def contend() -> None:
        connection = psycopg.connect(dsn)
        try:
            with SyncDistributedLock(client, table=TABLE, key=key, lease_duration=LEASE_S,
                                     wait_timeout=MAX_TAKEOVER_S + BLOCKED_BOUND_S) as lease:
                taken.append((lease.owner, time.monotonic()))
                with connection.transaction():
                    mp_workers.pg_increment(lease, connection)
        except BaseException as error:  # noqa: BLE001 - asserted on below
            contender_errors.append(error)
        finally:
            connection.close()

    contender = threading.Thread(target=contend)
    contender.start()
    try:
        blocked = set()

        def two_tries_blocked() -> bool:  # two takeover tries, each blocked by the holder
            assert taken == [], "the key was taken over inside the stopped holder's checked-in transaction"
            blocked.update(admin.execute(  # statements on the lock table waiting for the holder's backend
                "SELECT pid, query_start FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid)) "
                "AND position(%s in query) > 0", (backend, f'"{TABLE}"')).fetchall())
            return len(blocked) >= 2

        wait_until(two_tries_blocked, BLOCKED_BOUND_S,
                   lambda: f"two takeover tries to wait on the holder's transaction (seen: {blocked})", interval=0.01)
        assert taken == [] and contender_errors == [], (taken, contender_errors)
        assert lease_owner(admin, key) == child_owner
        assert counter_and_log(admin) == (0, [])
        resumed_at = time.monotonic()
        resume(child)
        _, _, outcomes = receive(child, "done")
        contender.join(MAX_TAKEOVER_S + BLOCKED_BOUND_S)
        assert not contender.is_alive()
    finally:
        if contender.is_alive():  # an assertion above failed: let the holder go so the contender ends
            os.kill(pid, signal.SIGKILL)
            contender.join(MAX_TAKEOVER_S + BLOCKED_BOUND_S)
        client.close()
    child.proc.join(timeout=JOIN_S)
    assert child.proc.exitcode == 0
    assert contender_errors == [], contender_errors
    (contender_owner, taken_at), = taken
    assert taken_at > resumed_at
    # The holder's transaction committed: no takeover had, so the row was still ours under the lock.
    # Its lease lapsed on its own clock while it was stopped, which leaving the block reports.
    assert outcomes["transaction"]["type"] is None, outcomes
    assert outcomes["exit"]["type"] == "LockLost", outcomes
    assert counter_and_log(admin) == (2, [(1, child_owner), (2, contender_owner)])


# ---- a SIGKILLed holder ---------------------------------------------------------------------------
def test_a_sigkilled_holder_is_taken_over_within_its_lease_and_a_poll(children: Children, dsn: str,
                                                                       admin: Any) -> None:
    key = "killed"
    child = children.start(mp_workers.hold_until_killed, dsn, TABLE, key, LEASE_S, "fastlease", True)
    _, pid, child_owner = receive(child, "held")
    assert pid == child.proc.pid and lease_owner(admin, key) == child_owner
    kill_and_reap(child)
    client = PostgresClient(dsn)
    try:
        started = time.monotonic()
        with SyncDistributedLock(client, table=TABLE, key=key, lease_duration=LEASE_S, wait_timeout=10) as lease:
            waited = time.monotonic() - started
            assert lease_owner(admin, key) == lease.owner != child_owner
            assert lease.fencing_token == 2
        bound = LEASE_S + POLL_INTERVAL_MS / 1000 + REQUEST_SLACK_S
        assert MIN_TAKEOVER_S <= waited <= bound, f"took over after {waited:.3f} s (bound {bound:.3f} s)"
    finally:
        client.close()
