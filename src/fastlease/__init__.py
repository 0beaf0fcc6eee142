"""fastlease: distributed leases (locks) with background renewal, safe takeover and one engine
for every store.

``import fastlease`` needs no optional client library; store clients that need one import it lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._impl import IMPLEMENTATION
from .aio import DistributedLock
from .decorator import distributed_lock
from .exceptions import FastleaseError, LockLost, LockNotAcquired, LockReleaseError
from .lock import LeaseMetrics, SyncDistributedLock
from .stores.memory import MemoryClient, MemoryStore
from .stores.sqlite import SQLiteClient

if TYPE_CHECKING:  # type checkers see the lazily loaded clients (below) as the classes they are
    from .stores.dynamodb import DynamoDBClient
    from .stores.redis import RedisClient

__all__ = [
    "DistributedLock",
    "DynamoDBClient",
    "IMPLEMENTATION",
    "FastleaseError",
    "LeaseMetrics",
    "LockLost",
    "LockNotAcquired",
    "LockReleaseError",
    "MemoryClient",
    "MemoryStore",
    "RedisClient",
    "SQLiteClient",
    "SyncDistributedLock",
    "distributed_lock",
]

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # Store clients with optional dependencies load on first use, so `import fastlease` needs no extras.
    if name == "DynamoDBClient":
        from .stores.dynamodb import DynamoDBClient

        return DynamoDBClient
    if name == "RedisClient":
        from .stores.redis import RedisClient

        return RedisClient
    raise AttributeError(f"module 'fastlease' has no attribute {name!r}")
