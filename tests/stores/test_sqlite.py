"""The embedded SQLite store: the engine on a real file, check_in, bad paths, and real processes.

The store contract itself runs in ``test_contract.py``; these tests drive the public API.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from fastlease import SQLiteClient, SyncDistributedLock
from fastlease.exceptions import LockLost, LockNotAcquired, MalformedLockRow
from fastlease.testing import NO_USAGE, FakeClock
from helpers import mp_workers
from helpers.processes import MAX_TAKEOVER_S, MIN_TAKEOVER_S, Children, kill_and_reap, receive, run_contenders

CONTENDERS = 16
ROUNDS = 8


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "locks.db"


@pytest.fixture
def make_sqlite(core, db):
    clients = []

    def build(**kwargs):
        client = SQLiteClient(kwargs.pop("path", db), _engine_module=core, **kwargs)
        clients.append(client)
        return client

    yield build
    for client in clients:
        client.close()


def raw_rows(db: Path, table: str = "locks") -> list:
    with sqlite3.connect(db) as connection:
        return connection.execute(
            f'SELECT key, owner, version, lease_ms, protocol, waiting, fence FROM "fastlease_lock_{table}" ORDER BY key'
        ).fetchall()


def test_a_hold_costs_two_writes_and_the_fence_survives_release(make_sqlite, db):
    client = make_sqlite()
    with SyncDistributedLock(client, table="locks", key="import:daily") as lease:
        [(key, owner, version, lease_ms, protocol, waiting, fence)] = raw_rows(db)
        assert (key, owner, lease_ms, protocol, waiting, fence) == ("import:daily", lease.owner, 30_000, 1, 0, 1)
        assert isinstance(version, str) and version
    assert (lease.metrics.write_requests, lease.metrics.read_requests) == (2, 0)
    assert raw_rows(db) == [("import:daily", None, None, 30_000, 1, 0, 1)]  # free, the counter kept
    assert lease.fencing_token == 1
    with SyncDistributedLock(client, table="locks", key="import:daily") as again:
        assert raw_rows(db)[0][6] == again.fencing_token == 2  # every acquisition advances it


def test_contention_and_takeover_of_an_abandoned_row_after_its_lease(make_sqlite, db):
    clock = FakeClock()
    holder, contender = make_sqlite(clock=clock), make_sqlite(clock=clock)
    with SyncDistributedLock(holder, table="locks", key="k"):
        with pytest.raises(LockNotAcquired):
            SyncDistributedLock(contender, table="locks", key="k", wait_timeout=0).__enter__()
    with sqlite3.connect(db) as connection:  # a crashed holder's row: nobody renews or releases it
        connection.execute("UPDATE fastlease_lock_locks SET owner = 'dead', version = 'v', lease_ms = 5000")
    start = clock.monotonic_ns()
    with SyncDistributedLock(contender, table="locks", key="k", lease_duration=5, wait_timeout=30) as lease:
        assert clock.monotonic_ns() - start == 5_000_000_000  # one full lease of unchanged observation
        assert raw_rows(db)[0][1] == lease.owner
        assert raw_rows(db)[0][6] == 2  # the takeover advanced the fence too


@pytest.mark.parametrize(
    "row",
    [
        # (Column affinity stores "10000" in lease_ms as the integer 10000, a value and not a fault.)
        ("o", "v", 10_000, 2, 0),
        ("o", "v", 10_000.5, 1, 0),
        ("o", "v", b"\x27\x10", 1, 0),
        ("o", "v", 50, 1, 0),
        ("o", b"v", 10_000, 1, 0),
        ("o", "v", 10_000, 1, 2),
    ],
)
def test_malformed_rows_fail_closed_and_are_never_taken_over(make_sqlite, db, row):
    clock = FakeClock()
    client = make_sqlite(clock=clock)
    with SyncDistributedLock(client, table="locks", key="other"):
        pass  # creates the table
    with sqlite3.connect(db) as connection:
        connection.execute(
            'INSERT INTO "fastlease_lock_locks" (key, owner, version, lease_ms, protocol, waiting)'
            " VALUES (?, ?, ?, ?, ?, ?)",
            ("k", *row),
        )
    before = [r for r in raw_rows(db) if r[0] == "k"]
    with pytest.raises(MalformedLockRow):
        SyncDistributedLock(client, table="locks", key="k", wait_timeout=60).__enter__()
    clock.advance(3600)
    with pytest.raises(MalformedLockRow):
        SyncDistributedLock(client, table="locks", key="k", wait_timeout=0).__enter__()
    assert [r for r in raw_rows(db) if r[0] == "k"] == before


def results_connection(db: Path) -> sqlite3.Connection:
    connection = sqlite3.connect(db, isolation_level=None)
    connection.execute("CREATE TABLE IF NOT EXISTS results (job TEXT PRIMARY KEY, summary TEXT)")
    return connection


def test_check_in_commits_with_the_lease(make_sqlite, db):
    client = make_sqlite()
    connection = results_connection(db)
    with SyncDistributedLock(client, table="locks", key="job") as lease:
        connection.execute("BEGIN IMMEDIATE")
        lease.check_in(connection)
        connection.execute("INSERT INTO results VALUES ('job', 'done')")
        connection.execute("COMMIT")
    assert connection.execute("SELECT summary FROM results").fetchall() == [("done",)]
    assert lease.metrics.write_requests == 2  # the check rides in the caller's transaction


def test_check_in_rejects_a_former_owner_after_a_takeover(make_sqlite, db):
    clock = FakeClock()
    old, new = make_sqlite(clock=clock), make_sqlite(clock=clock)
    stale = SyncDistributedLock(old, table="locks", key="job", lease_duration=1)
    stale.__enter__()
    old.close()  # paused: no renewals
    with SyncDistributedLock(new, table="locks", key="job", lease_duration=1, wait_timeout=10):
        connection = results_connection(db)
        connection.execute("BEGIN IMMEDIATE")
        with pytest.raises(LockLost) as lost:
            stale._lease.client._check_in(stale._lease, connection)  # past the local check: the row decides
        assert lost.value.cause == "stolen"
        connection.execute("ROLLBACK")
    assert connection.execute("SELECT count(*) FROM results").fetchone() == (0,)
    assert stale.lost_cause == "stolen"


def test_check_in_rules(make_sqlite, db, tmp_path):
    client = make_sqlite()
    with SyncDistributedLock(client, table="locks", key="job") as lease:
        with pytest.raises(TypeError, match="sqlite3.Connection"):
            lease.check_in(object())
        with pytest.raises(ValueError, match="inside a transaction"):
            lease.check_in(results_connection(db))
        other = results_connection(tmp_path / "other.db")
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(ValueError, match="not on this client's file"):
            lease.check_in(other)
        other.execute("ROLLBACK")


def test_bad_paths_raise_value_error_naming_the_path(core, tmp_path):
    missing = tmp_path / "no-such-dir" / "locks.db"
    with pytest.raises(ValueError, match="does not exist") as info:
        SQLiteClient(missing, _engine_module=core)
    assert str(missing.parent) in str(info.value)
    with pytest.raises(ValueError, match="is a directory"):
        SQLiteClient(tmp_path, _engine_module=core)
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"this is not a database file, just text " * 200)
    with pytest.raises(ValueError, match="unusable") as info:
        SQLiteClient(corrupt, _engine_module=core)
    assert "corrupt.db" in str(info.value)
    with pytest.raises(TypeError, match="file path"):
        SQLiteClient(42, _engine_module=core)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", [":memory:", "", "file::memory:?cache=shared", "file:locks.db"])
def test_an_in_memory_database_is_refused_and_points_to_memory_client(core, tmp_path, monkeypatch, name):
    # Before, SQLiteClient(":memory:") created files literally named ':memory:*' in the directory.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="use MemoryClient\\(\\) instead") as info:
        SQLiteClient(name, _engine_module=core)
    assert repr(name) in str(info.value)
    assert list(tmp_path.iterdir()) == []  # nothing created


@pytest.mark.parametrize("options, error, message", [
    ({"renewal": "process"}, ValueError, "renewal must be 'auto' or 'thread'"),
    ({"shared_observations": 1}, TypeError, "shared_observations must be"),
    ({"wake_on_release": False}, TypeError, r"unexpected keyword arguments \['wake_on_release'\]"),
])
def test_bad_client_options_leave_no_file_behind(tmp_path, options, error, message):
    path = tmp_path / "locks.db"
    with pytest.raises(error, match=message):
        SQLiteClient(path, **options)
    assert sorted(tmp_path.iterdir()) == []


@pytest.mark.parametrize("table", ["ab", 'x"; DROP TABLE t; --', "a b c", "é" * 5, ""])
def test_bad_table_names_are_refused_before_any_sql(make_sqlite, db, table):
    client = make_sqlite()
    with pytest.raises(ValueError, match="table must be"):
        SyncDistributedLock(client, table=table, key="k").__enter__()


# ---- real processes on one file ------------------------------------------------------------------
def test_sixteen_processes_never_hold_a_key_at_the_same_time(children: Children, db: Path) -> None:
    holds = run_contenders(children, f"sqlite:{db}", "locks", "hot", CONTENDERS, ROUNDS, True, 2.0)
    assert len(holds) == CONTENDERS * ROUNDS
    holds.sort()  # CLOCK_MONOTONIC is system-wide on Linux: intervals of all processes compare
    overlaps = [(a, b) for a, b in zip(holds, holds[1:]) if b[0] <= a[1]]
    assert not overlaps, f"{len(overlaps)} overlapping holds, e.g. {overlaps[:3]}"
    assert sum(1 for a, b in zip(holds, holds[1:]) if a[3] != b[3]) >= CONTENDERS
    assert all(row[1] is None for row in raw_rows(db))  # every hold released
    assert raw_rows(db)[0][6] == CONTENDERS * ROUNDS  # one fence step per acquisition


def test_a_sigkilled_holder_is_taken_over_after_its_lease(children: Children, db: Path) -> None:
    target = f"sqlite:{db}"
    child = children.start(mp_workers.hold_until_killed, target, "locks", "killed", 1.0, "fastlease", True)
    _, pid, child_owner = receive(child, "held")
    assert pid == child.proc.pid and raw_rows(db)[0][1] == child_owner
    kill_and_reap(child)
    client = SQLiteClient(db)
    try:
        started = time.monotonic()
        with SyncDistributedLock(client, table="locks", key="killed", lease_duration=1.0, wait_timeout=10) as lease:
            waited = time.monotonic() - started
            assert raw_rows(db)[0][1] == lease.owner != child_owner
        assert MIN_TAKEOVER_S <= waited < MAX_TAKEOVER_S, f"took over after {waited:.3f} s"
    finally:
        client.close()


def test_a_busy_file_is_a_retryable_not_applied_error(db):
    from fastlease.exceptions import StoreError
    from fastlease.stores.sqlite import SQLiteStore

    store = SQLiteStore(db)
    other = sqlite3.connect(db, isolation_level=None)
    try:
        assert store.put_if_absent("locks", "k", "o", "v", 1000, 1.0, NO_USAGE) == 1  # creates the table (token 1)
        other.execute("BEGIN IMMEDIATE")  # another process holds the file's write lock
        with pytest.raises(StoreError) as info:
            store.put_if_absent("locks", "k2", "o", "v", 1000, 0.05, NO_USAGE)
        assert info.value.maybe_committed is False and info.value.key == "k2"
        other.execute("ROLLBACK")
        assert store.put_if_absent("locks", "k2", "o", "v", 1000, 1.0, NO_USAGE) == 1
    finally:
        other.close()
        store.close()


@pytest.mark.parametrize("table", ["jobs", "unlocked_jobs"])  # a name containing "locked" changes nothing
def test_a_lock_table_dropped_underneath_is_refused_not_reconciled(db, table):
    from fastlease.exceptions import StoreRequestRejected
    from fastlease.stores.sqlite import SQLiteStore

    store = SQLiteStore(db)
    try:
        assert store.put_if_absent(table, "k", "o", "v", 1000, 1.0, NO_USAGE) == 1
        with sqlite3.connect(db) as connection:
            connection.execute(f'DROP TABLE "fastlease_lock_{table}"')
        with pytest.raises(StoreRequestRejected, match="no such table"):
            store.put_if_absent(table, "k", "o", "v", 1000, 1.0, NO_USAGE)
    finally:
        store.close()


def test_an_sqlite_too_old_for_the_upsert_is_refused_at_once(db, monkeypatch):
    monkeypatch.setattr(sqlite3, "sqlite_version_info", (3, 23, 1))
    monkeypatch.setattr(sqlite3, "sqlite_version", "3.23.1")
    with pytest.raises(RuntimeError, match="needs SQLite 3.24.0 or later; this Python links SQLite 3.23.1"):
        SQLiteClient(db)
    assert not db.exists()


def test_a_read_only_file_is_refused_naming_the_path(read_only_file):
    with pytest.raises(ValueError, match="read-only|unusable") as info:
        SQLiteClient(read_only_file)
    assert str(read_only_file) in str(info.value)
