"""fastlease: distributed leases (locks) with background renewal, safe takeover and one engine
for every store.

``import fastlease`` needs no optional client library and stays cheap: store clients, the async
guard and whatever they need (boto3, redis, psycopg, sqlite3, asyncio) load on first use.
"""

from __future__ import annotations

from ._impl import IMPLEMENTATION
from .decorator import distributed_lock
from .exceptions import FastleaseError, LockLost, LockNotAcquired, LockReleaseError
from .lock import LeaseMetrics, SyncDistributedLock
from .memory import MemoryClient, MemoryStore

TYPE_CHECKING = False  # typing is not imported at run time: see _typing.py

if TYPE_CHECKING:  # type checkers see the lazily loaded names (below) as what they are
    from .aio import DistributedLock
    from .dynamodb import DynamoDBClient
    from .election import AsyncElection, Election
    from .postgres import PostgresClient
    from .redis import RedisClient
    from .sqlite import SQLiteClient

__all__ = [
    "AsyncElection",
    "DistributedLock",
    "DynamoDBClient",
    "Election",
    "IMPLEMENTATION",
    "FastleaseError",
    "LeaseMetrics",
    "LockLost",
    "LockNotAcquired",
    "LockReleaseError",
    "MemoryClient",
    "MemoryStore",
    "PostgresClient",
    "RedisClient",
    "SQLiteClient",
    "SyncDistributedLock",
    "distributed_lock",
]

from ._version import __version__ as __version__  # noqa: E402 - re-exported: the package's version


#: Public names loaded on first use: name -> the module that defines it (the store clients: from the
#: one list of backends; MemoryClient is imported above).
def _lazy_names() -> dict[str, str]:
    from .stores.registry import BACKENDS

    clients = {backend.client_name: backend.client.split(":")[0] for backend in BACKENDS.values()}
    return {"DistributedLock": "fastlease.aio", "Election": "fastlease.election", "AsyncElection": "fastlease.election",
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
