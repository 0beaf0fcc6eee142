"""PostgreSQL: one of the store's own connections, driven through libpq with a deadline of ours.

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
"""

from __future__ import annotations

import os
import select
import socket
import time
import weakref
from typing import Any, Optional, Sequence

from .sql import CONNECTION_CLASSES, MAX_PREPARED, SET_TIMEOUTS


class Failure(Exception):
    """A request's failure inside ``Session``: SQLSTATE (None: no answer) and whether the connection
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
#: A connection keeps its server-side bounds while they lie within this share of the request's timeout:
#: a handoff's requests carry timeouts a few milliseconds apart (an acquisition's is what is left of its
#: wait, a release's the whole), and setting the bounds anew for each cost one more round trip each.
#: Above the band, the client's deadline could pass before the server cancels; below it, statements are
#: cancelled early.
SERVER_TIMEOUT_BAND = (0.6, 0.85)


class Session:
    """One of the store's own connections: autocommit, driven through libpq (``psycopg.pq``) so that
    the wait for each answer has a deadline of ours."""

    def __init__(self, connection: Any, session_state: bool) -> None:
        self.connection = connection
        self.pgconn = connection.pgconn
        # The server-side bounds set on the connection, in ms; 0: not set yet; None: never set (no session
        # state).
        self.server_ms: Optional[int] = 0 if session_state else None
        #: The statements prepared on this connection, and their names; None: unnamed statements only.
        self.prepared: Optional[dict[bytes, bytes]] = {} if session_state else None

    def run(self, statement: bytes, parameters: Sequence[Optional[bytes]], timeout_s: float,
            types: Optional[list[int]] = None, formats: Optional[list[int]] = None, prepare: bool = True) -> Any:
        """Send one statement, wait for its one result until the deadline, and return it (a PGresult).

        A statement is prepared on the connection the first time it runs there (one more round trip,
        once), then executed by name: the server parses and plans it once per connection, not per
        request. The connection's statement_timeout and lock_timeout follow the request's timeout,
        with a round trip only when they leave ``SERVER_TIMEOUT_BAND`` of it."""
        from psycopg import pq

        deadline = time.monotonic() + timeout_s
        timeout_ms = timeout_s * 1000
        pgconn = self.pgconn
        current = self.server_ms
        low, high = SERVER_TIMEOUT_BAND
        if current is not None and not low * timeout_ms <= current <= high * timeout_ms:
            server_ms = max(1, int(timeout_ms * SERVER_TIMEOUT_SHARE))
            self._exchange(deadline, pq, pgconn.send_query_params, SET_TIMEOUTS, [b"%d" % server_ms])
            self.server_ms = server_ms
        prepared = self.prepared
        if prepared is None or not prepare:
            return self._exchange(deadline, pq, pgconn.send_query_params, statement, parameters, types, formats)
        name = prepared.get(statement)
        if name is None:
            if len(prepared) >= MAX_PREPARED:
                return self._exchange(deadline, pq, pgconn.send_query_params, statement, parameters, types, formats)
            name = b"fastlease_%d" % len(prepared)
            self._exchange(deadline, pq, pgconn.send_prepare, name, statement, types)
            prepared[statement] = name
        try:
            return self._exchange(deadline, pq, pgconn.send_query_prepared, name, parameters, formats)
        except Failure as failure:
            if failure.sqlstate == "26000":  # the server lost our prepared statements (DISCARD ALL, a pooler)
                prepared.clear()
            raise

    def _exchange(self, deadline: float, pq: Any, send: Any, *arguments: Any) -> Any:
        """``send(*arguments)`` (one of libpq's asynchronous sends), then wait for its one result."""
        pgconn = self.pgconn
        try:
            send(*arguments)
        except Exception as error:  # noqa: BLE001 - psycopg raises its OperationalError: nothing was sent
            raise Failure(f"could not send the request: {as_message(pgconn.error_message) or error}", None,
                           True, False) from error
        try:
            while pgconn.flush():
                self._wait(select.POLLOUT, deadline)
            while True:
                pgconn.consume_input()
                if not pgconn.is_busy():
                    break
                self._wait(select.POLLIN, deadline)
        except Failure:
            raise
        except Exception as error:  # noqa: BLE001 - the connection broke while the request was out
            raise Failure(f"the connection broke: {as_message(pgconn.error_message) or error}", None, True,
                           True) from error
        result = pgconn.get_result()
        while pgconn.get_result() is not None:  # drain: the connection is idle again after the last one
            pass
        if result is None:
            raise Failure(f"no answer: {as_message(pgconn.error_message)}", None, True, True)
        if result.status == pq.ExecStatus.FATAL_ERROR:
            sqlstate = as_message(result.error_field(pq.DiagnosticField.SQLSTATE))
            primary = result.error_field(pq.DiagnosticField.MESSAGE_PRIMARY)
            message = as_message(primary) or as_message(result.error_message)
            broken = pgconn.status != pq.ConnStatus.OK or (sqlstate or "").startswith(CONNECTION_CLASSES)
            raise Failure(message, sqlstate, broken, True)
        return result

    def _wait(self, events: int, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise Failure("no answer within the request's timeout", None, True, True)
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
ALL_SESSIONS: "weakref.WeakSet[Session]" = weakref.WeakSet()


def _disown_in_child() -> None:
    """In a forked child: point every inherited connection's socket at a fresh unconnected socket, so
    that nothing this child does (a request, the close when the object is collected) reaches the
    parent's connection. The stores then open connections of their own."""
    for session in list(ALL_SESSIONS):
        try:
            fd = session.pgconn.socket
            with socket.socket() as placeholder:
                os.dup2(placeholder.fileno(), fd)
        except Exception:  # noqa: BLE001 - a connection already closed has no socket to replace
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_disown_in_child)


def as_text(value: Optional[bytes]) -> str:
    """A text value as stored (owner ids and keys are compared exactly: nothing is stripped)."""
    return "" if value is None else value.decode("utf-8", "replace")


def as_message(value: Optional[bytes]) -> str:
    """A message from libpq or the server, for an error's text."""
    return as_text(value).strip()

