"""The in-memory client: leases between the threads of one process, on a :class:`MemoryStore`. For
tests, and for code that wants the lease API without a server."""

from __future__ import annotations

from .client import LeaseClient
from .stores.base import check_table
from .stores.memory import MemoryStore

TYPE_CHECKING = False  # typing is not imported at run time: see _typing.py
if TYPE_CHECKING:
    from typing import Any, Optional

    from ._engine import Clock

__all__ = ["MemoryClient", "MemoryStore"]


class MemoryClient(LeaseClient):
    """A lease client on an in-process :class:`MemoryStore`.

    Clients that share one ``store`` behave like separate processes sharing one table: each has its
    own observation cache and renewal thread. ``clock`` injects time (see ``fastlease.testing.FakeClock``).
    """

    def __init__(self, *, store: Optional[MemoryStore] = None, clock: Optional[Clock] = None, **engine: Any) -> None:
        self.store = store if store is not None else MemoryStore()
        super().__init__(self.store, clock=clock, **engine)

    def inspect(self, table: str, key: Optional[str] = None) -> list[dict[str, Any]]:
        rows = self.store.rows(check_table(table))
        return [{"key": k, **row._asdict()}
                for k, row in sorted(rows.items()) if key is None or k == key]
