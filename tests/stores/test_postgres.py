"""The PostgreSQL store on a real server: what the client takes, its tables, ``check_in`` inside the
caller's transaction (a long one included), request timeouts against a blocked or stopped server, a
terminated connection, fork safety and the expiry of idempotency records.

The store contract runs in ``test_contract.py``, the idempotency suite in ``test_idempotency.py`` and
the held-GIL renewal in ``test_renewal_gil.py``, each with a postgres case. Each test gets an emptied
``public`` schema on the session's server (``postgres_db``). The store's own connections are found in
``pg_stat_activity`` by an ``application_name`` given to each client under test. Waits for the
server's state (a backend waiting on a lock, a renewal landing) poll that state, bounded by BOUND_S.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import uuid
from typing import Any

import psycopg
import psycopg_pool
import pytest
from psycopg.conninfo import make_conninfo

from fastlease import LockLost, PostgresClient, SyncDistributedLock
from fastlease.exceptions import StoreError, StoreRequestRejected
from fastlease.idempotency import IdempotentCall
from fastlease.stores.postgres import session as pg_session
from fastlease.stores.postgres import sql as pg_sql
from fastlease.testing import NO_USAGE, FakeClock
from helpers.waiting import wait_until

BOUND_S = 20.0
#: The slack allowed past a request's timeout on this shared 2-core machine (a scheduling delay of the
#: test's thread, not of the request: its deadline is checked on the client).
MARGIN_S = 1.5


def backends(admin: psycopg.Connection, app: str) -> list[int]:
    """The backend pids of the connections named ``app``."""
    rows = admin.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s ORDER BY pid", (app,))
    return [pid for (pid,) in rows]


def version_of(admin: psycopg.Connection, key: str, table: str = "locks") -> Any:
    row = admin.execute(f'SELECT version FROM "{table}" WHERE key = %s', (key,)).fetchone()
    return None if row is None else row[0]


def wait_for_a_renewal(admin: psycopg.Connection, key: str, what: str) -> None:
    """Wait until the row's version changes: the holder renewed (wherever its renewals run)."""
    seen = version_of(admin, key)
    wait_until(lambda: version_of(admin, key) != seen, BOUND_S, what)


def lock_waiter(admin: psycopg.Connection, app: str) -> Any:
    """(pid, query_start, blocking pids) of the backend named ``app`` while it waits for a lock, else None."""
    return admin.execute(
        "SELECT pid, query_start, pg_blocking_pids(pid) FROM pg_stat_activity "
        "WHERE application_name = %s AND wait_event_type = 'Lock'", (app,)).fetchone()


# ---- what the client takes --------------------------------------------------------------------------
def test_the_client_takes_a_dsn(make_client, admin):
    client = make_client("fl-dsn", tables=("locks",))
    with SyncDistributedLock(client, table="locks", key="k") as lease:
        assert [row["owner"] for row in client.inspect("locks")] == [lease.owner]
        assert len(backends(admin, "fl-dsn")) == 1


def test_the_client_takes_a_connection_its_settings_and_password_but_never_runs_on_it(postgres_db, admin):
    # The server trusts every local connection, so the password is not checked; it must still be kept
    # (for a server that does check it), apart from the connection string that messages show.
    caller = psycopg.connect(make_conninfo(postgres_db, application_name="fl-caller", password="s3cret-pw"))
    try:
        caller.execute("SELECT 1")  # the caller's own transaction, left open
        client = PostgresClient(caller)
        try:
            assert client.store.renewal_credentials() == "s3cret-pw"
            assert "s3cret-pw" not in client.store.conninfo + repr(client) + client.store.describe()
            client.create_lock_table("locks")
            with SyncDistributedLock(client, table="locks", key="k") as lease:
                assert client.inspect("locks", "k")[0]["owner"] == lease.owner
            ours = set(backends(admin, "fl-caller")) - {caller.info.backend_pid}
            assert len(ours) == 1, "the client opened no connection of its own with the caller's settings"
            # The caller's transaction saw none of it: still open, its last statement its own.
            assert caller.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
            [(query,)] = admin.execute("SELECT query FROM pg_stat_activity WHERE pid = %s",
                                       (caller.info.backend_pid,))
            assert query == "SELECT 1"
        finally:
            client.close()
    finally:
        caller.close()


def test_the_client_takes_a_pool_its_conninfo_and_kwargs(postgres_db, admin):
    pool = psycopg_pool.ConnectionPool(postgres_db, kwargs={"application_name": "fl-pool", "password": "pool-pw"},
                                       open=False)
    client = PostgresClient(pool)
    try:
        assert client.store.renewal_credentials() == "pool-pw"
        client.create_lock_table("locks")
        with SyncDistributedLock(client, table="locks", key="k"):
            assert len(backends(admin, "fl-pool")) == 1  # the pool itself was never opened
    finally:
        client.close()


@pytest.mark.parametrize("dsn, named", [
    ("host=db.internal password=hunter2 sslmode", "host=db.internal password=*** sslmode"),
    ("postgresql://app:hunter2@db.internal/app?nosuchoption=1", "postgresql://app:***@db.internal/app?nosuchoption=1"),
    ("host=db.internal password='hunter2 with spaces' bogus", "host=db.internal password=*** bogus"),
])
def test_a_bad_dsn_is_refused_naming_it_without_its_password(dsn, named):
    with pytest.raises(ValueError, match="bad connection string") as info:
        PostgresClient(dsn)
    assert named in str(info.value) and "hunter2" not in str(info.value)


@pytest.mark.parametrize("target", [42, b"host=localhost", None, {"host": "localhost"}])
def test_a_target_of_another_type_is_a_type_error(target):
    with pytest.raises(TypeError, match=f"got {type(target).__name__}"):
        PostgresClient(target)


def test_a_closed_connection_is_refused(postgres_db):
    connection = psycopg.connect(postgres_db)
    connection.close()
    with pytest.raises(ValueError, match="closed"):
        PostgresClient(connection)


def test_building_a_client_sends_nothing(make_client, admin):
    client = make_client("fl-lazy")
    assert backends(admin, "fl-lazy") == []
    assert client.lock_table_exists("locks") is False  # the first request connects
    assert len(backends(admin, "fl-lazy")) == 1


def test_the_default_application_name_is_fastlease(postgres_db, admin):
    client = PostgresClient(postgres_db)
    try:
        before = set(backends(admin, "fastlease"))
        client.lock_table_exists("locks")
        assert len(set(backends(admin, "fastlease")) - before) == 1
    finally:
        client.close()


def test_transaction_pooling_keeps_no_session_state_on_the_connections(make_client):
    # Behind a transaction-pooling PgBouncer, session settings and prepared statements would reach other
    # clients of the same server connection: with transaction_pooling=True the client sets neither.
    seen = {}
    for pooling in (False, True):
        client = make_client(f"fl-pooling-{pooling}", tables=("locks",), transaction_pooling=pooling)
        with SyncDistributedLock(client, table="locks", key=f"k-{pooling}", lease_duration=30):
            pass
        sessions = client.store._idle  # the connections that served the requests, idle again
        assert sessions
        timeouts = {session.connection.execute("SHOW statement_timeout").fetchone()[0] for session in sessions}
        prepared = sum(session.connection.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0]
                       for session in sessions)
        seen[pooling] = (timeouts, prepared)
    assert seen[True] == ({"0"}, 0)  # the server's default, and nothing prepared
    assert "0" not in seen[False][0] and seen[False][1] >= 2  # the acquisition and the release, prepared


def test_timeouts_a_few_ms_apart_keep_the_bounds_already_on_the_connection(make_client):
    # A handoff's acquisition carries what is left of its wait (4.987 s), its release the whole timeout:
    # setting the server's bounds anew for each cost a round trip per request. Far apart, they follow.
    client = make_client("fl-bounds", tables=("locks",))
    session = client.store._take(5.0)  # one connection serves these requests one after another
    try:
        def bound_after(timeout_s: float) -> str:
            session.run(b"SELECT 1", [], timeout_s, prepare=False)
            return str(session.connection.execute("SHOW statement_timeout").fetchone()[0])

        assert bound_after(5.0) == "4s"  # 80% of the request's timeout
        assert bound_after(4.987) == "4s" and bound_after(5.3) == "4s"  # within 60-85% of it: kept
        assert bound_after(1.0) == "800ms"  # 4 s would outlast the client's own deadline
        assert bound_after(2.0) == "1600ms"  # 800 ms would cancel statements early
    finally:
        client.store._give_back(session)


# ---- tables ---------------------------------------------------------------------------------------------
def test_creating_the_tables_twice_is_fine(make_client):
    client = make_client()
    for _ in range(2):
        client.create_lock_table("locks")
        client.create_idempotency_table("records")
    assert client.store.columns("locks") == pg_sql.LOCK_COLUMNS
    assert client.store.columns("records") == pg_sql.RECORD_COLUMNS


def test_four_clients_creating_one_table_at_once_all_succeed(make_client):
    clients = [make_client(f"fl-race-{index}") for index in range(4)]
    for client in clients:
        client.lock_table_exists("warm-up")  # connected, so that the creations below start together
    for round_ in range(6):  # PostgreSQL rejects all but one concurrent CREATE ... IF NOT EXISTS at times
        barrier = threading.Barrier(len(clients))
        errors: list[BaseException] = []

        def create(client: PostgresClient, round_: int = round_, barrier: threading.Barrier = barrier,
                   errors: list[BaseException] = errors) -> None:
            try:
                barrier.wait(BOUND_S)
                client.create_lock_table(f"locks_{round_}")
                client.create_idempotency_table(f"records_{round_}")
            except BaseException as error:  # noqa: BLE001 - reported below
                errors.append(error)

        threads = [threading.Thread(target=create, args=(client,)) for client in clients]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(BOUND_S)
        assert not any(thread.is_alive() for thread in threads)
        assert errors == []
        assert clients[0].store.columns(f"locks_{round_}") == pg_sql.LOCK_COLUMNS
        assert clients[0].store.columns(f"records_{round_}") == pg_sql.RECORD_COLUMNS


def test_a_table_with_other_columns_is_refused_naming_both_column_lists(make_client, admin):
    admin.execute('CREATE TABLE "locks" (key text PRIMARY KEY, payload jsonb)')
    client = make_client()
    with pytest.raises(StoreRequestRejected) as info:
        client.create_lock_table("locks")
    message = str(info.value)
    assert "found [('key', 'text'), ('payload', 'jsonb')]" in message
    assert f"expected {list(pg_sql.LOCK_COLUMNS)}" in message
    client.create_lock_table("real_locks")
    with pytest.raises(StoreRequestRejected, match=r"other columns than a fastlease idempotency record") as info:
        client.create_idempotency_table("real_locks")  # a lock table is not a record table
    assert f"found {list(pg_sql.LOCK_COLUMNS)}" in str(info.value)
    assert f"expected {list(pg_sql.RECORD_COLUMNS)}" in str(info.value)


def public_tables(admin: psycopg.Connection, lines: bool = False) -> list[str]:
    """The tables in schema public: the lock and record tables, or (``lines``) the lines of waiters."""
    return [name for (name,) in admin.execute(
        "SELECT tablename::text FROM pg_tables WHERE schemaname = 'public' ORDER BY 1")
        if name.startswith("fastlease_line_") == lines]


def test_lock_operations_on_a_missing_table_are_refused_and_create_nothing(make_client, admin):
    client = make_client()
    with pytest.raises(StoreRequestRejected) as info:
        with SyncDistributedLock(client, table="missing", key="k", wait_timeout=0):
            pass
    assert '"missing"' in str(info.value) and "create_lock_table" in str(info.value)
    with pytest.raises(StoreRequestRejected, match="create_idempotency_table") as info:
        with IdempotentCall(client, table="orders", key="o-1") as call:
            call.complete({"ok": True})
    assert '"orders"' in str(info.value)  # the record table, the first it reads
    assert public_tables(admin) == [] and public_tables(admin, lines=True) == []
    assert client.lock_table_exists("missing") is False
    for read in (lambda: client.inspect("missing"), lambda: client.inspect("missing", "k"),
                 lambda: client.holder("missing", "k")):
        with pytest.raises(StoreRequestRejected) as info:
            read()
        assert '"missing"' in str(info.value) and "create_lock_table" in str(info.value)
    assert public_tables(admin) == []


def test_one_call_creates_both_tables_an_idempotent_call_needs(make_client, admin):
    client = make_client()
    client.create_idempotency_table("payments")
    assert public_tables(admin) == ["payments", "payments_locks"]
    assert public_tables(admin, lines=True) == [pg_sql.line_table("payments_locks").strip('"')]
    assert client.store.columns("payments_locks") == pg_sql.LOCK_COLUMNS
    with IdempotentCall(client, table="payments", key="p-1") as call:
        call.complete("paid")
    # A lock table name over PostgreSQL's 63 characters is refused before anything is made.
    with pytest.raises(ValueError, match="at most 63 characters"):
        client.create_idempotency_table("r" * 60)
    assert public_tables(admin) == ["payments", "payments_locks"]


def test_table_names_longer_than_63_characters_are_refused(make_client, admin):
    client = make_client()
    client.create_lock_table("t" * 63)
    for use in (lambda: client.create_lock_table("t" * 64), lambda: client.create_idempotency_table("t" * 64),
                lambda: SyncDistributedLock(client, table="t" * 64, key="k").__enter__()):
        with pytest.raises(ValueError, match="at most 63 characters"):
            use()
    assert public_tables(admin) == ["t" * 63]  # not the 64-character name truncated onto it
    assert public_tables(admin, lines=True) == [pg_sql.line_table("t" * 63).strip('"')]


def test_injection_shaped_table_names_are_refused_by_the_alphabet(make_client, admin):
    client = make_client(tables=("locks",))
    for name in ('x"; DROP TABLE locks; --', 'locks" WHERE true; --', "locks;", "lo'cks"):
        for use in (lambda name=name: client.create_lock_table(name),
                    lambda name=name: SyncDistributedLock(client, table=name, key="k").__enter__()):
            with pytest.raises(ValueError, match=r"table must be 3-255 characters of A-Z a-z 0-9 _ \. -"):
                use()
    assert public_tables(admin) == ["locks"]


def test_dots_dashes_and_case_are_kept_in_quoted_table_names(make_client, admin):
    client = make_client(tables=("a.b-c", "Locks", "locks"))
    assert public_tables(admin) == ["Locks", "a.b-c", "locks"]  # in schema public, literally
    with SyncDistributedLock(client, table="a.b-c", key="k") as dotted, \
            SyncDistributedLock(client, table="Locks", key="k") as upper, \
            SyncDistributedLock(client, table="locks", key="k", wait_timeout=0) as lower:
        for table, lease in (("a.b-c", dotted), ("Locks", upper), ("locks", lower)):
            assert admin.execute(f'SELECT owner FROM "{table}"').fetchall() == [(lease.owner,)]


# ---- check_in ---------------------------------------------------------------------------------------
@pytest.fixture
def data_table(admin: psycopg.Connection) -> str:
    admin.execute("CREATE TABLE data (id int PRIMARY KEY, written_by text)")
    return "data"


def written(admin: psycopg.Connection) -> list[tuple]:
    return admin.execute("SELECT id, written_by FROM data ORDER BY id").fetchall()


def test_check_in_inside_a_transaction_passes_and_the_write_commits(make_client, postgres_db, admin, data_table):
    client = make_client(tables=("locks",))
    with psycopg.connect(postgres_db, autocommit=True) as conn, \
            SyncDistributedLock(client, table="locks", key="k") as lease:
        with conn.transaction():
            lease.check_in(conn)
            conn.execute("INSERT INTO data VALUES (1, %s)", (lease.owner,))
            assert written(admin) == []  # not before the caller's commit
        assert written(admin) == [(1, lease.owner)]


def test_check_in_after_a_takeover_raises_stolen_and_nothing_is_written(make_client, postgres_db, admin, data_table):
    client = make_client(tables=("locks",))
    thief = make_client("fl-thief")
    with psycopg.connect(postgres_db) as conn:
        with pytest.raises(LockLost) as at_exit:
            with SyncDistributedLock(client, table="locks", key="k", lease_duration=30) as lease:
                # A contender that saw the row unchanged for a whole lease takes it over: its store step.
                row = thief.store.read("locks", "k", 5.0, NO_USAGE)
                assert thief.store.replace_if("locks", "k", row.owner, row.version, "thief", "v-thief", 30_000,
                                              5.0, NO_USAGE)
                conn.execute("INSERT INTO data VALUES (1, 'before the check')")
                assert lease.is_valid()  # nothing local knows yet: only the store does
                with pytest.raises(LockLost) as info:
                    lease.check_in(conn)
                conn.rollback()
        assert info.value.cause == "stolen" and lease.lost_cause == "stolen"
        assert at_exit.value.cause == "stolen"  # the block's exit reports the loss too
    assert written(admin) == []
    assert admin.execute('SELECT owner FROM "locks"').fetchall() == [("thief",)]  # the release left it alone


def test_the_release_waits_for_a_checked_in_transaction_to_end(make_client, postgres_db, admin, data_table):
    # The release locks the row FOR UPDATE, as a takeover does: nobody acquires after it before the
    # caller's transaction, which checked in while the lease was held, has committed.
    client = make_client("fl-releaser", tables=("locks",))
    with psycopg.connect(postgres_db) as conn:
        errors: list[BaseException] = []

        def commit_once_the_release_waits() -> None:
            try:
                _, _, blocking = wait_until(lambda: lock_waiter(admin, "fl-releaser"), BOUND_S, "the release to wait")
                assert blocking == [conn.info.backend_pid]
                assert client.inspect("locks", "k") != []  # not freed while the transaction is open
                conn.commit()
            except BaseException as error:  # noqa: BLE001 - reported below
                errors.append(error)
                conn.rollback()

        committer = threading.Thread(target=commit_once_the_release_waits)
        with SyncDistributedLock(client, table="locks", key="k", lease_duration=5) as lease:
            lease.check_in(conn)
            conn.execute("INSERT INTO data VALUES (1, %s)", (lease.owner,))
            committer.start()
        committer.join(BOUND_S)
        assert not committer.is_alive() and errors == []
    assert lease.state == "released" and lease.lost_cause is None and client.inspect("locks") == []
    assert written(admin) == [(1, lease.owner)]


def test_check_in_refuses_autocommit_outside_a_transaction_and_a_failed_transaction(make_client, postgres_db):
    client = make_client(tables=("locks",))
    with SyncDistributedLock(client, table="locks", key="k") as lease:
        with psycopg.connect(postgres_db, autocommit=True) as conn:
            with pytest.raises(ValueError, match="autocommit"):
                lease.check_in(conn)
        with psycopg.connect(postgres_db) as conn:
            with pytest.raises(psycopg.errors.DivisionByZero):
                conn.execute("SELECT 1 / 0")
            with pytest.raises(ValueError, match="already failed"):
                lease.check_in(conn)
            conn.rollback()
            lease.check_in(conn)  # the same connection, in a new transaction: fine
            conn.rollback()
        closed = psycopg.connect(postgres_db)
        closed.close()
        with pytest.raises(ValueError, match="closed"):
            lease.check_in(closed)
        assert lease.is_valid()


def test_check_in_refuses_a_connection_to_another_database(make_client, postgres_db, admin):
    client = make_client(tables=("locks",))
    other = f"other_{uuid.uuid4().hex[:8]}"
    admin.execute(f"CREATE DATABASE {other}")
    try:
        other_dsn = make_conninfo(postgres_db, dbname=other)
        with psycopg.connect(other_dsn, autocommit=True) as setup:  # a table of the same name there too
            setup.execute('CREATE TABLE "locks" (key text PRIMARY KEY)')
        with SyncDistributedLock(client, table="locks", key="k") as lease, psycopg.connect(other_dsn) as conn:
            with pytest.raises(ValueError, match="not on this client's database"):
                lease.check_in(conn)
    finally:
        admin.execute(f"DROP DATABASE {other} WITH (FORCE)")


def test_check_in_refuses_a_search_path_that_resolves_the_table_elsewhere(make_client, postgres_db, admin):
    client = make_client(tables=("locks",))
    shadow = f"shadow_{uuid.uuid4().hex[:8]}"  # outside public: not emptied for the next test
    admin.execute(f"CREATE SCHEMA {shadow}")
    try:
        admin.execute(f'CREATE TABLE {shadow}."locks" (LIKE public."locks" INCLUDING ALL)')
        with SyncDistributedLock(client, table="locks", key="k") as lease:
            for search_path in (shadow, f"{shadow},public"):
                with psycopg.connect(make_conninfo(postgres_db, options=f"-c search_path={search_path}")) as conn:
                    with pytest.raises(ValueError, match="same search_path"):
                        lease.check_in(conn)
            with psycopg.connect(make_conninfo(postgres_db, options=f"-c search_path=public,{shadow}")) as conn:
                lease.check_in(conn)  # resolves to the same table: fine
    finally:
        admin.execute(f"DROP SCHEMA {shadow} CASCADE")


def test_check_in_refuses_an_async_connection_with_a_type_error(make_client, postgres_db):
    client = make_client(tables=("locks",))
    connection = asyncio.run(psycopg.AsyncConnection.connect(postgres_db))
    try:
        with SyncDistributedLock(client, table="locks", key="k") as lease:
            with pytest.raises(TypeError, match="sync connection"):
                lease.check_in(connection)
    finally:
        asyncio.run(connection.close())


LONG_LEASE_S = 1.0
#: The forced takeover's request timeout: long enough that the holder renews (every lease/3) meanwhile.
TAKEOVER_TIMEOUT_S = 1.0


def test_a_transaction_held_past_the_lease_makes_takeovers_wait_while_renewals_go_through(
    make_client, postgres_db, admin, data_table
):
    holder = make_client("fl-holder", tables=("locks",))
    contender = make_client("fl-contender")
    outcomes: list[Any] = []
    attempts_done = threading.Event()

    def take_over() -> None:
        # A contender whose observation says the holder is gone: the store step it then sends, on the
        # (owner, version) it read. Each attempt waits for the checked-in transaction, times out and is
        # retried, as the engine retries a request that timed out.
        try:
            for _ in range(6):
                row = contender.store.read("locks", "k", 5.0, NO_USAGE)
                try:
                    outcomes.append(contender.store.replace_if("locks", "k", row.owner, row.version, "contender",
                                                               "v-c", 30_000, TAKEOVER_TIMEOUT_S, NO_USAGE))
                except StoreError as error:
                    outcomes.append(error)
                if sum(isinstance(outcome, StoreError) for outcome in outcomes) >= 2:
                    break
        finally:
            attempts_done.set()

    with psycopg.connect(make_conninfo(postgres_db, application_name="fl-caller")) as conn:
        with SyncDistributedLock(holder, table="locks", key="k", lease_duration=LONG_LEASE_S) as lease:
            conn.execute("INSERT INTO data VALUES (1, %s)", (lease.owner,))
            lease.check_in(conn)
            checked_in_at = time.monotonic()
            thread = threading.Thread(target=take_over)
            thread.start()
            try:
                pid, query_start, blocking = wait_until(lambda: lock_waiter(admin, "fl-contender"), BOUND_S,
                                                        "the contender's takeover to wait for a lock")
                assert blocking == [conn.info.backend_pid]  # it waits for the caller's transaction
                wait_for_a_renewal(admin, "k", "a renewal while the takeover waits")
                still = lock_waiter(admin, "fl-contender")
                assert still is not None and still[:2] == (pid, query_start), "not the same waiting request"
                assert attempts_done.wait(BOUND_S)
            finally:
                thread.join(BOUND_S)
            timeouts = [outcome for outcome in outcomes if isinstance(outcome, StoreError)]
            assert len(timeouts) == 2 and all(not error.maybe_committed for error in timeouts), outcomes
            assert all(outcome is None for outcome in outcomes if not isinstance(outcome, StoreError)), outcomes
            assert time.monotonic() - checked_in_at > LONG_LEASE_S  # the transaction outlived the lease
            lease.raise_if_lost()
            conn.commit()
            assert written(admin) == [(1, lease.owner)]
            assert holder.inspect("locks", "k")[0]["owner"] == lease.owner  # no takeover landed
            # After the commit, a contender of the engine still waits: the holder keeps renewing.
            acquired = threading.Event()
            results: list[Any] = []

            def contend() -> None:
                try:
                    with SyncDistributedLock(contender, table="locks", key="k", lease_duration=LONG_LEASE_S,
                                             wait_timeout=BOUND_S) as second:
                        acquired.set()
                        results.append((time.monotonic(), second.fencing_token))
                except BaseException as error:  # noqa: BLE001 - reported below
                    results.append(error)

            second_thread = threading.Thread(target=contend)
            second_thread.start()
            for _ in range(4):  # four renewals after the commit: more than a lease of them
                wait_for_a_renewal(admin, "k", "the holder's renewals after the commit")
            assert not acquired.is_set()
            lease.raise_if_lost()
            token = lease.fencing_token
            releasing_at = time.monotonic()  # (a failed assert above releases too: the thread ends)
        second_thread.join(BOUND_S)
    assert not second_thread.is_alive()
    [(acquired_at, second_token)] = results
    assert acquired_at >= releasing_at and second_token == token + 1


# ---- request timeouts, a stopped server, a terminated connection --------------------------------------
def test_a_request_blocked_on_a_row_lock_fails_within_its_timeout_and_keeps_its_connection(make_client, admin):
    client = make_client("fl-blocked", tables=("locks",))
    timeout_s = 0.5
    assert client.store.put_if_absent("locks", "k", "o", "v", 30_000, timeout_s, NO_USAGE) == 1
    [pid] = backends(admin, "fl-blocked")
    with admin.transaction():
        admin.execute('SELECT 1 FROM "locks" WHERE key = %s FOR UPDATE', ("k",))
        started = time.monotonic()
        with pytest.raises(StoreError) as info:
            client.store.update_version_if("locks", "k", "o", "v", "v2", timeout_s, NO_USAGE)
        elapsed = time.monotonic() - started
    assert timeout_s * pg_session.SERVER_TIMEOUT_SHARE <= elapsed < timeout_s + MARGIN_S, elapsed
    assert info.value.maybe_committed is False and type(info.value) is StoreError
    assert client.store.update_version_if("locks", "k", "o", "v", "v2", timeout_s, NO_USAGE) is True
    assert backends(admin, "fl-blocked") == [pid]  # a server-side timeout leaves the connection usable


def test_a_stopped_server_fails_a_request_within_its_timeout_and_the_connection_is_dropped(make_client, admin):
    client = make_client("fl-stopped", tables=("locks",))
    timeout_s = 1.0
    assert client.store.put_if_absent("locks", "k", "o", "v", 30_000, timeout_s, NO_USAGE) == 1
    for operation, maybe_committed in (
        (lambda: client.store.update_version_if("locks", "k", "o", "v", "v2", timeout_s, NO_USAGE), True),
        (lambda: client.store.read("locks", "k", timeout_s, NO_USAGE), False),  # a read commits nothing
    ):
        [pid] = backends(admin, "fl-stopped")
        os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(StoreError) as info:
                operation()
            elapsed = time.monotonic() - started
            assert timeout_s <= elapsed < timeout_s + MARGIN_S, elapsed
            assert info.value.maybe_committed is maybe_committed and "timeout" in str(info.value)
            # The next request runs on a new connection, while the stopped backend still is stopped.
            assert client.store.read("locks", "k", timeout_s, NO_USAGE).owner == "o"
            assert len([other for other in backends(admin, "fl-stopped") if other != pid]) == 1
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_until(lambda pid=pid: pid not in backends(admin, "fl-stopped"), BOUND_S,
                   "the dropped connection's backend to exit")


def test_a_terminated_connection_is_replaced_before_the_next_request(make_client, admin):
    client = make_client("fl-terminated", tables=("locks",), renewal="thread")
    with SyncDistributedLock(client, table="locks", key="k", lease_duration=1.0) as lease:
        [pid] = backends(admin, "fl-terminated")
        assert admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,)).fetchone() == (True,)
        assert client.store.read("locks", "k", 1.0, NO_USAGE).owner == lease.owner  # no error: reconnected
        renewals = lease.metrics.renewals
        wait_until(lambda: lease.metrics.renewals > renewals, BOUND_S, "a renewal after the termination")
        lease.raise_if_lost()
        assert pid not in backends(admin, "fl-terminated")
    assert lease.lost_cause is None


# ---- fork safety ------------------------------------------------------------------------------------
@pytest.mark.parametrize("child_does", ["uses the client", "closes what it inherited"])
def test_a_forked_child_leaves_the_parents_connection_alone(make_client, admin, in_forked_child, child_does):
    client = make_client("fl-fork", tables=("locks",))
    assert client.store.put_if_absent("locks", "parent", "o", "v", 30_000, 5.0, NO_USAGE) == 1
    [pid] = backends(admin, "fl-fork")

    def child() -> str:
        if child_does == "uses the client":  # on a connection of its own: a read, then the client's close
            row = client.store.read("locks", "parent", 5.0, NO_USAGE)
            client.close()
            return f"read {row.owner}"
        for session in list(pg_session.ALL_SESSIONS):  # what the child's finalizers do at its exit
            session.close()
        return "closed"

    assert in_forked_child(child) == ("read o" if child_does == "uses the client" else "closed")
    [(last_query,)] = admin.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", (pid,))
    assert last_query.startswith("WITH put AS"), f"the child's request ran on the parent's connection: {last_query}"
    assert client.store.update_version_if("locks", "parent", "o", "v", "v2", 5.0, NO_USAGE) is True
    wait_until(lambda: backends(admin, "fl-fork") == [pid], BOUND_S, "only the parent's connection, the same one")
    assert admin.execute('SELECT key, owner, version FROM "locks"').fetchall() == [("parent", "o", "v2")]


# ---- idempotency records ----------------------------------------------------------------------------
def test_expired_records_are_purged_a_few_at_a_time_by_later_completions(make_client, admin):
    clock = FakeClock()
    client = make_client(clock=clock)
    client.create_idempotency_table("orders")
    client.create_lock_table("orders_locks")
    indexes = dict(admin.execute("SELECT indexname::text, indexdef FROM pg_indexes WHERE tablename = 'orders'"))
    expiry = [definition for definition in indexes.values() if "(expires_at_ms)" in definition]
    assert len(expiry) == 1 and "WHERE (expires_at_ms > 0)" in expiry[0], indexes

    def complete(key: str, ttl: float) -> None:
        with IdempotentCall(client, table="orders", key=key, ttl=ttl) as call:
            call.complete({"key": key})

    for index in range(40):
        complete(f"old-{index}", ttl=60)
    complete("kept", ttl=3600)
    clock.advance(61)

    def stored() -> tuple[int, int]:
        (old, total), = admin.execute("SELECT count(*) FILTER (WHERE key LIKE 'old-%%'), count(*) FROM orders")
        return old, total

    assert stored() == (40, 41)
    complete("new-0", ttl=3600)
    assert stored() == (40 - 16, 42 - 16)  # a few per completion, not all at once
    for index in range(1, 3):
        complete(f"new-{index}", ttl=3600)
    assert stored() == (0, 4)  # the unexpired ones stay
    with IdempotentCall(client, table="orders", key="kept") as again:
        assert again.replayed and again.result == {"key": "kept"}
