"""Embedded SQLite store: leases across the processes of one host, with no server.

One database file holds one SQL table per lock table name (``fastlease_lock_<table>``), created on
first use: unlike DynamoDB, where lock operations never create tables, an embedded store has no
deployment step to do it. The file is in WAL mode, so readers never block the writer.

Each protocol step is one parameterised statement in autocommit mode (a single statement is atomic in
SQLite), or one ``BEGIN IMMEDIATE`` transaction: acquisition and takeover read back the fencing token
they set, and release reads the row's ``waiting`` hint as it frees it. No wall clock is stored or
compared: stale rows are recovered by the engine's observation of an unchanged (owner, version,
lease_ms), exactly as on DynamoDB.

A released row is kept with ``owner`` NULL so that its ``fence`` counter survives: every acquisition
and takeover increments it in the same statement, and the lease reports it as ``fencing_token``.

Table names follow the library's rule (3-255 of ``A-Z a-z 0-9 _ . -``); SQL cannot take identifiers
as parameters, so the name is validated and then double-quoted, which that alphabet cannot break out
of. Every value is a parameter.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from typing import Any, Optional

from ..exceptions import StoreError, StoreRequestRejected
from .base import DELETED, DELETED_WITH_WAITERS, NOT_DELETED, LockRow, Record, UsageMeter, check_table, outcome_for_log

_log = logging.getLogger("fastlease.stores.sqlite")

__all__ = ["SQLiteStore"]

_PREFIX = "fastlease_lock_"
MIN_SQLITE_VERSION = (3, 24, 0)
#: One lock table. ``owner`` NULL means free (the row only keeps the fence counter).
_CREATE = """CREATE TABLE IF NOT EXISTS "{name}" (
    key      TEXT PRIMARY KEY NOT NULL,
    owner    TEXT,
    version  TEXT,
    lease_ms INTEGER,
    protocol INTEGER,
    waiting  INTEGER NOT NULL DEFAULT 0,
    fence    INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID"""
#: Acquire: insert, or revive a freed row; never touch a held one.
_PUT_IF_ABSENT = """INSERT INTO "{name}" (key, owner, version, lease_ms, protocol, waiting, fence)
VALUES (?, ?, ?, ?, 1, 0, 1)
ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, version = excluded.version,
    lease_ms = excluded.lease_ms, protocol = 1, waiting = 0, fence = fence + 1
WHERE owner IS NULL"""
#: Takeover: the whole row, only if it still holds exactly the observed owner and version.
_REPLACE_IF = """UPDATE "{name}" SET owner = ?, version = ?, lease_ms = ?, protocol = 1, waiting = 0,
    fence = fence + 1 WHERE key = ? AND owner = ? AND version = ?"""
#: Renew: only the version; lease_ms is the owner's and is never rewritten.
_UPDATE_VERSION_IF = """UPDATE "{name}" SET version = ? WHERE key = ? AND owner = ? AND version = ?"""
#: A contender's turn-taking hint, once per hold.
_MARK_WAITING = """UPDATE "{name}" SET waiting = 1 WHERE key = ? AND owner = ? AND version = ? AND waiting = 0"""
_READ = """SELECT owner, version, lease_ms, protocol, waiting, fence FROM "{name}"
WHERE key = ? AND owner IS NOT NULL"""
_INSPECT = """SELECT key, owner, version, lease_ms, protocol, waiting, fence FROM "{name}"
WHERE owner IS NOT NULL AND (? IS NULL OR key = ?) ORDER BY key"""
_WAITING_OF_OWNED = """SELECT waiting FROM "{name}" WHERE key = ? AND owner = ?"""
_FENCE = """SELECT fence FROM "{name}" WHERE key = ?"""
_FREE = """UPDATE "{name}" SET owner = NULL, version = NULL, waiting = 0 WHERE key = ? AND owner = ?"""
#: An idempotent call's completion deletes its row, fencing counter included: idempotency keys are
#: mostly used once and nothing reads their tokens, so a kept row per key would only grow the file.
_DELETE_OWNED = """DELETE FROM "{name}" WHERE key = ? AND owner = ?"""
#: check_in: a write (so the caller's transaction holds SQLite's one write lock from here to its
#: commit) that changes nothing and matches only while we own the row.
_CHECK_IN = """UPDATE "{name}" SET owner = owner WHERE key = ? AND owner = ?"""

#: One idempotency record table (``fastlease_record_<table>``): a row per key, written only under the lease.
_RECORD_PREFIX = "fastlease_record_"
_CREATE_RECORDS = """CREATE TABLE IF NOT EXISTS "{name}" (
    key           TEXT PRIMARY KEY NOT NULL,
    state         TEXT NOT NULL,
    fingerprint   TEXT NOT NULL,
    result        BLOB NOT NULL,
    expires_at_ms INTEGER NOT NULL,
    owner         TEXT NOT NULL
) WITHOUT ROWID"""
_READ_RECORD = """SELECT state, fingerprint, result, expires_at_ms, owner FROM "{name}" WHERE key = ?"""
_WRITE_RECORD = """INSERT OR REPLACE INTO "{name}" (key, state, fingerprint, result, expires_at_ms, owner)
VALUES (?, ?, ?, ?, ?, ?)"""
#: Expired records are removed by the writes of their table, a few at a time (no background job).
_PURGE_RECORDS = """DELETE FROM "{name}" WHERE key IN (SELECT key FROM "{name}"
WHERE expires_at_ms > 0 AND expires_at_ms < ? LIMIT 16)"""


def sql_table_name(table: str) -> str:
    """The SQL table behind lock table ``table``; rejects names outside the library's alphabet (the
    engine's own rule, so a name is valid on every store or on none)."""
    return _PREFIX + check_table(table)


def _describe(error: sqlite3.Error) -> str:
    return f"{type(error).__name__}: {error}"


#: SQLite primary result codes (the low byte of ``sqlite_errorcode``, Python 3.11+) by kind, and the
#: fixed messages SQLite gives them, for older Pythons. The message is matched from its start only:
#: a table or file name in it can then never change the kind.
_KINDS_BY_CODE = {5: "busy", 6: "busy", 10: "io", 8: "refused", 13: "refused", 14: "refused", 1: "refused",
                  11: "refused", 26: "refused"}
_KINDS_BY_MESSAGE = (
    ("database is locked", "busy"),
    ("database table is locked", "busy"),
    ("disk i/o error", "io"),
    ("attempt to write a readonly database", "refused"),
    ("database or disk is full", "refused"),
    ("unable to open database file", "refused"),
    ("no such table", "refused"),
    ("file is not a database", "refused"),
    ("database disk image is malformed", "refused"),
)


def _error_kind(error: sqlite3.DatabaseError) -> Optional[str]:
    code = getattr(error, "sqlite_errorcode", None)
    if isinstance(code, int):
        return _KINDS_BY_CODE.get(code & 0xFF)
    text = str(error).lower()
    return next((kind for prefix, kind in _KINDS_BY_MESSAGE if text.startswith(prefix)), None)


def _switch_to_wal(connection: sqlite3.Connection) -> str:
    """Switch a file to WAL mode; returns the mode it is in afterwards.

    Processes opening the same new file at once each switch it, and SQLite refuses a switch at once
    ("database is locked") while another connection holds the file, instead of waiting as it does for
    other statements. This is the one place a store waits and tries again, once per client, before any
    lease: a refused switch is tried again every 10 ms, within the connection's 5 s busy timeout, until
    the file is in WAL mode (by this switch or another process's). Then the last error is raised.
    """
    deadline = time.monotonic() + 5.0
    while True:
        try:
            return str(connection.execute("PRAGMA journal_mode=WAL").fetchone()[0])
        except sqlite3.OperationalError:
            mode = str(connection.execute("PRAGMA journal_mode").fetchone()[0])
            if mode.lower() == "wal":
                return mode
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


class SQLiteStore:
    """The LockStore adapter for one SQLite file; one statement (or one IMMEDIATE transaction) per step."""

    kind = "sqlite"  # in stores.registry
    blocking = True  # requests may wait for the file's write lock

    def __init__(self, path: "str | os.PathLike[str]") -> None:
        if sqlite3.sqlite_version_info < MIN_SQLITE_VERSION:  # acquire is an upsert (ON CONFLICT ... WHERE)
            raise RuntimeError(
                f"the SQLite store needs SQLite {'.'.join(map(str, MIN_SQLITE_VERSION))} or later; this Python "
                f"links SQLite {sqlite3.sqlite_version}"
            )
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"SQLiteClient takes a file path, got {type(path).__name__}: {path!r:.80}")
        named = os.fspath(path)
        if named in ("", ":memory:", b"", b":memory:") or str(named).startswith("file:"):
            # sqlite3 would open a private in-memory database (or a URI) here: this store opens the
            # path itself, so it would create files literally named ':memory:...' instead.
            raise ValueError(
                f"SQLiteClient needs the path of a database file that every process can open, got {named!r}; "
                "for leases within one process (tests), use MemoryClient() instead"
            )
        self.path = os.path.abspath(os.fspath(path))
        directory = os.path.dirname(self.path)
        if not os.path.isdir(directory):
            raise ValueError(f"SQLite lock file {self.path!r}: directory {directory!r} does not exist")
        if os.path.isdir(self.path):
            raise ValueError(f"SQLite lock file {self.path!r} is a directory")
        self._local = threading.local()  # one connection per thread (the renewal workers have their own)
        self._tables: set[str] = set()  # lock tables known to exist (CREATE ... IF NOT EXISTS is idempotent)
        self._record_tables: set[str] = set()  # idempotency record tables known to exist
        try:
            connection = self._connection()
            # WAL: readers (polling waiters) never block the writer. Persistent in the file.
            mode = connection.execute("PRAGMA journal_mode").fetchone()[0]
            if str(mode).lower() != "wal":
                mode = _switch_to_wal(connection)
            if str(mode).lower() != "wal":
                raise ValueError(f"SQLite lock file {self.path!r} cannot use WAL mode (got {mode!r})")
            connection.execute("PRAGMA user_version").fetchone()  # a corrupt file fails here, not later
        except sqlite3.DatabaseError as error:
            raise ValueError(f"SQLite lock file {self.path!r} is unusable: {_describe(error)}") from error
        if not os.access(self.path, os.W_OK):
            raise ValueError(f"SQLite lock file {self.path!r} is read-only")

    def _connection(self) -> sqlite3.Connection:
        connection: Optional[sqlite3.Connection] = getattr(self._local, "connection", None)
        if connection is None:
            # Autocommit (isolation_level=None): each statement is its own atomic transaction.
            connection = sqlite3.connect(self.path, isolation_level=None)
            connection.execute("PRAGMA synchronous=NORMAL")  # durable across process crashes in WAL mode
            self._local.connection = connection
            self._local.busy_ms = 5000  # sqlite3.connect's default timeout of 5 s
        return connection

    def _prepared(self, table: Optional[str], timeout_s: float) -> sqlite3.Connection:
        """This thread's connection, with the busy timeout of this request and the table created."""
        connection = self._connection()
        busy_ms = max(1, int(timeout_s * 1000))
        if busy_ms != self._local.busy_ms:
            connection.execute(f"PRAGMA busy_timeout={busy_ms}")  # an int, not user input
            self._local.busy_ms = busy_ms
        if table is not None and table not in self._tables:
            connection.execute(_CREATE.format(name=sql_table_name(table)))
            self._tables.add(table)
        return connection

    def _run(self, operation: str, table: Optional[str], key: str, timeout_s: float, action: Any) -> Any:
        """``action(connection, lock table's SQL name)`` with this request's busy timeout; with table
        None no lock table is touched (the name passed is None). Logged at DEBUG as ``operation``."""
        try:
            result = action(self._prepared(table, timeout_s), None if table is None else _PREFIX + table)
        except sqlite3.DatabaseError as error:
            classified = self._classify(error, key)
            _log.debug("%s %r -> %s", operation, key, outcome_for_log(classified))
            raise classified from error
        if _log.isEnabledFor(logging.DEBUG):  # the outcome's name is not worth computing otherwise
            _log.debug("%s %r -> %s", operation, key, outcome_for_log(result))
        return result

    def _classify(self, error: sqlite3.DatabaseError, key: str) -> Exception:
        """Busy or locked: not applied (SQLite rolled the statement back), so try again later. An I/O
        error (or one we cannot name) may have left a commit's outcome unknown: reconcile. The rest
        (read-only, full, cannot open, corrupt, a lock table dropped underneath) waiting cannot fix."""
        kind = _error_kind(error)
        text = f"SQLite request on {key!r} failed: {_describe(error)}"
        if kind == "busy":
            return StoreError(text, key=key, maybe_committed=False)
        if kind == "io" or (kind is None and isinstance(error, sqlite3.OperationalError)):
            return StoreError(text, key=key, maybe_committed=True)
        return StoreRequestRejected(f"{text} (lock file {self.path!r})", key=key)

    def _applied(
        self, operation: str, table: str, key: str, timeout_s: float, statement: str, parameters: tuple[Any, ...]
    ) -> bool:
        """Run one conditional write; True if it changed the row."""
        return bool(self._run(
            operation, table, key, timeout_s,
            lambda connection, name: connection.execute(statement.format(name=name), parameters).rowcount == 1,
        ))

    def _acquired(
        self, operation: str, table: str, key: str, timeout_s: float, statement: str, parameters: tuple[Any, ...]
    ) -> Optional[int]:
        """Run an acquisition write and read the fencing token it set, in one IMMEDIATE transaction:
        None if not applied, else the token."""

        def write(connection: sqlite3.Connection, name: str) -> Optional[int]:
            if connection.execute(statement.format(name=name), parameters).rowcount != 1:
                return None
            fence: int = connection.execute(_FENCE.format(name=name), (key,)).fetchone()[0]
            return fence

        result: Optional[int] = self._run(operation, table, key, timeout_s,
                                lambda connection, name: _immediately(connection, name, write))
        return result

    def put_if_absent(
        self, table: str, key: str, owner: str, version: str, lease_ms: int, timeout_s: float, usage: UsageMeter
    ) -> Optional[int]:
        """Insert the row, or revive a freed one (its fence counter kept and incremented), only if nobody
        holds the key; in the same IMMEDIATE transaction read the fencing token back. The token, else None."""
        return self._acquired("put_if_absent", table, key, timeout_s, _PUT_IF_ABSENT, (key, owner, version, lease_ms))

    def replace_if(
        self,
        table: str,
        key: str,
        expected_owner: str,
        expected_version: str,
        owner: str,
        version: str,
        lease_ms: int,
        timeout_s: float,
        usage: UsageMeter,
    ) -> Optional[int]:
        """The takeover: overwrite owner, version and lease_ms and increment the fence, only if the row holds
        exactly (expected_owner, expected_version). The new fencing token, else None."""
        parameters = (owner, version, lease_ms, key, expected_owner, expected_version)
        return self._acquired("replace_if", table, key, timeout_s, _REPLACE_IF, parameters)

    def update_version_if(
        self, table: str, key: str, owner: str, version: str, new_version: str, timeout_s: float, usage: UsageMeter,
        lease_ms: int = 0,
    ) -> bool:
        """Renewal: set the version only if the row holds (owner, version); True if it did."""
        parameters = (new_version, key, owner, version)
        return self._applied("update_version_if", table, key, timeout_s, _UPDATE_VERSION_IF, parameters)

    def mark_waiting(
        self, table: str, key: str, owner: str, version: str, timeout_s: float, usage: UsageMeter
    ) -> bool:
        """Set the ``waiting`` hint once per hold, only on exactly (owner, version); True if it did."""
        return self._applied("mark_waiting", table, key, timeout_s, _MARK_WAITING, (key, owner, version))

    def delete_if_owner(
        self, table: str, key: str, owner: str, timeout_s: float, usage: UsageMeter
    ) -> int:
        """Release: free the row (owner NULL; the fence counter stays) only if ``owner`` holds it, reading
        its waiting hint in the same transaction. ``DELETED`` or ``DELETED_WITH_WAITERS``, else
        ``NOT_DELETED``."""
        def free(connection: sqlite3.Connection, name: str) -> int:
            # In one transaction, so the hint returned is the one on the row we free.
            found = connection.execute(_WAITING_OF_OWNED.format(name=name), (key, owner)).fetchone()
            if found is None:
                return NOT_DELETED
            connection.execute(_FREE.format(name=name), (key, owner))
            return DELETED_WITH_WAITERS if found[0] == 1 else DELETED

        result: int = self._run(
            "delete_if_owner", table, key, timeout_s, lambda connection, name: _immediately(connection, name, free)
        )
        return result

    def read(self, table: str, key: str, timeout_s: float, usage: UsageMeter) -> Optional[LockRow]:
        """The held row of ``key`` as stored (values of any type reach ``check_row`` as they are), or None."""
        found = self._run(
            "read", table, key, timeout_s,
            lambda connection, name: connection.execute(_READ.format(name=name), (key,)).fetchone(),
        )
        return None if found is None else _row(found)

    # ---- idempotency records ------------------------------------------------------------------
    max_result_bytes = 100_000_000  # well under SQLite's default 1 GB limit on a value

    def _records_table(self, connection: sqlite3.Connection, table: str) -> str:
        """The SQL table of record table ``table``, created on first use."""
        name = _RECORD_PREFIX + check_table(table)
        if table not in self._record_tables:
            connection.execute(_CREATE_RECORDS.format(name=name))
            self._record_tables.add(table)
        return name

    def check_in(self, connection: sqlite3.Connection, table: str, key: str, owner: str) -> bool:
        """Inside the caller's open transaction on this file: True if ``owner`` holds ``key``, and from
        then on that transaction holds SQLite's one write lock until it ends, so no takeover (itself a
        write) can commit before it. False if the row is not ``owner``'s. The caller checks that the
        connection is on this file and in a transaction."""
        try:
            matched = connection.execute(_CHECK_IN.format(name=sql_table_name(table)), (key, owner)).rowcount == 1
        except sqlite3.OperationalError as error:
            raise StoreError(f"check_in on {key!r} failed: {_describe(error)}", key=key) from error
        _log.debug("check_in %r -> %s", key, outcome_for_log(matched))
        return matched

    def read_record(self, table: str, key: str, timeout_s: float) -> Optional[Record]:
        """The record of ``key`` in record table ``table`` (SQL table ``fastlease_record_<table>``, made on
        first use), expired or not, or None."""
        def read(connection: sqlite3.Connection, _: None) -> Any:
            return connection.execute(_READ_RECORD.format(name=self._records_table(connection, table)),
                                      (key,)).fetchone()

        found = self._run("read_record", None, key, timeout_s, read)
        return None if found is None else Record(found[0], found[1], bytes(found[2]), found[3], found[4])

    def finish_if_owner(
        self, lock_table: str, key: str, table: str, record: Record, now_ms: int, timeout_s: float
    ) -> bool:
        """In one IMMEDIATE transaction, only while ``record.owner`` holds the lease on ``key`` in
        ``lock_table``: delete the lease row (its fencing counter with it), store ``record`` (replacing
        any) and purge a few expired records of ``table``. False (nothing written) if that owner does not hold it."""
        records = self._run("open_records", None, key, timeout_s,
                            lambda connection, _: self._records_table(connection, table))

        def finish(connection: sqlite3.Connection, locks: str) -> bool:
            if connection.execute(_DELETE_OWNED.format(name=locks), (key, record.owner)).rowcount != 1:
                return False  # nothing written: the transaction ends without a change
            connection.execute(_WRITE_RECORD.format(name=records), (key, *record))
            connection.execute(_PURGE_RECORDS.format(name=records), (now_ms,))
            return True

        result: bool = self._run("finish_if_owner", lock_table, key, timeout_s,
                                 lambda connection, locks: _immediately(connection, locks, finish))
        return result

    def inspect(self, table: str, key: Optional[str]) -> list[dict[str, Any]]:
        """Held rows of ``table`` (or ``key``'s), fence included. Never creates the table."""
        name = sql_table_name(table)
        connection = self._connection()
        try:
            exists = connection.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
            ).fetchone()
            found = connection.execute(_INSPECT.format(name=name), (key, key)).fetchall() if exists else []
        except sqlite3.DatabaseError as error:
            raise self._classify(error, key or table) from error
        columns = ("key", "owner", "version", "lease_ms", "protocol", "waiting", "fence")
        return [{**dict(zip(columns, row)), "waiting": row[5] == 1} for row in found]

    # ---- the renewal process (fastlease._renewal_link) -------------------------------------------------
    def renewal_config(self) -> Any:
        """What another process needs to renew on this file: the path."""
        return (self.kind, self.path)

    @classmethod
    def from_renewal_config(cls, config: Any, credentials: Any = None) -> SQLiteStore:
        """The store on the file that ``renewal_config()`` named (in the renewal process)."""
        return cls(config[1])

    def close(self) -> None:
        """Close this thread's connection (others close when their threads end)."""
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
            self._local.connection = None


def _immediately(connection: sqlite3.Connection, name: str, body: Any) -> Any:
    """``body(connection, name)`` inside one ``BEGIN IMMEDIATE`` transaction (the file's write lock
    from the start), committed, or rolled back if it raises."""
    connection.execute("BEGIN IMMEDIATE")
    try:
        result = body(connection, name)
        connection.execute("COMMIT")
    except BaseException:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise
    return result


def _row(found: tuple[Any, ...]) -> LockRow:
    """A stored row as the engine checks it: SQLite keeps any value in any column, so a row written by
    hand with wrong types reaches ``check_row`` as is and fails closed there."""
    owner, version, lease_ms, protocol, waiting, fence = found
    # Any other stored value is passed on as it is, for check_row to refuse.
    flag: Any = {0: False, 1: True}.get(waiting, waiting) if type(waiting) is int else waiting
    return LockRow(owner, version, lease_ms, protocol, flag, fence)


