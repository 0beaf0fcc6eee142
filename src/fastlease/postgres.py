"""The PostgreSQL client: leases and idempotency keys on a PostgreSQL database, with fencing tokens and
``check_in`` inside the caller's own psycopg transaction."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Optional

from .client import LeaseClient, idempotency_lock_table
from .exceptions import StoreRequestRejected
from .stores.postgres.sql import CHECK_IN, IDENTITY, sql_identifier
from .stores.postgres.store import PostgresStore

if TYPE_CHECKING:
    from ._engine import Clock

__all__ = ["PostgresClient"]


class PostgresClient(LeaseClient):
    """A lease client on a PostgreSQL database (psycopg 3: ``pip install 'fastlease[postgres]'``).

    ``PostgresClient("postgresql://app@db.internal/app")``, or an open ``psycopg.Connection`` or a
    ``psycopg_pool.ConnectionPool`` whose connection settings (host, database, user, password, TLS,
    ...) are used. Lock requests never run on your connections: the client opens its own, in
    autocommit mode, one per concurrent request, each request bounded by its timeout. Nothing is sent
    until the first request. Pass ``transaction_pooling=True`` when the DSN goes through a PgBouncer in
    transaction mode: the client then keeps no session state on its connections (no timeout settings,
    no prepared statements; see docs/operations.md), and each request is still bounded by its deadline.
    A waiting client LISTENs for releases made by any process (one more connection, while it waits),
    so it takes its turn at once instead of at its next poll; ``wake_on_release=False`` only polls.

    Create the tables once, at deployment: ``client.create_lock_table("locks")`` and, for idempotency
    keys, ``client.create_idempotency_table("requests")``; lock operations never create tables.
    ``lease.fencing_token`` is a per-key counter that strictly increases with every acquisition and
    takeover. ``lease.check_in(conn)`` checks ownership inside your open transaction on ``conn``, and
    keeps any takeover from committing until that transaction ends.
    """

    store: PostgresStore

    def __init__(self, target: Any, *, clock: Optional[Clock] = None, transaction_pooling: bool = False,
                 wake_on_release: bool = True, **engine: Any) -> None:
        for name, value in (("transaction_pooling", transaction_pooling), ("wake_on_release", wake_on_release)):
            if type(value) is not bool:
                raise TypeError(f"{name} must be a bool, got {value!r:.80}")
        conninfo, password = connection_settings(target)
        self.store = PostgresStore(conninfo, password, transaction_pooling)
        super().__init__(self.store, clock=clock, **engine)
        # Waiters LISTEN for releases made anywhere; every release notifies, whatever this setting.
        self.engine.release_feed = self.store.release_feed if wake_on_release else None
        # Waiters queue in the line of waiters of each key, each woken alone on its turn by the feed.
        self.engine.line = self.store if wake_on_release else None
        #: The identity (server, database, lock table) of each lock table, as our connections see it.
        self._identities: dict[str, tuple[str, str, Optional[int]]] = {}
        #: The same, as each caller's connection sees it (a connection's server and database never change).
        self._caller_identities: "weakref.WeakKeyDictionary[Any, dict[str, tuple[Any, ...]]]" = (
            weakref.WeakKeyDictionary())

    def __repr__(self) -> str:
        return f"PostgresClient({self.store.describe()})"

    def _observation_scope(self) -> str:
        return f"postgres:{self.store.describe()}"

    # ---- tables (deployment-time helpers; lock operations never call these) ----------------------
    def create_lock_table(self, name: str) -> None:
        """Create a lock table (the schema is in docs/protocol.md). An existing table with the same
        columns is fine (a rerun); one with other columns raises StoreRequestRejected."""
        self.store.create_table(name, records=False)

    def create_idempotency_table(self, name: str, *, lock_table: Optional[str] = None) -> None:
        """Create what ``@idempotent(client, table=name)`` needs: the record table, with the index its
        expiry purge reads, and the lock table of its in-flight leases, ``lock_table`` (default
        ``<name>_locks``). Both names are checked (the library's rule and PostgreSQL's 63 characters)
        before either is created. Existing tables with the same columns are fine (a rerun); other
        columns raise StoreRequestRejected."""
        locks = idempotency_lock_table(self.engine_module, name, lock_table)
        sql_identifier(name)
        sql_identifier(locks)
        self.store.create_table(name, records=True)
        self.store.create_table(locks, records=False)  # (after the records, whose column check may refuse)

    def lock_table_exists(self, name: str) -> bool:
        """True if ``name`` resolves to a table on the client's connections (their search_path)."""
        return bool(self.store.columns(name))

    def inspect(self, table: str, key: Optional[str] = None) -> list[dict[str, Any]]:
        return self.store.inspect(table, key)

    # ---- check_in ----------------------------------------------------------------------------------
    def _check_in(self, lease: Any, transaction: Any) -> None:
        """Lock the lease row in the caller's transaction and check that it is still ours.

        Why this is sound: the row is locked ``FOR KEY SHARE`` until the caller's transaction ends, and
        a takeover or a release must lock it ``FOR UPDATE`` before it writes, which waits for that lock.
        So if the row is ours now, no takeover (and no acquisition after a release) commits before the
        caller's transaction does; if it is not, the caller gets LockLost (``stolen``) before it writes.
        Renewals take a weaker lock, which ``FOR KEY SHARE`` lets through.
        """
        import psycopg

        connection = transaction
        if not isinstance(connection, psycopg.Connection):
            kind = type(connection).__name__
            raise TypeError(
                f"check_in takes a psycopg.Connection inside a transaction, got {kind}"
                + (": run check_in with a sync connection (the async API runs lock steps on threads)"
                   if isinstance(connection, psycopg.AsyncConnection) else "")
            )
        if connection.closed:
            raise ValueError("check_in: the connection is closed")
        status = connection.info.transaction_status
        if status == psycopg.pq.TransactionStatus.INERROR:
            raise ValueError("check_in: the connection's transaction has already failed; roll it back first")
        if connection.autocommit and status == psycopg.pq.TransactionStatus.IDLE:
            raise ValueError(
                "check_in needs a transaction that you commit, but the connection is in autocommit mode: "
                "use 'with conn.transaction():' around the writes and the check_in, or autocommit=False"
            )
        name = sql_identifier(lease.table)
        theirs = self._caller_identity(connection, lease.table, name)
        ours = self._identities.get(lease.table)
        if ours is None:
            ours = self._identities[lease.table] = self.store.identity(lease.table)
        if ours[2] is None:
            raise StoreRequestRejected(f"check_in: the lock table {lease.table!r} does not exist "
                                       f"on {self.store.describe()}", key=lease.key)
        if theirs != ours:
            raise ValueError(
                f"check_in: the connection is not on this client's database and lock table "
                f"({self.store.describe()}, table {lease.table!r}): connect both to the same database, with the "
                "same search_path"
            )
        held = connection.execute(CHECK_IN.format(name=name), (lease.key, lease.owner)).fetchone()
        if held is None:
            raise lease.lost_to_store("check_in found another owner")

    def _caller_identity(self, connection: Any, table: str, name: str) -> tuple[Any, ...]:
        known = self._caller_identities.setdefault(connection, {})
        found = known.get(table)
        if found is None:
            row = connection.execute(IDENTITY, (name,)).fetchone()
            found = known[table] = (str(row[0]), str(row[1]), None if row[2] is None else int(row[2]))
        return found

    def close(self) -> None:
        super().close()
        self.store.close()


def connection_settings(target: Any) -> tuple[str, Optional[str]]:
    """The connection string (without its password) and the password, from a DSN, a psycopg
    connection or a psycopg_pool pool. Bad values raise TypeError/ValueError naming them."""
    try:
        import psycopg
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError("PostgresClient needs psycopg 3: pip install 'fastlease[postgres]'") from error
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    if isinstance(target, str):
        try:
            settings = conninfo_to_dict(target)
        except psycopg.ProgrammingError as error:
            raise ValueError(f"PostgresClient: bad connection string {_without_password(target)!r}: "
                             f"{str(error).strip()}") from None
    elif isinstance(target, (psycopg.Connection, psycopg.AsyncConnection)):
        if target.closed:
            raise ValueError("PostgresClient: the psycopg connection given is closed; pass an open one or a DSN")
        settings = conninfo_to_dict(target.info.dsn)
        if target.info.password:
            settings["password"] = target.info.password
    elif _is_pool(target):
        settings = conninfo_to_dict(target.conninfo)
        keywords = {option.keyword.decode() for option in psycopg.pq.Conninfo.get_defaults()}
        settings.update({name: value for name, value in (target.kwargs or {}).items()
                         if name in keywords and isinstance(value, (str, int))})
    else:
        raise TypeError(
            "PostgresClient takes a connection string (DSN), a psycopg.Connection or a psycopg_pool "
            f"ConnectionPool, got {type(target).__name__}"
        )
    password = settings.pop("password", None)
    return make_conninfo("", **{name: value for name, value in settings.items() if value is not None}), (
        None if password is None else str(password))


def _is_pool(target: Any) -> bool:
    module = type(target).__module__ or ""
    return module.startswith("psycopg_pool") and hasattr(target, "conninfo") and hasattr(target, "kwargs")


def _without_password(dsn: str) -> str:
    """A DSN for messages: any password replaced."""
    import re

    dsn = re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", dsn)
    return re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", dsn)
