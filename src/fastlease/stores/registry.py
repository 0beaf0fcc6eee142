"""The one list of backends: for each kind of store, its adapter, the public client that wraps it, and
the optional library it needs with the extra that installs it.

The kind is the name a store gives itself: the first field of its ``renewal_config()`` (how the
renewal process knows which store to rebuild) and, for the kinds the command line offers, the value
of ``--store``. Nothing is imported here: the adapter and the client are named, and loaded only by
``store_class`` (the renewal process) or by the layers above, so that this module costs nothing.
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing is not imported at run time: see _typing.py
if TYPE_CHECKING:
    from typing import Any, Optional


class Backend:
    """One kind of store. ``library``: (the module to import, its name for people, the pip extra), or
    None when the standard library is enough."""

    __slots__ = ("kind", "store", "client", "library", "command_line")

    def __init__(self, kind: str, store: str, client: str, library: Optional[tuple[str, str, str]],
                 command_line: bool = True) -> None:
        self.kind = kind
        self.store = store  # "module:Class" of the adapter
        self.client = client  # "module:Class" of the public client
        self.library = library
        self.command_line = command_line  # a value of the CLI's --store

    @property
    def client_name(self) -> str:
        """The public client's class name, as ``fastlease`` exports it."""
        return self.client.split(":")[1]

    def __repr__(self) -> str:
        return f"Backend({self.kind!r})"


_REDIS = ("redis", "redis-py", "redis")

#: Every backend, in the order the command line lists them.
BACKENDS: dict[str, Backend] = {backend.kind: backend for backend in (
    Backend("sqlite", "fastlease.stores.sqlite:SQLiteStore", "fastlease.sqlite:SQLiteClient", None),
    Backend("dynamodb", "fastlease.stores.dynamodb.store:DynamoDBStore", "fastlease.dynamodb:DynamoDBClient",
            ("boto3", "boto3", "dynamodb")),
    Backend("redis", "fastlease.stores.redis.store:RedisStore", "fastlease.redis:RedisClient", _REDIS),
    # A Redis Cluster is reached through RedisClient and --store redis (a redis+cluster:// URL).
    Backend("redis-cluster", "fastlease.stores.redis.cluster:RedisClusterStore", "fastlease.redis:RedisClient",
            _REDIS, command_line=False),
    Backend("postgres", "fastlease.stores.postgres.store:PostgresStore", "fastlease.postgres:PostgresClient",
            ("psycopg", "psycopg 3", "postgres")),
    Backend("memory", "fastlease.stores.memory:MemoryStore", "fastlease.memory:MemoryClient", None),
)}


def backend(kind: str) -> Backend:
    """The backend of ``kind``; ValueError naming the kinds there are."""
    found = BACKENDS.get(kind)
    if found is None:
        raise ValueError(f"unknown store kind {kind!r}; the kinds are {', '.join(BACKENDS)}")
    return found


def load(target: str) -> Any:
    """The object that ``"module:Name"`` names, importing its module."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def store_class(kind: str) -> Any:
    """The adapter class of ``kind`` (imported now)."""
    return load(backend(kind).store)
