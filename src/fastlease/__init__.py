"""fastlease: distributed leases (locks) with background renewal, safe takeover and one engine
for every store.

``import fastlease`` needs no optional client library and stays cheap: store clients, the async
guard and whatever they need (boto3, redis, psycopg, sqlite3, asyncio) load on first use.
"""

from __future__ import annotations

from ._impl import IMPLEMENTATION
from .decorator import distributed_lock, semaphore
from .exceptions import FastleaseError, KeyKindMismatch, LockLost, LockNotAcquired, LockReleaseError
from .lock import LeaseMetrics, SyncDistributedLock
from .memory import MemoryClient, MemoryStore

TYPE_CHECKING = False  # typing is not imported at run time: see _typing.py

if TYPE_CHECKING:  # type checkers see the lazily loaded names (below) as what they are
    from .aio import AsyncSemaphore, DistributedLock
    from .dynamodb import DynamoDBClient
    from .election import AsyncElection, Election
    from .postgres import PostgresClient
    from .redis import RedisClient
    from .semaphores import Semaphore
    from .sqlite import SQLiteClient

__all__ = [
    "AsyncElection",
    "AsyncSemaphore",
    "DistributedLock",
    "DynamoDBClient",
    "Election",
    "IMPLEMENTATION",
    "FastleaseError",
    "KeyKindMismatch",
    "LeaseMetrics",
    "LockLost",
    "LockNotAcquired",
    "LockReleaseError",
    "MemoryClient",
    "MemoryStore",
    "PostgresClient",
    "RedisClient",
    "SQLiteClient",
    "Semaphore",
    "SyncDistributedLock",
    "distributed_lock",
    "semaphore",
]

from ._version import __version__ as __version__  # noqa: E402 - re-exported: the package's version


#: Public names loaded on first use: name -> the module that defines it (the store clients: from the
#: one list of backends; MemoryClient is imported above).
def _lazy_names() -> dict[str, str]:
    from .stores.registry import BACKENDS

    clients = {backend.client_name: backend.client.split(":")[0] for backend in BACKENDS.values()}
    return {"DistributedLock": "fastlease.aio", "Election": "fastlease.election", "AsyncElection": "fastlease.election",
            "Semaphore": "fastlease.semaphores", "AsyncSemaphore": "fastlease.aio",
            **{name: module for name, module in clients.items()
                                                   if name not in globals()}}


_LAZY = _lazy_names()


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fastlease' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
