"""An observation cache shared by the processes of one host, for fresh clients (cron jobs, retried
CLI calls, short-lived workers) that would otherwise never see an abandoned lease for long enough.

Why it is safe: a takeover needs the same (owner, version, lease_ms) seen unchanged for a whole
stored lease. Versions are random and never reused, so if *any* process on this host saw that exact
row at time T, and this process sees it now, the row was unchanged from T to now. T and now must come
from the same clock: CLOCK_MONOTONIC is system-wide on Linux, within one boot and one time namespace,
so entries are scoped by the boot id and the time namespace, and a reading from the future (a clock
that is not comparable) counts as a fresh sighting. Anything unusable (another OS, a file owned by
someone else, a SQLite error) falls back, with one warning, to the client's own in-memory cache: that
only delays recovery.

The file is a small SQLite table (WAL mode), bounded to ``capacity`` entries per scope, in
``$XDG_CACHE_HOME/fastlease`` (or ``~/.cache/fastlease``), made private to the user (0700/0600).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import sys
import threading
from pathlib import Path
from typing import Any, Optional

_log = logging.getLogger("fastlease.observations")

FILE_NAME = "observations-v1.sqlite3"

#: One row per (scope, table, key): the sighting and when it was first seen, on the shared clock.
SCHEMA = """
CREATE TABLE IF NOT EXISTS observations (
    scope TEXT NOT NULL, tbl TEXT NOT NULL, key TEXT NOT NULL,
    owner TEXT NOT NULL, version TEXT NOT NULL, lease_ms INTEGER NOT NULL,
    first_seen_ns INTEGER NOT NULL, last_seen_ns INTEGER NOT NULL,
    PRIMARY KEY (scope, tbl, key)
)
"""
#: The current sighting of a key, if any.
SELECT_SIGHTING = "SELECT owner, version, lease_ms, first_seen_ns FROM observations WHERE scope=? AND tbl=? AND key=?"
#: A new or changed row restarts the observation; an unchanged one only refreshes last_seen_ns.
UPSERT_SIGHTING = (
    "INSERT OR REPLACE INTO observations (scope, tbl, key, owner, version, lease_ms, first_seen_ns, last_seen_ns) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
FORGET_SIGHTING = "DELETE FROM observations WHERE scope=? AND tbl=? AND key=?"
#: Bound the table: drop the least recently seen entries of this scope beyond its capacity.
PRUNE_SCOPE = (
    "DELETE FROM observations WHERE scope=? AND key IN (SELECT key FROM observations WHERE scope=? "
    "ORDER BY last_seen_ns DESC LIMIT -1 OFFSET ?)"
)


def default_path() -> Path:
    """The per-user cache directory's file (``$XDG_CACHE_HOME`` or ``~/.cache``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fastlease" / FILE_NAME


def clock_scope() -> Optional[str]:
    """Identity of the clock readings can be compared within: boot id and time namespace (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    try:
        time_namespace = os.readlink("/proc/self/ns/time")
    except OSError:
        time_namespace = "no-time-namespace"  # kernels before 5.6 have none: one clock for all
    return f"{boot_id}|{time_namespace}"


class SharedObservationCache:
    """The ``ObservationCache`` interface, backed by a file shared by this host's processes."""

    def __init__(self, store_scope: str, fallback: Any, *, path: Optional[os.PathLike[str] | str] = None) -> None:
        self.path = Path(path) if path is not None else default_path()
        self.capacity = fallback.capacity  # the per-client cache's bound (OBSERVATION_CACHE_SIZE)
        self._fallback = fallback
        clock = clock_scope()
        self._scope = f"{clock}|{store_scope}" if clock is not None else None
        self._degraded = self._scope is None
        self._connections = threading.local()
        if self._degraded:
            _log.warning("shared observations need Linux's system-wide monotonic clock; using per-client ones")

    @property
    def shared(self) -> bool:
        """False once the cache has fallen back to the client's own observations."""
        return not self._degraded

    def _connection(self) -> sqlite3.Connection:
        connection: Optional[sqlite3.Connection] = getattr(self._connections, "connection", None)
        if connection is None:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                if os.fstat(fd).st_uid != os.getuid():
                    # Someone else's file could feed us forged sightings, and so early takeovers.
                    raise PermissionError(f"{self.path} is not owned by this user")
            finally:
                os.close(fd)
            connection = sqlite3.connect(str(self.path), timeout=1.0, isolation_level=None, check_same_thread=True)
            connection.execute("PRAGMA journal_mode=WAL")
            # WAL + NORMAL: no fsync per commit, and no corruption on a process crash. An OS crash may
            # lose recent sightings (recovery is only delayed), and a reboot changes the scope anyway.
            connection.execute("PRAGMA synchronous=NORMAL")
            connection.execute("PRAGMA busy_timeout=1000")
            connection.execute(SCHEMA)
            self._connections.connection = connection
        return connection

    def _degrade(self, error: BaseException) -> None:
        if not self._degraded:
            self._degraded = True
            _log.warning("shared observation file %s unusable (%s); using per-client observations", self.path, error)

    def observe(self, cache_key: tuple[str, str], owner: str, version: str, lease_ms: int, now_ns: int) -> int:
        """Record a sighting; return how long this exact row has been seen unchanged, by any process."""
        if not self._degraded:
            try:
                return self._observe_shared(cache_key, owner, version, lease_ms, now_ns)
            except (sqlite3.Error, OSError) as error:
                self._degrade(error)
        return int(self._fallback.observe(cache_key, owner, version, lease_ms, now_ns))

    def _observe_shared(self, cache_key: tuple[str, str], owner: str, version: str, lease_ms: int, now_ns: int) -> int:
        table, key = cache_key
        connection = self._connection()
        connection.execute("BEGIN IMMEDIATE")  # one writer at a time: read and update atomically
        try:
            row = connection.execute(SELECT_SIGHTING, (self._scope, table, key)).fetchone()
            first_ns = now_ns
            if row is not None and (row[0], row[1], row[2]) == (owner, version, lease_ms) and row[3] <= now_ns:
                first_ns = int(row[3])
            connection.execute(UPSERT_SIGHTING, (self._scope, table, key, owner, version, lease_ms, first_ns, now_ns))
            if row is None:
                connection.execute(PRUNE_SCOPE, (self._scope, self._scope, self.capacity))
            connection.execute("COMMIT")
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        return now_ns - first_ns

    def forget(self, cache_key: tuple[str, str]) -> None:
        """Called when this client acquires the key: its old sighting is irrelevant now."""
        self._fallback.forget(cache_key)
        if not self._degraded:
            try:
                self._connection().execute(FORGET_SIGHTING, (self._scope, *cache_key))
            except (sqlite3.Error, OSError) as error:
                self._degrade(error)
