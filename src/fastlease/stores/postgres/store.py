"""PostgreSQL store (psycopg 3): the same protocol rows as every store, one statement per step.

Every step is one parameterised statement in autocommit mode, so each is atomic on its own: the
acquisition is an upsert that revives a freed row and returns the fencing token it set; the release
frees the row (``owner`` NULL, the ``fence`` counter kept) and returns the ``waiting`` hint it had. No
wall clock is stored or compared: stale rows are recovered by the engine's observation of an unchanged
(owner, version, lease_ms), as on every store.

The tables and statements are in ``sql``; the connections in ``session``; the release wake-up in
``feed``.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Optional, Sequence

from ...exceptions import MalformedLockRow, StoreError, StoreRequestRejected
from ..base import (
    DELETED,
    DELETED_WITH_WAITERS,
    HANDED_OVER,
    LINE_ALIVE_MS,
    NOT_DELETED,
    LockRow,
    Offer,
    Record,
    UsageMeter,
    outcome_for_log,
)
from .feed import PostgresReleaseFeed, release_channel
from .session import ALL_SESSIONS, Failure, Session, as_text
from .sql import (
    COLUMNS,
    CONNECTION_CLASSES,
    CREATION_RACE_CODES,
    FINISH,
    FINISH_FORMATS,
    FINISH_TYPES,
    FREE,
    FREE_IN_LINE,
    FREE_IN_LINE_WITHOUT_OFFERS,
    HINTS,
    IDENTITY_BY_POSITION,
    INSPECT,
    LEAVE_LINE,
    LINE_OFFER_COLUMNS,
    LINE_TABLE_COMMENT,
    LINE_TABLE_SCHEMA,
    LOCK_COLUMNS,
    LOCK_TABLE_SCHEMA,
    MARK_WAITING,
    OFFER_COLUMNS,
    PUT_IF_ABSENT,
    PUT_IN_TURN,
    PUT_IN_TURN_PASSING,
    QUOTED_NAME,
    READ,
    READ_ALL,
    READ_ALL_IN_LINE,
    READ_IN_LINE,
    READ_IN_LINE_WITHOUT_OFFERS,
    READ_RECORD,
    RECORD_COLUMNS,
    RECORD_EXPIRY_INDEX,
    RECORD_TABLE_SCHEMA,
    REPLACE_IF,
    TRANSIENT_CLASSES,
    TRANSIENT_CODES,
    UPDATE_VERSION_IF,
    expiry_index_name,
    key_array,
    key_bytes,
    line_table,
    sql_identifier,
)

_log = logging.getLogger("fastlease.stores.postgres")

__all__ = ["PostgresStore", "sql_identifier", "LOCK_TABLE_SCHEMA", "RECORD_TABLE_SCHEMA"]

class PostgresStore:
    """The LockStore adapter for one PostgreSQL database; one statement per step."""

    kind = "postgres"  # in stores.registry
    blocking = True
    #: One statement may name a slot's row and its semaphore's line (stores/base.py's WaiterLine).
    shared_lines = True
    #: A release hands a lock's lease over to the head of its line, where that waiter left an offer
    #: (stores/base.py's WaiterLine; FREE_IN_LINE), on a line table that has the offer's columns.
    hands_over = True

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
        self._release_channels: dict[str, bytes] = {}  # the NOTIFY channel of each lock table's releases
        # Lock tables without a line of waiters this client can use (made before there was one, or whose
        # line our role may not write): their waiters are all woken by a release, as before the line.
        self._lineless: set[str] = set()
        # Lock tables whose line was made by an earlier version, without the offers' columns: their waiters
        # take turns, but no lease is handed over (create_lock_table adds the columns).
        self._offerless: set[str] = set()
        self._feed: Any = None
        self._idle: list[Session] = []
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
    def _take(self, timeout_s: float) -> Session:
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

    def connect(self, timeout_s: float) -> Session:
        """A new connection of ours (autocommit, named ``fastlease`` unless the DSN names it), or Failure."""
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
            raise Failure(f"could not connect to {self.describe()}: {_first_line(error)}",
                           getattr(error, "sqlstate", None), True, False) from error
        session = Session(connection, not self.transaction_pooling)
        ALL_SESSIONS.add(session)
        return session

    def _give_back(self, session: Session) -> None:
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
        except Failure as failure:
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

    def _classify(self, failure: Failure, key: str, statement: bytes, write: bool) -> Exception:
        """A failed statement was rolled back, so waiting may help (timeouts, lock waits, a busy or
        restarting server) or not (a missing table or privilege, a read-only server). A request that
        lost its connection after it was sent may have committed: reconcile."""
        code = failure.sqlstate or ""
        tables = sorted(set(QUOTED_NAME.findall(statement.decode())))
        where = f" in table{'s' if len(tables) > 1 else ''} {', '.join(tables)}" if tables else ""
        text = f"PostgreSQL request on {key!r}{where} failed: {failure}" + (f" (SQLSTATE {code})" if code else "")
        if code in HINTS:
            return StoreRequestRejected(f"{text}; {HINTS[code]} (database {self.describe()})", key=key)
        if code.startswith("28") or code == "3D000":  # authentication, a database that does not exist
            return StoreRequestRejected(f"{text} (database {self.describe()})", key=key)
        if not code or code in TRANSIENT_CODES or code.startswith(TRANSIENT_CLASSES + CONNECTION_CLASSES):
            return StoreError(text, key=key, maybe_committed=write and failure.sent and (
                not code or code.startswith(CONNECTION_CLASSES)))
        return StoreRequestRejected(f"{text} (database {self.describe()})", key=key)

    def _sql(self, template: str, table: str, records: Optional[str] = None) -> bytes:
        """``template`` for ``table`` (and record table ``records``), names validated and quoted once."""
        cache_key = (template, table, records)
        statement = self._statements.get(cache_key)
        if statement is None:
            if len(self._statements) > 4096:  # tables named on the fly: keep the cache bounded
                self._statements.clear()
            text = (template.format(name=sql_identifier(table), line=line_table(table)) if records is None
                    else template.format(locks=sql_identifier(table), records=sql_identifier(records)))
            statement = self._statements[cache_key] = text.encode()
        return statement

    # ---- the lock protocol -----------------------------------------------------------------------
    def put_if_absent(
        self, table: str, key: str, owner: str, version: str, lease_ms: int, timeout_s: float, usage: UsageMeter
    ) -> Optional[int]:
        """Insert the row, or revive a freed one (its fence incremented), only if nobody holds the key and
        nobody live waits in its line (as a waiter with no place in it). The new fencing token, else None."""
        return self.put_in_turn(table, key, owner, version, lease_ms, "", timeout_s, usage)

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
        """The takeover: overwrite owner, version and lease_ms and increment the fence, only on exactly
        (expected_owner, expected_version). The new fencing token, else None."""
        statement = self._sql(REPLACE_IF, table)
        parameters = [owner.encode(), version.encode(), b"%d" % lease_ms, key_bytes(key),
                      expected_owner.encode(), expected_version.encode()]
        return _token(self._request("replace_if", key, statement, parameters, timeout_s, True))

    def update_version_if(
        self, table: str, key: str, owner: str, version: str, new_version: str, timeout_s: float, usage: UsageMeter,
        lease_ms: int = 0,
    ) -> bool:
        """Renewal: set the version, and ``lease_ms`` (the lease's own, where given: a handed lease was written
        with the handover's shorter one), only if the row holds (owner, version)."""
        statement = self._sql(UPDATE_VERSION_IF, table)
        parameters = [new_version.encode(), key_bytes(key), owner.encode(), version.encode(), b"%d" % lease_ms]
        result = self._request("update_version_if", key, statement, parameters, timeout_s, True)
        return bool(result.command_tuples == 1)

    def mark_waiting(
        self, table: str, key: str, owner: str, version: str, timeout_s: float, usage: UsageMeter
    ) -> bool:
        """Set the ``waiting`` hint once per hold, only on exactly (owner, version)."""
        statement = self._sql(MARK_WAITING, table)
        result = self._request("mark_waiting", key, statement,
                               [key_bytes(key), owner.encode(), version.encode()], timeout_s, True)
        return bool(result.command_tuples == 1)

    def delete_if_owner(
        self, table: str, key: str, owner: str, timeout_s: float, usage: UsageMeter
    ) -> int:
        """Release: free the row (the fence counter stays) only if ``owner`` holds it, its old ``waiting``
        hint read back by the same statement, which also announces the turn of the first live waiter in
        the key's line (or, with nobody in line, the release to every waiter), or hands the lease over to
        it. ``DELETED``, ``DELETED_WITH_WAITERS`` or ``HANDED_OVER``, else ``NOT_DELETED``."""
        return self.free_in_line(table, key, owner, key, timeout_s, usage)

    def free_in_line(
        self, table: str, key: str, owner: str, line_key: str, timeout_s: float, usage: UsageMeter
    ) -> int:
        """As ``delete_if_owner``, the turn announced being that of the first live waiter in ``line_key``'s
        line (a semaphore's, for its slots)."""
        channel = self._release_channels.get(table)
        if channel is None:
            channel = self._release_channels[table] = release_channel(table).encode()
        parameters = [key_bytes(key), owner.encode(), channel, key_bytes(line_key)]
        result = self._in_line("delete_if_owner", table, key, FREE_IN_LINE, parameters, FREE, parameters[:3],
                               timeout_s, True, (FREE_IN_LINE_WITHOUT_OFFERS, parameters))
        if result.ntuples == 0:
            return NOT_DELETED
        if result.nfields == 3 and result.get_value(0, 2) == b"t":  # (FREE_IN_LINE's third column)
            return HANDED_OVER
        return DELETED_WITH_WAITERS if result.get_value(0, 0) == b"t" else DELETED

    # ---- the line of waiters (stores/base.py's WaiterLine) -------------------------------------------
    def read_in_line(
        self, table: str, key: str, waiter: str, timeout_s: float, usage: UsageMeter, line_key: Optional[str] = None,
        offer: Optional[Offer] = None,
    ) -> tuple[Optional[LockRow], bool]:
        """As ``read``, and ``waiter`` takes a place at the end of the line of ``line_key`` (None: the key's
        own), or keeps its own, for LINE_ALIVE_MS more, leaving its ``offer`` (a lock's waiter) for the
        release to hand the lease over with. The row, and whether the key is free and ``waiter`` first among
        the live."""
        parameters = [key_bytes(key), waiter.encode(), b"%d" % LINE_ALIVE_MS, self.release_feed.turn_name.encode(),
                      key_bytes(key if line_key is None else line_key)]
        offered = [None, None, None] if offer is None else [offer[0].encode(), offer[1].encode(), b"%d" % offer[3]]
        result = self._in_line("read_in_line", table, key, READ_IN_LINE, [*parameters, *offered], READ,
                               parameters[:1], timeout_s, False, (READ_IN_LINE_WITHOUT_OFFERS, parameters))
        if result.nfields == 6:  # the table has no line (_in_line): the plain read answered
            return (None if result.ntuples == 0 else _row(result, 0, 0)), False
        if result.get_value(0, 0) is None:
            return None, result.get_value(0, 6) == b"t"
        return _row(result, 0, 0), False

    def put_in_turn(
        self, table: str, key: str, owner: str, version: str, lease_ms: int, waiter: str, timeout_s: float,
        usage: UsageMeter, line_key: Optional[str] = None,
    ) -> Optional[int]:
        """As ``put_if_absent``, also refused while a live waiter is ahead of ``waiter`` in the line of
        ``line_key`` (None: the key's own; anyone live, if it has no place); applied, it takes ``waiter`` out
        of the line in the same statement, and a semaphore's line (``line_key`` given) announces the next
        waiter's turn: another slot may be free. The new fencing token, else None."""
        data = [owner.encode(), version.encode(), b"%d" % lease_ms]
        line, statement = (key, PUT_IN_TURN) if line_key is None else (line_key, PUT_IN_TURN_PASSING)
        result = self._in_line("put_in_turn", table, key, statement, [key_bytes(key), waiter.encode(), *data,
                                                                       key_bytes(line)],
                               PUT_IF_ABSENT, [key_bytes(key), *data], timeout_s, True)
        return _token(result)

    def read_all_in_line(
        self, table: str, keys: Sequence[str], waiter: str, timeout_s: float, usage: UsageMeter, line_key: str
    ) -> tuple[list[Optional[LockRow]], int]:
        """``read_in_line`` of every one of ``keys`` (a semaphore's slots) in one statement, the place kept
        once, in ``line_key``'s line. The rows, and the index of the first free key if the turn is
        ``waiter``'s, else -1 (always, where the table has no line)."""
        parameters = [key_array(keys), waiter.encode(), b"%d" % LINE_ALIVE_MS, self.release_feed.turn_name.encode(),
                      key_bytes(line_key)]
        result = self._in_line("read_all_in_line", table, line_key, READ_ALL_IN_LINE, parameters, READ_ALL,
                               parameters[:1], timeout_s, False)
        if result.ntuples != len(keys):
            raise MalformedLockRow(f"PostgreSQL read {result.ntuples} rows of the {len(keys)} slots of "
                                   f"{line_key!r}", key=line_key)
        rows = [None if result.get_value(n, 0) is None else _row(result, n, 0) for n in range(len(keys))]
        turn = result.nfields == 7 and result.ntuples > 0 and result.get_value(0, 6) == b"t"
        free = next((n for n, row in enumerate(rows) if row is None), -1) if turn else -1
        return rows, free

    def leave_line(
        self, table: str, key: str, waiter: str, timeout_s: float, line_key: Optional[str] = None,
        offered_owner: Optional[str] = None,
    ) -> None:
        """``waiter`` gives up its place in the line of ``line_key`` (None: the key's own); if it had the turn
        and the key is free, or a release handed it the lease meanwhile (held in ``offered_owner``, which is
        freed), the next is announced."""
        line = key_bytes(key if line_key is None else line_key)
        offered = None if offered_owner is None else offered_owner.encode()
        self._in_line("leave_line", table, key, LEAVE_LINE, [key_bytes(key), waiter.encode(), line, offered], None, [],
                      timeout_s, True)

    def _in_line(self, operation: str, table: str, key: str, template: str, parameters: list[Any],
                 plain: Optional[str], plain_parameters: list[Any], timeout_s: float, write: bool,
                 without_offers: Optional[tuple[str, list[Any]]] = None) -> Any:
        """Run ``template`` (a statement that uses the table's line); where the line is missing or our role
        may not use it, remember so, warn once, and run ``plain`` (its step without the line) instead. Where
        the line has no offers' columns (made by an earlier version), the same with ``without_offers``."""
        if without_offers is not None and table in self._offerless:
            template, parameters = without_offers
        if table not in self._lineless:
            try:
                return self._request(operation, key, self._sql(template, table), parameters, timeout_s, write)
            except StoreRequestRejected as error:
                # Only the server's own words about the line table: the message we add names every table.
                failure = error.__cause__
                if (without_offers is not None and isinstance(failure, Failure) and failure.sqlstate == "42703"
                        and "offer" in str(failure) and table not in self._offerless):
                    self._offerless.add(table)
                    _log.warning("the line of waiters of lock table %r has no offers' columns (made by an earlier "
                                 "version): waiters take turns, but no lease is handed over on release; run "
                                 "create_lock_table again to add them (docs/operations.md)", table)
                    return self._in_line(operation, table, key, template, parameters, plain, plain_parameters,
                                         timeout_s, write, without_offers)
                if not (isinstance(failure, Failure) and failure.sqlstate in ("42P01", "42501")
                        and line_table(table).strip('"') in str(failure)):
                    raise
                self._lineless.add(table)
                _log.warning("lock table %r has no line of waiters this client can use (%s): a release wakes "
                             "every waiter; run create_lock_table again to add it (docs/operations.md)",
                             table, error)
        if plain is None:
            return None
        return self._request(operation, key, self._sql(plain, table), plain_parameters, timeout_s, write)

    def read(self, table: str, key: str, timeout_s: float, usage: UsageMeter) -> Optional[LockRow]:
        """The held row of ``key``, or None."""
        statement = self._sql(READ, table)
        result = self._request("read", key, statement, [key_bytes(key)], timeout_s, False)
        return None if result.ntuples == 0 else _row(result, 0, 0)

    # ---- idempotency records ---------------------------------------------------------------------
    def read_record(self, table: str, key: str, timeout_s: float) -> Optional[Record]:
        """The record of ``key`` in record table ``table``, expired or not, or None."""
        statement = self._sql(READ_RECORD, table)
        result = self._request("read_record", key, statement, [key_bytes(key)], timeout_s, False)
        if result.ntuples == 0:
            return None
        state, fingerprint, data, expires, owner = (result.get_value(0, column) for column in range(5))
        return Record(as_text(state), as_text(fingerprint), _bytea(data), int(expires), as_text(owner))

    def finish_if_owner(
        self, lock_table: str, key: str, table: str, record: Record, now_ms: int, timeout_s: float
    ) -> bool:
        """In one statement (one transaction), only while ``record.owner`` holds ``key`` in
        ``lock_table``: delete the lease row, store ``record`` and purge a few expired records."""
        statement = self._sql(FINISH, lock_table, table)
        parameters = [key_bytes(key), record.owner.encode(), record.state.encode(), record.fingerprint.encode(),
                      bytes(record.result), b"%d" % record.expires_at_ms, b"%d" % now_ms]
        result = self._request("finish_if_owner", key, statement, parameters, timeout_s, True,
                               FINISH_TYPES, FINISH_FORMATS)
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
        if not records:  # (after the check: a table refused leaves nothing made)
            line = line_table(table)
            self._create(table, LINE_TABLE_SCHEMA.format(line=line), timeout_s)
            self._create(table, LINE_TABLE_COMMENT.format(line=line, name=name), timeout_s)
            # A line made by an earlier version gains the offers' columns; an up-to-date one is not altered
            # (ALTER TABLE locks the table out even when it adds nothing).
            if not set(OFFER_COLUMNS) <= set(self.columns(line.strip('"'), timeout_s)):
                self._create(table, LINE_OFFER_COLUMNS.format(line=line), timeout_s)
            self._lineless.discard(table)
            self._offerless.discard(table)
        if records:
            self._create(table, RECORD_EXPIRY_INDEX.format(index=expiry_index_name(table), name=name), timeout_s)

    def _create(self, table: str, statement: str, timeout_s: float) -> None:
        try:
            self._request("create_table", table, statement.encode(), [], timeout_s, True, prepare=False)
        except StoreRequestRejected as error:
            if not any(f"SQLSTATE {code}" in str(error) for code in CREATION_RACE_CODES):
                raise

    def columns(self, table: str, timeout_s: float = 10.0) -> tuple[tuple[str, str], ...]:
        """The (name, type) columns of ``table`` as the store's connection resolves it; () if there is none."""
        result = self._request("columns", table, COLUMNS.encode(), [sql_identifier(table).encode()],
                               timeout_s, False)
        return tuple((as_text(result.get_value(row, 0)), as_text(result.get_value(row, 1)))
                     for row in range(result.ntuples))

    def identity(self, table: str, timeout_s: float = 5.0) -> tuple[str, str, Optional[int]]:
        """(server start time, database, the table's oid) as this store's connections see them."""
        result = self._request("identity", table, IDENTITY_BY_POSITION.encode(), [sql_identifier(table).encode()],
                               timeout_s, False)
        oid = result.get_value(0, 2)
        return as_text(result.get_value(0, 0)), as_text(result.get_value(0, 1)), None if oid is None else int(oid)

    def inspect(self, table: str, key: Optional[str]) -> list[dict[str, Any]]:
        """Held rows of ``table`` (or ``key``'s), fence included. A table that does not exist raises
        StoreRequestRejected, with the lock path's hint (how to create it)."""
        name = sql_identifier(table)
        result = self._request("inspect", key or table, INSPECT.format(name=name).encode(),
                               [None if key is None else key_bytes(key)], 10.0, False)
        rows = []
        for index in range(result.ntuples):
            row = _row(result, index, 1)
            rows.append({"key": as_text(result.get_value(index, 0)), **row._asdict()})
        return rows

    @property
    def release_feed(self) -> Any:
        """The store's ReleaseFeed (``feed.PostgresReleaseFeed``), made on first use."""
        if self._feed is None:
            self._feed = PostgresReleaseFeed(self)
        return self._feed

    # ---- the renewal process (fastlease._renewal_link) -----------------------------------------------
    def renewal_config(self) -> Any:
        """What another process needs to renew here: the connection string (the password goes apart,
        through ``renewal_credentials``, never on a command line)."""
        return (self.kind, self.conninfo, self.transaction_pooling)

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


def _token(result: Any) -> Optional[int]:
    """The fencing token an acquisition's RETURNING gave, else None (the write matched no row)."""
    if result.ntuples == 0:
        return None
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
        as_text(owner) if owner is not None else None,  # type: ignore[arg-type]
        as_text(version) if version is not None else None,  # type: ignore[arg-type]
        int(lease_ms) if lease_ms is not None else None,  # type: ignore[arg-type]
        int(protocol) if protocol is not None else None,  # type: ignore[arg-type]
        waiting == b"t",
        int(fence),
    )
