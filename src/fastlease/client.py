"""What every store's client shares: the engine objects that live once per client.

A client owns one store adapter, one observation cache (4,096 entries; optionally shared with the
other processes of the host, see ``fastlease.observations``), one renewal scheduler (one thread,
started at the first acquisition) and the same-process release signals that wake waiters at once.
Create one client per process and store, inside the worker process.
"""

from __future__ import annotations

import os
import threading

from . import _impl
from ._typing import cast
from .exceptions import KeyKindMismatch
from .stores.base import check_table

TYPE_CHECKING = False  # typing is not imported at run time: see _typing.py
if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor  # imported where the pools are made, on first use
    from types import ModuleType
    from typing import Any, Optional, Self

    from ._engine import Clock, Engine

#: Concurrent acquisitions (which may wait for contention) the async API runs per client.
ASYNC_WORKERS = 64
#: Threads for the async API's steps that never wait for contention (releases, record reads and
#: writes): kept apart, so that a crowd of waiters can never delay the release they wait for.
ASYNC_SHORT_WORKERS = 16


def idempotency_lock_table(core: ModuleType, table: str, lock_table: Optional[str] = None) -> str:
    """The lock table that holds the in-flight leases of idempotency record table ``table``:
    ``lock_table``, else ``<table>_locks``; checked by the engine's table rule (ValueError naming it),
    and never the record table itself."""
    locks = str(check_table(lock_table if lock_table is not None else f"{table}_locks"))
    if locks == table:
        raise ValueError(f"the lock table and the record table must differ, both are {table!r}")
    return locks


class LeaseClient:
    """Base of every store client. Not used directly: see MemoryClient and the store clients.

    Every client also takes ``clock`` (a :class:`Clock`; the process's own clocks by default) and
    ``shared_observations``: True (or a file path) shares this host's sightings of held rows between
    its processes, so that a fresh process can take over an abandoned lease without first watching
    it for a whole lease itself (see ``fastlease.observations``). Clients must not be used in a
    forked child process (RuntimeError): make one per process.

    ``renewal``: ``"auto"`` (the default) renews leases of 1 s or more from a renewal process, one per
    client, started at the first such lease, so that they keep renewing while this process's GIL is
    held by a long C call; ``"thread"`` keeps every renewal on this process's renewal thread (so does
    the environment variable ``FASTLEASE_RENEWAL=thread``). See docs/architecture.md.
    """

    def __init__(
        self,
        store: Any,
        *,
        clock: Optional[Clock] = None,
        shared_observations: "bool | str | os.PathLike[str]" = False,
        renewal: str = "auto",
        _engine_module: Optional[ModuleType] = None,
    ) -> None:
        LeaseClient.check_options(shared_observations=shared_observations, renewal=renewal)
        core = _engine_module if _engine_module is not None else _impl.core
        #: The engine module this client runs: compiled or interpreted (``implementation`` says which).
        self.engine_module = core
        self.store = store  # the store adapter: single atomic operations (``fastlease.stores``)
        own = core.ObservationCache(core.OBSERVATION_CACHE_SIZE)
        if shared_observations is False:
            observations: Any = own
        else:
            from .observations import SharedObservationCache

            path = None if shared_observations is True else shared_observations
            observations = SharedObservationCache(self._observation_scope(), own, path=path)
        #: The engine's state for this client (store, clock, observations, renewal scheduler, release
        #: signals): every lease of the client reads it, and nothing else of the client.
        self.engine: Engine = core.Engine(store, clock, observations)
        if renewal == "auto" and clock is None and os.name == "posix" and hasattr(store, "renewal_config") \
                and os.environ.get("FASTLEASE_RENEWAL", "auto") != "thread":
            from ._renewal_link import RenewalLink

            self.engine.link = RenewalLink(store.renewal_config,
                                           getattr(store, "renewal_credentials", lambda: None),
                                           getattr(store, "renewal_delegable", None))
        self._executor: Optional[ThreadPoolExecutor] = None  # the async API's worker threads, made on first use
        self._short_executor: Optional[ThreadPoolExecutor] = None
        self._executor_lock = threading.Lock()

    @staticmethod
    def check_options(**options: Any) -> None:
        """TypeError or ValueError for options that every client's constructor refuses (an unknown name, a
        bad ``shared_observations`` or ``renewal``), before anything is opened: the SQLite client checks
        them before it creates its file, so that a bad option leaves no file behind."""
        unknown = sorted(set(options) - {"clock", "shared_observations", "renewal", "_engine_module"})
        if unknown:
            raise TypeError(f"unexpected keyword arguments {unknown}: a client takes clock, shared_observations and "
                            "renewal, besides its store's own")
        shared = options.get("shared_observations", False)
        if not (shared is True or shared is False or isinstance(shared, (str, os.PathLike))):
            raise TypeError(f"shared_observations must be True, False or a file path, got {type(shared).__name__}")
        renewal = options.get("renewal", "auto")
        if renewal not in ("auto", "thread"):
            raise ValueError(f"renewal must be 'auto' or 'thread', got {renewal!r}")

    @property
    def implementation(self) -> str:
        """``"c"`` when this client runs the compiled engine, ``"py"`` for the same source interpreted."""
        return str(self.engine_module.IMPLEMENTATION)

    @property
    def clock(self) -> Clock:
        """The clock this client's leases count validity on."""
        return self.engine.clock

    def _observation_scope(self) -> str:
        """What makes two clients' rows the same rows: stores override it (endpoint, file, ...)."""
        return f"{type(self.store).__name__}:{id(self.store)}"

    def _check_in(self, lease: Any, transaction: Any) -> None:
        """Add the ownership check of ``lease`` to ``transaction``; stores with transactions override it."""
        raise TypeError(
            f"{type(self).__name__} has no transactions to check in to; "
            "use lease.raise_if_lost() for a local check"
        )

    def inspect(self, table: str, key: Optional[str] = None) -> list[dict[str, Any]]:
        """The held rows of ``table`` (or only ``key``'s) as stored, for operators and the CLI: dicts
        with key, owner, version, lease_ms, protocol, waiting and fence (None where the store keeps
        none). Reads only: nothing is created, observed or changed."""
        raise TypeError(f"{type(self).__name__} cannot be inspected from outside its process")

    def holder(self, table: str, key: str) -> Optional[dict[str, Any]]:
        """The row that holds ``key`` now, as :meth:`inspect` returns it, or None when nobody does.
        Read-only, like ``inspect``: a snapshot for operators and diagnostics, not a lock decision
        (the holder may change the moment after; acquire a guard to act on the key)."""
        self.engine_module.check_key(key)
        rows = self.inspect(table, key)
        return rows[0] if rows else None

    def holders(self, table: str, key: str, limit: Optional[int] = None) -> list[dict[str, Any]]:
        """Who holds the semaphore ``key`` now: one dict per held slot, in slot order, as :meth:`inspect`
        gives rows (key, owner, version, lease_ms, protocol, waiting, fence) plus ``slot``, ``limit`` and
        ``identity``. Reads only, one read per slot: a snapshot for operators, not a decision. The limit
        is read from the first slot's holder; when that slot is free, give ``limit``, or every row of the
        table is read (a scan on DynamoDB) to find the others. A slot held by another use of the key (a
        lock, another limit) raises KeyKindMismatch, as acquiring would."""
        core = self.engine_module
        check_table(table)
        if limit is None:
            first = self.inspect(table, core.check_key(key))
            rows = first if first else [row for row in self.inspect(table) if _slot_of(core, key, row["key"]) > 0]
            owner = rows[0]["owner"] if rows else ""
            if not owner:
                return []
            if not owner.startswith(core.SEMAPHORE_OWNER):
                raise KeyKindMismatch(f"{rows[0]['key']!r} is held by a lock, not by a semaphore's slot", key=key)
            limit = int(owner[len(core.SEMAPHORE_OWNER):].partition(":")[0])
        kind = f"{core.SEMAPHORE_OWNER}{limit}:"
        found = []
        for slot, slot_key in enumerate(core.slot_keys(key, limit)):
            for row in self.inspect(table, slot_key):
                core.check_holder_kind(row["owner"], kind, slot_key)
                identity = row["owner"][len(kind):].rpartition("/")[0]
                found.append({**row, "slot": slot, "limit": limit, "identity": identity})
        return found

    def _async_executor(self, short: bool = False) -> ThreadPoolExecutor:
        """The bounded thread pool the async API runs blocking steps on (not the loop's default pool,
        which lock waits could starve). Acquisitions use one pool, steps that never wait for
        contention (``short``) another. One of each per client; threads are made as needed."""
        executor = self._short_executor if short else self._executor
        if executor is None:
            with self._executor_lock:
                from concurrent.futures import ThreadPoolExecutor

                if short and self._short_executor is None:
                    self._short_executor = ThreadPoolExecutor(max_workers=ASYNC_SHORT_WORKERS,
                                                              thread_name_prefix="fastlease-async-short")
                elif not short and self._executor is None:
                    self._executor = ThreadPoolExecutor(max_workers=ASYNC_WORKERS, thread_name_prefix="fastlease-async")
                executor = self._short_executor if short else self._executor
        return cast("ThreadPoolExecutor", executor)  # made above if it was missing

    def _record_in(self, transaction: Any, table: str, key: str, record: Any) -> None:
        """Add an idempotency record's write to the caller's transaction; only DynamoDB has one that
        can carry it."""
        raise TypeError(
            f"complete_in() adds the record to a DynamoDB transaction; {type(self).__name__} has none that can "
            "carry it: commit your own transaction, then call complete(result), which stores the record and "
            "releases the key in one atomic request while the lease is ours"
        )

    def _condition_check_item(self, lease: Any) -> dict[str, Any]:
        """The raw transaction entry that checks ``lease``; only DynamoDB has one."""
        raise TypeError(
            f"condition_check_item() is for DynamoDB leases, not {type(self).__name__}; use check_in()"
        )

    def close(self) -> None:
        """Stop the renewal thread. Leases still held lapse locally; their rows are recovered by others."""
        self.engine.close()
        for executor in (self._executor, self._short_executor):
            if executor is not None:
                executor.shutdown(wait=False)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _slot_of(core: ModuleType, key: str, row_key: str) -> int:
    """The slot number that ``row_key`` has in the semaphore ``key`` (0 for the key itself), or -1."""
    if row_key == key:
        return 0
    head, separator, number = row_key.rpartition(core.SLOT_SEPARATOR)
    return int(number) if separator and head == key and number.isdigit() and number[0] != "0" else -1
