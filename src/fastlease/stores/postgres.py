"""PostgreSQL store (psycopg 3): the same protocol rows as every store, one statement per step.

One SQL table per lock table name, named exactly as the lock table (quoted, so case and ``.``/``-``
are kept), created only by ``PostgresClient.create_lock_table``: like DynamoDB, and unlike the embedded
SQLite store, lock operations never create tables (a server's schema is a deployment's business).

Every step is one parameterised statement in autocommit mode, so each is atomic on its own: the
acquisition is an upsert that revives a freed row and returns the fencing token it set; the release
frees the row (``owner`` NULL, the ``fence`` counter kept) and returns the ``waiting`` hint it had. No
wall clock is stored or compared: stale rows are recovered by the engine's observation of an unchanged
(owner, version, lease_ms), as on every store.

Row locks, and why the takeover takes the strongest one: ``check_in`` locks the lease row ``FOR KEY
SHARE`` in the caller's transaction. That mode conflicts only with ``FOR UPDATE``, which the takeover
(``_REPLACE_IF``) and the release (``_FREE``) take before they write, so neither a takeover nor a
release (after which anyone may acquire) commits while a checked-in transaction is open. Renewals are a
plain ``UPDATE`` (``FOR NO KEY UPDATE``), which ``FOR KEY SHARE`` lets through, so a long transaction
does not stop the holder's renewals.

Requests run on the store's own connections (never the caller's: a lock step must not join or end
the caller's transaction), taken from a small list of idle ones, one per concurrent request. Each
request is bounded twice: ``statement_timeout`` (and ``lock_timeout``) on the server, at 80% of the
request's timeout so that a waiting statement is cancelled cleanly (not committed, the connection
kept), and a deadline on the client's wait for the answer, which a stopped server or a dead network
cannot stretch. A request past its deadline may have committed: the engine reconciles it. An idle
connection that the server has ended (``pg_terminate_backend``, a restart) is replaced before a
request is sent on it. Each statement is prepared once per connection and then executed by name,
unless the store is told the connections go through a transaction-pooling PgBouncer
(``transaction_pooling``), where session state would leak to others.

Table names follow the library's rule (3-255 of ``A-Z a-z 0-9 _ . -``) and PostgreSQL's 63-byte limit
on identifiers; SQL cannot take identifiers as parameters, so a name is validated, then double-quoted,
which that alphabet cannot break out of. Every value is a bound parameter.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import select
import socket
import threading
import time
import weakref
from typing import Any, Optional, Sequence

from ..exceptions import StoreError, StoreRequestRejected
from .base import LockRow, Record, UsageMeter, check_table, outcome_for_log
from .postgres_feed import PostgresReleaseFeed, release_channel

_log = logging.getLogger("fastlease.stores.postgres")

__all__ = ["PostgresStore", "sql_identifier", "LOCK_TABLE_SCHEMA", "RECORD_TABLE_SCHEMA"]

#: PostgreSQL truncates longer identifiers (NAMEDATALEN - 1): two long names would silently be one table.
MAX_IDENTIFIER_BYTES = 63

#: One lock table. ``owner`` NULL means free: the row stays only to keep its ``fence`` counter.
LOCK_TABLE_SCHEMA = """CREATE TABLE IF NOT EXISTS {name} (
    key      text PRIMARY KEY,
    owner    text,
    version  text,
    lease_ms bigint,
    protocol integer,
    waiting  boolean NOT NULL DEFAULT false,
    fence    bigint NOT NULL DEFAULT 0
)"""
#: The columns (name, type) a lock table must have: a rerun of create_lock_table checks them.
LOCK_COLUMNS = (("key", "text"), ("owner", "text"), ("version", "text"), ("lease_ms", "bigint"),
                ("protocol", "integer"), ("waiting", "boolean"), ("fence", "bigint"))

#: One idempotency record table: a row per key, written only under the key's lease.
RECORD_TABLE_SCHEMA = """CREATE TABLE IF NOT EXISTS {name} (
    key           text PRIMARY KEY,
    state         text NOT NULL,
    fingerprint   text NOT NULL,
    result        bytea NOT NULL,
    expires_at_ms bigint NOT NULL,
    owner         text NOT NULL
)"""
RECORD_COLUMNS = (("key", "text"), ("state", "text"), ("fingerprint", "text"), ("result", "bytea"),
                  ("expires_at_ms", "bigint"), ("owner", "text"))
#: The purge of expired records reads this index, not the whole table. Its name is derived from the
#: table's (a digest, so that it fits 63 bytes whatever the table's name).
RECORD_EXPIRY_INDEX = """CREATE INDEX IF NOT EXISTS {index} ON {name} (expires_at_ms) WHERE expires_at_ms > 0"""

#: Acquire: insert the row, or revive a freed one (its fence incremented); never touch a held row.
#: RETURNING gives the new fencing token, so the acquisition is one round trip.
_PUT_IF_ABSENT = """INSERT INTO {name} AS held (key, owner, version, lease_ms, protocol, waiting, fence)
VALUES ($1, $2, $3, $4, 1, false, 1)
ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, version = excluded.version,
    lease_ms = excluded.lease_ms, protocol = 1, waiting = false, fence = held.fence + 1
WHERE held.owner IS NULL
RETURNING fence"""
#: Takeover: only on exactly the observed (owner, version). It locks the row FOR UPDATE first: the one
#: mode that waits for a check_in's FOR KEY SHARE, so no takeover commits inside a checked-in transaction.
_REPLACE_IF = """WITH observed AS (
    SELECT key FROM {name} WHERE key = $4 AND owner = $5 AND version = $6 FOR UPDATE
)
UPDATE {name} SET owner = $1, version = $2, lease_ms = $3, protocol = 1, waiting = false, fence = fence + 1
WHERE key = $4 AND owner = $5 AND version = $6 AND EXISTS (SELECT 1 FROM observed)
RETURNING fence"""
#: Renew: only the version; lease_ms is the owner's and is never rewritten.
_UPDATE_VERSION_IF = """UPDATE {name} SET version = $1 WHERE key = $2 AND owner = $3 AND version = $4"""
#: A contender's turn-taking hint, once per hold.
_MARK_WAITING = """UPDATE {name} SET waiting = true
WHERE key = $1 AND owner = $2 AND version = $3 AND NOT waiting"""
#: Release: free the row (the fence stays), returning the hint it had, and notify the table's release
#: channel with the key (delivered at commit, to the waiters of every client that listens: see
#: postgres_feed). The CTE reads the old hint under a FOR UPDATE lock, as a takeover does: a release
#: waits for a checked-in transaction to end, so that nobody acquires the freed row while that
#: transaction can still commit.
_FREE = """WITH held AS (
    SELECT waiting FROM {name} WHERE key = $1 AND owner = $2 FOR UPDATE
), freed AS (
    UPDATE {name} SET owner = NULL, version = NULL, waiting = false
    WHERE key = $1 AND owner = $2 AND EXISTS (SELECT 1 FROM held)
    RETURNING (SELECT waiting FROM held) AS waiting
)
SELECT waiting, pg_notify($3, $1) FROM freed"""
_READ = """SELECT owner, version, lease_ms, protocol, waiting, fence FROM {name}
WHERE key = $1 AND owner IS NOT NULL"""
_INSPECT = """SELECT key, owner, version, lease_ms, protocol, waiting, fence FROM {name}
WHERE owner IS NOT NULL AND ($1::text IS NULL OR key = $1::text) ORDER BY key"""
#: check_in, on the caller's connection: lock our row in the caller's transaction (see the module's
#: docstring) and report whether it is still ours. Ownership is the owner id: it is new for every
#: acquisition and a takeover replaces it, while the version changes with our own renewals.
CHECK_IN = """SELECT 1 FROM {name} WHERE key = %s AND owner = %s FOR KEY SHARE"""
#: What makes the caller's connection "the same database" as the store's: the server instance (its
#: start time), the database, and the lock table the name resolves to there (so the search_path too).
IDENTITY = """SELECT pg_postmaster_start_time()::text, current_database(), to_regclass(%s)::oid::bigint"""
_IDENTITY = IDENTITY.replace("%s", "$1")

#: An idempotent call's completion, in one statement (so one atomic transaction): delete the lease row
#: (its fence counter with it: idempotency keys are mostly used once and nothing reads their tokens),
#: only while our owner holds it, then store the record (replacing any) and purge a few expired ones.
_FINISH = """WITH released AS (
    DELETE FROM {locks} WHERE key = $1 AND owner = $2 RETURNING key
), stored AS (
    INSERT INTO {records} (key, state, fingerprint, result, expires_at_ms, owner)
    SELECT $1, $3, $4, $5, $6, $2 FROM released
    ON CONFLICT (key) DO UPDATE SET state = excluded.state, fingerprint = excluded.fingerprint,
        result = excluded.result, expires_at_ms = excluded.expires_at_ms, owner = excluded.owner
    RETURNING 1
), purged AS (
    DELETE FROM {records} WHERE key IN (
        SELECT key FROM {records} WHERE expires_at_ms > 0 AND expires_at_ms < $7 AND key <> $1
        AND EXISTS (SELECT 1 FROM released) LIMIT 16 FOR UPDATE SKIP LOCKED)
)
SELECT count(*) FROM stored"""
_READ_RECORD = """SELECT state, fingerprint, result, expires_at_ms, owner FROM {name} WHERE key = $1"""
_COLUMNS = """SELECT attname::text, format_type(atttypid, atttypmod) FROM pg_attribute
WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped ORDER BY attnum"""

#: The connection's server-side bounds, set to the request's timeout (in ms) when it changes.
_SET_TIMEOUTS = b"SELECT set_config('statement_timeout', $1, false), set_config('lock_timeout', $1, false)"
#: Statements prepared per connection at most (there are a handful per table).
_MAX_PREPARED = 256

_BYTEA_OID = 17
_TEXT, _BINARY = 0, 1
#: Parameter formats: every parameter as text but the record's result (bytea, sent as raw bytes).
_FINISH_FORMATS = [_TEXT, _TEXT, _TEXT, _TEXT, _BINARY, _TEXT, _TEXT]
_FINISH_TYPES = [0, 0, 0, 0, _BYTEA_OID, 0, 0]

#: SQLSTATE classes and codes by what waiting can do about them. A statement that failed with an error
#: was rolled back (autocommit: each statement is its own transaction), so only a lost connection
#: leaves a write's outcome unknown.
# Timeouts, lock waits, conflicts, and a prepared statement the server no longer has (prepared again next).
_TRANSIENT_CODES = {"57014", "55P03", "40001", "40P01", "55006", "57P03", "26000"}
_TRANSIENT_CLASSES = ("53", "58", "XX", "40")  # out of resources, system and internal errors, rollbacks
_CONNECTION_CLASSES = ("08", "57P")  # the connection broke (or the server is going down) mid-request
_HINTS = {
    "42P01": "the table does not exist: create it with client.create_lock_table(...) (or "
             "create_idempotency_table for records), or check the connection's search_path",
    "42501": "the role lacks a privilege on the table: see 'Roles and grants' in docs/operations.md",
    "25006": "the server is read-only (a standby?): point the DSN at the primary "
             "(target_session_attrs=read-write)",
    "42703": "the table's columns are not fastlease's: see the schema in docs/protocol.md",
}


#: What a concurrent ``CREATE ... IF NOT EXISTS`` of the same name that won the race leaves the others:
#: a duplicate catalog row (23505), relation (42P07) or row type (42710, "type ... already exists").
_CREATION_RACE_CODES = ("23505", "42P07", "42710")

_QUOTED = re.compile(r'"[A-Za-z0-9_.-]+"')  # the quoted table names in a statement, for messages


def sql_identifier(table: str) -> str:
    """``table`` as a quoted SQL identifier; rejects names outside the library's alphabet (so a name
    is valid on every store or on none) and names longer than PostgreSQL keeps (63 bytes)."""
    check_table(table)
    if len(table) > MAX_IDENTIFIER_BYTES:
        raise ValueError(
            f"PostgreSQL table names are at most {MAX_IDENTIFIER_BYTES} characters (longer ones are truncated, "
            f"so two names could be one table); got {len(table)}: {table!r:.80}"
        )
    return f'"{table}"'


def expiry_index_name(table: str) -> str:
    return '"fastlease_expiry_' + hashlib.sha1(table.encode()).hexdigest()[:20] + '"'


def _check_text(key: str) -> bytes:
    """The key as the UTF-8 bytes the server stores. PostgreSQL text cannot hold NUL: refused before
    any request, rather than stored as something else."""
    if "\x00" in key:
        raise ValueError(f"the PostgreSQL store cannot store a NUL character (\\x00) in a key; got {key!r:.80}")
    return key.encode()


class _Failure(Exception):
    """A request's failure inside ``_Session``: SQLSTATE (None: no answer) and whether the connection
    must be dropped. Classified into StoreError/StoreRequestRejected by the store."""

    def __init__(self, message: str, sqlstate: Optional[str], broken: bool, sent: bool) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate
        self.broken = broken
        self.sent = sent


#: The server's statement and lock timeouts, as a share of the request's timeout. A statement that waits
#: (for a row lock, say) must be cancelled by the server, which answers "not done" on a connection that
#: stays usable, before the client's own deadline gives up on an answer, drops the connection and must
#: count the write as maybe committed. The rest of the timeout covers the round trip and scheduling.
SERVER_TIMEOUT_SHARE = 0.8


class _Session:
    """One of the store's own connections: autocommit, driven through libpq (``psycopg.pq``) so that
    the wait for each answer has a deadline of ours."""

    def __init__(self, connection: Any, session_state: bool) -> None:
        self.connection = connection
        self.pgconn = connection.pgconn
        # The request timeout whose server-side bounds are set; -1: not set yet; None: never set (no session
        # state).
        self.timeout_ms: Optional[int] = -1 if session_state else None
        #: The statements prepared on this connection, and their names; None: unnamed statements only.
        self.prepared: Optional[dict[bytes, bytes]] = {} if session_state else None

    def run(self, statement: bytes, parameters: Sequence[Optional[bytes]], timeout_s: float,
            types: Optional[list[int]] = None, formats: Optional[list[int]] = None, prepare: bool = True) -> Any:
        """Send one statement, wait for its one result until the deadline, and return it (a PGresult).

        A statement is prepared on the connection the first time it runs there (one more round trip,
        once), then executed by name: the server parses and plans it once per connection, not per
        request. The connection's statement_timeout and lock_timeout follow the request's timeout,
        with a round trip only when that changes."""
        from psycopg import pq

        deadline = time.monotonic() + timeout_s
        timeout_ms = max(1, int(timeout_s * 1000))
        pgconn = self.pgconn
        if self.timeout_ms is not None and timeout_ms != self.timeout_ms:
            server_ms = max(1, int(timeout_ms * SERVER_TIMEOUT_SHARE))
            self._exchange(deadline, pq, pgconn.send_query_params, _SET_TIMEOUTS, [b"%d" % server_ms])
            self.timeout_ms = timeout_ms
        prepared = self.prepared
        if prepared is None or not prepare:
            return self._exchange(deadline, pq, pgconn.send_query_params, statement, parameters, types, formats)
        name = prepared.get(statement)
        if name is None:
            if len(prepared) >= _MAX_PREPARED:
                return self._exchange(deadline, pq, pgconn.send_query_params, statement, parameters, types, formats)
            name = b"fastlease_%d" % len(prepared)
            self._exchange(deadline, pq, pgconn.send_prepare, name, statement, types)
            prepared[statement] = name
        try:
            return self._exchange(deadline, pq, pgconn.send_query_prepared, name, parameters, formats)
        except _Failure as failure:
            if failure.sqlstate == "26000":  # the server lost our prepared statements (DISCARD ALL, a pooler)
                prepared.clear()
            raise

    def _exchange(self, deadline: float, pq: Any, send: Any, *arguments: Any) -> Any:
        """``send(*arguments)`` (one of libpq's asynchronous sends), then wait for its one result."""
        pgconn = self.pgconn
        try:
            send(*arguments)
        except Exception as error:  # noqa: BLE001 - psycopg raises its OperationalError: nothing was sent
            raise _Failure(f"could not send the request: {_message(pgconn.error_message) or error}", None,
                           True, False) from error
        try:
            while pgconn.flush():
                self._wait(select.POLLOUT, deadline)
            while True:
                pgconn.consume_input()
                if not pgconn.is_busy():
                    break
                self._wait(select.POLLIN, deadline)
        except _Failure:
            raise
        except Exception as error:  # noqa: BLE001 - the connection broke while the request was out
            raise _Failure(f"the connection broke: {_message(pgconn.error_message) or error}", None, True,
                           True) from error
        result = pgconn.get_result()
        while pgconn.get_result() is not None:  # drain: the connection is idle again after the last one
            pass
        if result is None:
            raise _Failure(f"no answer: {_message(pgconn.error_message)}", None, True, True)
        if result.status == pq.ExecStatus.FATAL_ERROR:
            sqlstate = _message(result.error_field(pq.DiagnosticField.SQLSTATE))
            message = _message(result.error_field(pq.DiagnosticField.MESSAGE_PRIMARY)) or _message(result.error_message)
            broken = pgconn.status != pq.ConnStatus.OK or (sqlstate or "").startswith(_CONNECTION_CLASSES)
            raise _Failure(message, sqlstate, broken, True)
        return result

    def _wait(self, events: int, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _Failure("no answer within the request's timeout", None, True, True)
        poller = select.poll()
        poller.register(self.pgconn.socket, events)
        poller.poll(remaining * 1000)  # returns on readiness, an error or the deadline: all rechecked

    def ended_by_server(self) -> bool:
        """True if the server has ended this idle connection (``pg_terminate_backend``, a restart, an idle
        timeout). An idle autocommit connection of ours is sent nothing unasked, so anything to read is
        the server's last word (an error, then the end of the stream): the request goes on a new
        connection instead of failing on this one as maybe committed."""
        from psycopg import pq

        try:
            if self.pgconn.status != pq.ConnStatus.OK:
                return True
            poller = select.poll()
            poller.register(self.pgconn.socket, select.POLLIN)
            return bool(poller.poll(0))
        except Exception:  # noqa: BLE001 - psycopg raises its OperationalError when the socket is gone
            return True

    def close(self) -> None:
        try:
            self.connection.close()
        except Exception:  # noqa: BLE001 - a broken connection's close has nothing left to do
            pass


#: Every connection the stores of this process opened: a forked child must never use them, nor close
#: them (libpq's close sends a Terminate message, on a socket the parent still uses).
_ALL_SESSIONS: "weakref.WeakSet[_Session]" = weakref.WeakSet()


def _disown_in_child() -> None:
    """In a forked child: point every inherited connection's socket at a fresh unconnected socket, so
    that nothing this child does (a request, the close when the object is collected) reaches the
    parent's connection. The stores then open connections of their own."""
    for session in list(_ALL_SESSIONS):
        try:
            fd = session.pgconn.socket
            with socket.socket() as placeholder:
                os.dup2(placeholder.fileno(), fd)
        except Exception:  # noqa: BLE001 - a connection already closed has no socket to replace
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_disown_in_child)


def _text(value: Optional[bytes]) -> str:
    """A text value as stored (owner ids and keys are compared exactly: nothing is stripped)."""
    return "" if value is None else value.decode("utf-8", "replace")


def _message(value: Optional[bytes]) -> str:
    """A message from libpq or the server, for an error's text."""
    return _text(value).strip()


class PostgresStore:
    """The LockStore adapter for one PostgreSQL database; one statement per step."""

    blocking = True

    #: The largest serialised result a record holds here (bytea's limit is 1 GB; records stay well under).
    max_result_bytes = 100_000_000

    def __init__(self, conninfo: str, password: Optional[str] = None, transaction_pooling: bool = False) -> None:
        """``conninfo``: a libpq connection string or URI (without a password, which is ``password``:
        kept apart so that the connection string can be shown and logged). ``transaction_pooling``: the
        connections go through a transaction-pooling PgBouncer, so keep no session state on them (no
        ``statement_timeout``/``lock_timeout`` settings, which it would hand on to other clients, and
        no prepared statements): unnamed statements, bounded by the client's deadline."""
        import psycopg

        self._psycopg = psycopg
        self.conninfo = conninfo
        self._password = password
        self.transaction_pooling = transaction_pooling
        #: The SQL of each (statement, table) used so far, formatted and encoded once.
        self._statements: dict[tuple[str, str, Optional[str]], bytes] = {}
        self._release_channels: dict[str, bytes] = {}  # the NOTIFY channel of each lock table used
        self._feed: Any = None
        self._idle: list[_Session] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._closed = False
        self._settings = psycopg.conninfo.conninfo_to_dict(conninfo)

    def describe(self) -> str:
        """The server and database, for messages and logs (never the password)."""
        params = self._settings
        host = params.get("host") or params.get("hostaddr") or "localhost"
        return f"{host}:{params.get('port') or 5432}/{params.get('dbname') or params.get('user') or ''}"

    # ---- connections -----------------------------------------------------------------------------
    def _take(self, timeout_s: float) -> _Session:
        if self._pid != os.getpid():  # a forked child: the inherited connections are the parent's
            self._idle, self._pid = [], os.getpid()
        ended = []
        with self._lock:
            while self._idle:
                session = self._idle.pop()
                if not session.ended_by_server():
                    return session
                ended.append(session)
        for session in ended:
            session.close()
        if self._closed:
            raise StoreRequestRejected("the PostgresClient is closed")
        return self.connect(timeout_s)

    def connect(self, timeout_s: float) -> _Session:
        """A new connection of ours (autocommit, named ``fastlease`` unless the DSN names it), or _Failure."""
        psycopg = self._psycopg
        settings: dict[str, Any] = {"autocommit": True, "client_encoding": "UTF8",
                                    "connect_timeout": max(2, int(timeout_s + 0.999))}  # whole seconds, 2 at least
        if self._password is not None:
            settings["password"] = self._password
        if "application_name" not in self._settings:
            settings["application_name"] = "fastlease"  # what pg_stat_activity shows for our connections
        try:
            connection = psycopg.Connection.connect(self.conninfo, **settings)
        except psycopg.Error as error:
            raise _Failure(f"could not connect to {self.describe()}: {_first_line(error)}",
                           getattr(error, "sqlstate", None), True, False) from error
        session = _Session(connection, not self.transaction_pooling)
        _ALL_SESSIONS.add(session)
        return session

    def _give_back(self, session: _Session) -> None:
        if self._closed or self._pid != os.getpid():
            session.close()
            return
        with self._lock:
            self._idle.append(session)

    def _request(self, operation: str, key: str, statement: bytes, parameters: Sequence[Optional[bytes]],
                 timeout_s: float, write: bool, types: Optional[list[int]] = None,
                 formats: Optional[list[int]] = None, prepare: bool = True) -> Any:
        """Run one statement on an idle connection of ours; the PGresult. Logged at DEBUG as ``operation``."""
        session = None
        try:
            session = self._take(timeout_s)
            result = session.run(statement, parameters, timeout_s, types, formats, prepare)
        except _Failure as failure:
            if session is not None and failure.broken:
                session.close()
            elif session is not None:
                self._give_back(session)
            classified = self._classify(failure, key, statement, write)
            _log.debug("%s %r -> %s", operation, key, outcome_for_log(classified))
            raise classified from failure
        self._give_back(session)
        _log.debug("%s %r -> ok", operation, key)  # one line per request, as on every store; no data
        return result

    def _classify(self, failure: _Failure, key: str, statement: bytes, write: bool) -> Exception:
        """A failed statement was rolled back, so waiting may help (timeouts, lock waits, a busy or
        restarting server) or not (a missing table or privilege, a read-only server). A request that
        lost its connection after it was sent may have committed: reconcile."""
        code = failure.sqlstate or ""
        tables = sorted(set(_QUOTED.findall(statement.decode())))
        where = f" in table{'s' if len(tables) > 1 else ''} {', '.join(tables)}" if tables else ""
        text = f"PostgreSQL request on {key!r}{where} failed: {failure}" + (f" (SQLSTATE {code})" if code else "")
        if code in _HINTS:
            return StoreRequestRejected(f"{text}; {_HINTS[code]} (database {self.describe()})", key=key)
        if code.startswith("28") or code == "3D000":  # authentication, a database that does not exist
            return StoreRequestRejected(f"{text} (database {self.describe()})", key=key)
        if not code or code in _TRANSIENT_CODES or code.startswith(_TRANSIENT_CLASSES + _CONNECTION_CLASSES):
            return StoreError(text, key=key, maybe_committed=write and failure.sent and (
                not code or code.startswith(_CONNECTION_CLASSES)))
        return StoreRequestRejected(f"{text} (database {self.describe()})", key=key)

    def _sql(self, template: str, table: str, records: Optional[str] = None) -> bytes:
        """``template`` for ``table`` (and record table ``records``), names validated and quoted once."""
        cache_key = (template, table, records)
        statement = self._statements.get(cache_key)
        if statement is None:
            if len(self._statements) > 4096:  # tables named on the fly: keep the cache bounded
                self._statements.clear()
            text = (template.format(name=sql_identifier(table)) if records is None
                    else template.format(locks=sql_identifier(table), records=sql_identifier(records)))
            statement = self._statements[cache_key] = text.encode()
        return statement

    # ---- the lock protocol -----------------------------------------------------------------------
    def put_if_absent(
        self, table: str, key: str, owner: str, version: str, lease_ms: int, timeout_s: float, usage: UsageMeter
    ) -> int:
        """Insert the row, or revive a freed one (its fence incremented), only if nobody holds the key.
        The new fencing token, else False."""
        statement = self._sql(_PUT_IF_ABSENT, table)
        result = self._request("put_if_absent", key, statement,
                               [_check_text(key), owner.encode(), version.encode(), b"%d" % lease_ms],
                               timeout_s, True)
        return _token(result)

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
    ) -> int:
        """The takeover: overwrite owner, version and lease_ms and increment the fence, only on exactly
        (expected_owner, expected_version). The new fencing token, else False."""
        statement = self._sql(_REPLACE_IF, table)
        parameters = [owner.encode(), version.encode(), b"%d" % lease_ms, _check_text(key),
                      expected_owner.encode(), expected_version.encode()]
        return _token(self._request("replace_if", key, statement, parameters, timeout_s, True))

    def update_version_if(
        self, table: str, key: str, owner: str, version: str, new_version: str, timeout_s: float, usage: UsageMeter
    ) -> bool:
        """Renewal: set the version only if the row holds (owner, version)."""
        statement = self._sql(_UPDATE_VERSION_IF, table)
        parameters = [new_version.encode(), _check_text(key), owner.encode(), version.encode()]
        result = self._request("update_version_if", key, statement, parameters, timeout_s, True)
        return bool(result.command_tuples == 1)

    def mark_waiting(
        self, table: str, key: str, owner: str, version: str, timeout_s: float, usage: UsageMeter
    ) -> bool:
        """Set the ``waiting`` hint once per hold, only on exactly (owner, version)."""
        statement = self._sql(_MARK_WAITING, table)
        result = self._request("mark_waiting", key, statement,
                               [_check_text(key), owner.encode(), version.encode()], timeout_s, True)
        return bool(result.command_tuples == 1)

    def delete_if_owner(
        self, table: str, key: str, owner: str, timeout_s: float, usage: UsageMeter
    ) -> Optional[LockRow]:
        """Release: free the row (the fence counter stays) only if ``owner`` holds it. The row as it
        was (only its ``waiting`` hint is read back; the other fields are blank), else None."""
        statement = self._sql(_FREE, table)
        channel = self._release_channels.get(table)
        if channel is None:
            channel = self._release_channels[table] = release_channel(table).encode()
        result = self._request("delete_if_owner", key, statement, [_check_text(key), owner.encode(), channel],
                               timeout_s, True)
        if result.ntuples == 0:
            return None
        return LockRow(owner, "", 0, 1, result.get_value(0, 0) == b"t")

    def read(self, table: str, key: str, timeout_s: float, usage: UsageMeter) -> Optional[LockRow]:
        """The held row of ``key``, or None."""
        statement = self._sql(_READ, table)
        result = self._request("read", key, statement, [_check_text(key)], timeout_s, False)
        return None if result.ntuples == 0 else _row(result, 0, 0)

    # ---- idempotency records ---------------------------------------------------------------------
    def read_record(self, table: str, key: str, timeout_s: float) -> Optional[Record]:
        """The record of ``key`` in record table ``table``, expired or not, or None."""
        statement = self._sql(_READ_RECORD, table)
        result = self._request("read_record", key, statement, [_check_text(key)], timeout_s, False)
        if result.ntuples == 0:
            return None
        state, fingerprint, data, expires, owner = (result.get_value(0, column) for column in range(5))
        return Record(_text(state), _text(fingerprint), _bytea(data), int(expires), _text(owner))

    def finish_if_owner(
        self, lock_table: str, key: str, table: str, record: Record, now_ms: int, timeout_s: float
    ) -> bool:
        """In one statement (one transaction), only while ``record.owner`` holds ``key`` in
        ``lock_table``: delete the lease row, store ``record`` and purge a few expired records."""
        statement = self._sql(_FINISH, lock_table, table)
        parameters = [_check_text(key), record.owner.encode(), record.state.encode(), record.fingerprint.encode(),
                      bytes(record.result), b"%d" % record.expires_at_ms, b"%d" % now_ms]
        result = self._request("finish_if_owner", key, statement, parameters, timeout_s, True,
                               _FINISH_TYPES, _FINISH_FORMATS)
        return bool(result.get_value(0, 0) == b"1")

    # ---- tables, inspection and check_in -----------------------------------------------------------
    def create_table(self, table: str, records: bool, timeout_s: float = 10.0) -> None:
        """Create a lock (or record) table; an existing one with the same columns is fine, another is
        refused. Concurrent creations of one table are fine too (PostgreSQL may reject all but one)."""
        name = sql_identifier(table)
        schema, columns = (RECORD_TABLE_SCHEMA, RECORD_COLUMNS) if records else (LOCK_TABLE_SCHEMA, LOCK_COLUMNS)
        self._create(table, schema.format(name=name), timeout_s)
        found = self.columns(table, timeout_s)
        if found != columns:  # checked before the index, which another table's columns would fail obscurely
            kind = "idempotency record" if records else "lock"
            raise StoreRequestRejected(
                f"PostgreSQL table {table!r} exists with other columns than a fastlease {kind} table: "
                f"found {list(found)}, expected {list(columns)}; use another name, or drop it"
            )
        if records:
            self._create(table, RECORD_EXPIRY_INDEX.format(index=expiry_index_name(table), name=name), timeout_s)

    def _create(self, table: str, statement: str, timeout_s: float) -> None:
        try:
            self._request("create_table", table, statement.encode(), [], timeout_s, True, prepare=False)
        except StoreRequestRejected as error:
            if not any(f"SQLSTATE {code}" in str(error) for code in _CREATION_RACE_CODES):
                raise

    def columns(self, table: str, timeout_s: float = 10.0) -> tuple[tuple[str, str], ...]:
        """The (name, type) columns of ``table`` as the store's connection resolves it; () if there is none."""
        result = self._request("columns", table, _COLUMNS.encode(), [sql_identifier(table).encode()],
                               timeout_s, False)
        return tuple((_text(result.get_value(row, 0)), _text(result.get_value(row, 1)))
                     for row in range(result.ntuples))

    def identity(self, table: str, timeout_s: float = 5.0) -> tuple[str, str, Optional[int]]:
        """(server start time, database, the table's oid) as this store's connections see them."""
        result = self._request("identity", table, _IDENTITY.encode(), [sql_identifier(table).encode()],
                               timeout_s, False)
        oid = result.get_value(0, 2)
        return _text(result.get_value(0, 0)), _text(result.get_value(0, 1)), None if oid is None else int(oid)

    def inspect(self, table: str, key: Optional[str]) -> list[dict[str, Any]]:
        """Held rows of ``table`` (or ``key``'s), fence included. A table that does not exist raises
        StoreRequestRejected, with the lock path's hint (how to create it)."""
        name = sql_identifier(table)
        result = self._request("inspect", key or table, _INSPECT.format(name=name).encode(),
                               [None if key is None else _check_text(key)], 10.0, False)
        rows = []
        for index in range(result.ntuples):
            row = _row(result, index, 1)
            rows.append({"key": _text(result.get_value(index, 0)), **row._asdict()})
        return rows

    @property
    def release_feed(self) -> Any:
        """The store's ReleaseFeed (``postgres_feed.PostgresReleaseFeed``), made on first use."""
        if self._feed is None:
            self._feed = PostgresReleaseFeed(self)
        return self._feed

    # ---- the renewal process (fastlease._renewal_link) -----------------------------------------------
    def renewal_config(self) -> Any:
        """What another process needs to renew here: the connection string (the password goes apart,
        through ``renewal_credentials``, never on a command line)."""
        return ("postgres", self.conninfo, self.transaction_pooling)

    def renewal_credentials(self) -> Any:
        return self._password

    @classmethod
    def from_renewal_config(cls, config: Any, credentials: Any = None) -> PostgresStore:
        return cls(config[1], credentials, config[2])

    def close(self) -> None:
        """Close the idle connections and stop the release feed; a connection in use closes when its
        request ends."""
        self._closed = True
        if self._feed is not None:
            self._feed.close()
        with self._lock:
            idle, self._idle = self._idle, []
        if self._pid == os.getpid():
            for session in idle:
                session.close()


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _token(result: Any) -> int:
    """The fencing token an acquisition's RETURNING gave, else False (the write matched no row)."""
    if result.ntuples == 0:
        return False
    return int(result.get_value(0, 0))


def _bytea(value: Optional[bytes]) -> bytes:
    """A bytea column in text format: ``\\x`` and hex digits."""
    if value is None:
        return b""
    return bytes.fromhex(value[2:].decode()) if value.startswith(b"\\x") else value


def _row(result: Any, index: int, first: int) -> LockRow:
    """The row's columns from ``first`` on, as the engine checks them. The columns are typed, so a
    value can only be NULL where the protocol needs one: that reaches ``check_row`` as None and fails
    closed there."""
    owner, version, lease_ms, protocol, waiting, fence = (result.get_value(index, first + c) for c in range(6))
    return LockRow(
        _text(owner) if owner is not None else None,  # type: ignore[arg-type]
        _text(version) if version is not None else None,  # type: ignore[arg-type]
        int(lease_ms) if lease_ms is not None else None,  # type: ignore[arg-type]
        int(protocol) if protocol is not None else None,  # type: ignore[arg-type]
        waiting == b"t",
        int(fence),
    )
