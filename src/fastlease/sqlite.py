"""The SQLite client: leases between the processes of one host, on an embedded file, with
``check_in`` inside the caller's own write transaction on the same file."""

from __future__ import annotations

import os
import sqlite3
from typing import TYPE_CHECKING, Any, Optional

from .client import LeaseClient
from .stores.sqlite import SQLiteStore

if TYPE_CHECKING:
    from ._engine import Clock

__all__ = ["SQLiteClient"]


class SQLiteClient(LeaseClient):
    """A lease client on an embedded SQLite file: leases between the processes of one host.

    ``SQLiteClient("/var/lib/myapp/locks.db")``. The file and its lock tables are created on first use
    (the directory must exist). Clients in any number of processes may share the file. Bad paths
    (missing directory, a corrupt or read-only file) raise ``ValueError`` naming the path.
    ``lease.check_in(connection)`` checks ownership inside your own write transaction on the same file.
    """

    store: SQLiteStore

    def __init__(self, path: "str | os.PathLike[str]", *, clock: Optional[Clock] = None, **engine: Any) -> None:
        LeaseClient.check_options(**engine)  # before the file is created: bad options leave none behind
        self.store = SQLiteStore(path)
        super().__init__(self.store, clock=clock, **engine)

    def _observation_scope(self) -> str:
        return f"sqlite:{os.path.realpath(self.store.path)}"

    def inspect(self, table: str, key: Optional[str] = None) -> list[dict[str, Any]]:
        return self.store.inspect(table, key)

    def _check_in(self, lease: Any, transaction: Any) -> None:
        """Check ownership inside the caller's open transaction on the same file.

        Why this is sound: SQLite has one writer at a time. The check is a write statement on the lock
        row that changes nothing and matches only while we own it, so from this moment the caller's
        transaction holds the file's write lock until it commits or rolls back; no takeover (itself a
        write) can land in between. If another writer committed after the caller's transaction began
        reading, SQLite refuses to upgrade it (busy snapshot) and nothing of the caller's commits.
        """
        if not isinstance(transaction, sqlite3.Connection):
            raise TypeError(f"check_in takes a sqlite3.Connection, got {type(transaction).__name__}")
        if not transaction.in_transaction:
            raise ValueError(
                "check_in needs the connection inside a transaction: execute 'BEGIN IMMEDIATE' first "
                "(or check in after your first write)"
            )
        files = {row[2] for row in transaction.execute("PRAGMA database_list") if row[1] == "main"}
        if not any(f and os.path.realpath(f) == os.path.realpath(self.store.path) for f in files):
            raise ValueError(f"check_in: the connection is not on this client's file {self.store.path!r}")
        if not self.store.check_in(transaction, lease.table, lease.key, lease.owner):
            raise lease.lost_to_store("check_in found another owner")

    def close(self) -> None:
        super().close()
        self.store.close()
