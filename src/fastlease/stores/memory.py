"""In-memory store: a dict behind a lock, in-process. The first implementation of ``LockStore``.

It has a fault hook (``MemoryStore.faults``, see :class:`fastlease.testing.FaultInjector`) that can
delay requests, drop responses after applying them, or fail them with or without applying, so the
engine's reconciliation is testable without a network. With no hook installed it adds one attribute
check per request.
"""

from __future__ import annotations

import threading

from .._typing import Protocol
from .base import DELETED, DELETED_WITH_WAITERS, NOT_DELETED, LockRow, Record, UsageMeter

__all__ = ["MemoryStore"]

PROTOCOL_V1 = 1

TYPE_CHECKING = False  # typing is not imported at run time: see fastlease/_typing.py
if TYPE_CHECKING:
    from typing import Any, Callable, Optional, TypeVar

    _T = TypeVar("_T")


class FaultHook(Protocol):
    """What ``MemoryStore.faults`` holds: every request of the store goes through ``run`` (see
    :class:`fastlease.testing.FaultInjector`)."""

    def run(self, operation: str, apply: Callable[..., _T], args: tuple[Any, ...], timeout_s: float) -> _T:
        """Run request ``operation`` (``apply(*args)`` applies it) within ``timeout_s`` seconds, or
        fail it: delay it, skip it, or raise StoreError after applying it or not."""


class MemoryStore:
    """Lock rows of every table in one dict keyed by (table, key); every operation is atomic."""

    kind = "memory"  # in stores.registry

    def __init__(self) -> None:
        self._rows: dict[tuple[str, str], LockRow] = {}
        # Fencing tokens per (table, key): incremented by every acquisition and takeover, kept across
        # release, as the SQLite store keeps them.
        self._fences: dict[tuple[str, str], int] = {}
        self._records: dict[tuple[str, str], Record] = {}  # idempotency records by (table, key)
        self._lock = threading.Lock()
        #: Optional fault hook: ``faults.run(operation, apply, args, timeout_s)``.
        self.faults: Optional[FaultHook] = None

    @property
    def blocking(self) -> bool:
        """Whether a request may block: never, unless a fault hook (delays, hangs) is installed.
        The async API runs non-blocking releases on the event loop instead of a worker thread."""
        return self.faults is not None

    # Each public operation applies itself directly, or through the fault hook when one is installed.
    def put_if_absent(
        self, table: str, key: str, owner: str, version: str, lease_ms: int, timeout_s: float, usage: UsageMeter
    ) -> Optional[int]:
        """Create the row if ``(table, key)`` has none: its new fencing token (an int >= 1), else None."""
        if self.faults is None:
            return self._put_if_absent(table, key, owner, version, lease_ms)
        return self.faults.run("put_if_absent", self._put_if_absent, (table, key, owner, version, lease_ms), timeout_s)

    def _put_if_absent(self, table: str, key: str, owner: str, version: str, lease_ms: int) -> Optional[int]:
        slot = (table, key)
        with self._lock:
            if slot in self._rows:
                return None
            return self._write_locked(slot, owner, version, lease_ms)

    def _write_locked(self, slot: tuple[str, str], owner: str, version: str, lease_ms: int) -> int:
        """A fresh row with the next fencing token of its key (caller holds the lock)."""
        fence = self._fences[slot] = self._fences.get(slot, 0) + 1
        self._rows[slot] = LockRow(owner, version, lease_ms, PROTOCOL_V1, False, fence)
        return fence

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
        """Replace the row only if it holds exactly (expected_owner, expected_version): the new fencing
        token, else None."""
        args = (table, key, expected_owner, expected_version, owner, version, lease_ms)
        if self.faults is None:
            return self._replace_if(*args)
        return self.faults.run("replace_if", self._replace_if, args, timeout_s)

    def _replace_if(
        self, table: str, key: str, expected_owner: str, expected_version: str, owner: str, version: str, lease_ms: int
    ) -> Optional[int]:
        slot = (table, key)
        with self._lock:
            row = self._rows.get(slot)
            if row is None or row.owner != expected_owner or row.version != expected_version:
                return None
            return self._write_locked(slot, owner, version, lease_ms)

    def update_version_if(
        self, table: str, key: str, owner: str, version: str, new_version: str, timeout_s: float, usage: UsageMeter,
        lease_ms: int = 0,
    ) -> bool:
        """Set the row's version to ``new_version`` only if it holds (owner, version); True if it did."""
        args = (table, key, owner, version, new_version)
        if self.faults is None:
            return self._update_version_if(*args)
        return self.faults.run("update_version_if", self._update_version_if, args, timeout_s)

    def _update_version_if(self, table: str, key: str, owner: str, version: str, new_version: str) -> bool:
        slot = (table, key)
        with self._lock:
            row = self._rows.get(slot)
            if row is None or row.owner != owner or row.version != version:
                return False
            self._rows[slot] = row._replace(version=new_version)
            return True

    def mark_waiting(
        self, table: str, key: str, owner: str, version: str, timeout_s: float, usage: UsageMeter
    ) -> bool:
        """Set the row's ``waiting`` hint only if it holds (owner, version) and has none yet; True if it did."""
        if self.faults is None:
            return self._mark_waiting(table, key, owner, version)
        return self.faults.run("mark_waiting", self._mark_waiting, (table, key, owner, version), timeout_s)

    def _mark_waiting(self, table: str, key: str, owner: str, version: str) -> bool:
        slot = (table, key)
        with self._lock:
            row = self._rows.get(slot)
            if row is None or row.owner != owner or row.version != version or row.waiting:
                return False
            self._rows[slot] = row._replace(waiting=True)
            return True

    def delete_if_owner(
        self, table: str, key: str, owner: str, timeout_s: float, usage: UsageMeter
    ) -> int:
        """Delete the row only if ``owner`` holds it: ``DELETED`` or ``DELETED_WITH_WAITERS`` (the row
        carried the waiting hint), else ``NOT_DELETED``."""
        if self.faults is None:
            return self._delete_if_owner(table, key, owner)
        return self.faults.run("delete_if_owner", self._delete_if_owner, (table, key, owner), timeout_s)

    def _delete_if_owner(self, table: str, key: str, owner: str) -> int:
        slot = (table, key)
        with self._lock:
            row = self._rows.get(slot)
            if row is None or row.owner != owner:
                return NOT_DELETED
            del self._rows[slot]
            return DELETED_WITH_WAITERS if row.waiting else DELETED

    def read(self, table: str, key: str, timeout_s: float, usage: UsageMeter) -> Optional[LockRow]:
        """The row of ``(table, key)`` as stored (unchecked), or None."""
        if self.faults is None:
            return self._rows.get((table, key))
        return self.faults.run("read", self._rows.get, ((table, key),), timeout_s)

    # ---- idempotency records (no fault hook: the engine's reconciliation is what faults test) ----
    max_result_bytes = None

    def read_record(self, table: str, key: str, timeout_s: float) -> Optional[Record]:
        """The idempotency record of ``key`` in record table ``table``, expired or not, or None."""
        with self._lock:
            return self._records.get((table, key))

    def finish_if_owner(
        self, lock_table: str, key: str, table: str, record: Record, now_ms: int, timeout_s: float
    ) -> bool:
        """In one critical section, only while ``record.owner`` holds the lease on ``key`` in
        ``lock_table``: store ``record`` in ``table`` (replacing any) and delete the lease row and its
        fencing counter. False if that owner does not hold it."""
        with self._lock:
            row = self._rows.get((lock_table, key))
            if row is None or row.owner != record.owner:
                return False
            self._records[(table, key)] = record
            del self._rows[(lock_table, key)]
            self._fences.pop((lock_table, key), None)  # as on the other stores: a used key leaves no counter
            return True

    # ---- direct access for tests and tools ------------------------------------------------------
    def rows(self, table: str) -> dict[str, LockRow]:
        """A snapshot of the table's rows by key."""
        with self._lock:
            return {key: row for (t, key), row in self._rows.items() if t == table}

    def plant(self, table: str, key: str, row: Any) -> None:
        """Store any row as is, unchecked: abandoned leases, foreign protocols, malformed rows."""
        with self._lock:
            self._rows[(table, key)] = row

    def remove(self, table: str, key: str) -> None:
        """Delete a row unconditionally (an operator's forced release)."""
        with self._lock:
            self._rows.pop((table, key), None)


