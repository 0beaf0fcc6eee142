"""Test helpers: a deterministic :class:`FakeClock`, a :class:`FaultInjector` for MemoryStore, pytest
fixtures for code that uses fastlease, and four test servers in child processes.

``FakeClock`` replaces both clocks of a client (``MemoryClient(clock=FakeClock())``). Waiting on it
moves time instead of sleeping, and moving time runs every renewal that falls due on the way, in
order, in the calling thread, so tests of takeover and renewal are exact and instant.

The fixtures load with ``pytest_plugins = ["fastlease.testing"]`` in a ``conftest.py``:

- ``fastlease_clock``: a :class:`FakeClock`;
- ``fastlease_memory_client``: a ``MemoryClient`` on that clock (closed after the test);
- ``fastlease_sqlite_client``: a ``SQLiteClient`` on a file in the test's ``tmp_path``;
- ``fastlease_dynamodb_table``: the lock table name the DynamoDB fixture creates (override it to choose);
- ``fastlease_dynamodb_client``: a ``DynamoDBClient`` inside moto's in-process ``mock_aws`` (fake
  credentials, ``us-east-1``), its lock table created (needs ``boto3`` and ``moto``);
- ``fastlease_redis_url``: one ``redis-server`` per session on a free 127.0.0.1 port, no persistence,
  stopped by its PID. Where ``redis-server`` is not installed the tests that use it skip, except when
  the environment has ``CI=true``: a CI run fails instead, so it can never pass by skipping them;
- ``fastlease_redis_cluster``: one three-node Redis Cluster per session (a ``RedisClusterServer``: primaries
  without replicas on free 127.0.0.1 ports, no persistence), each node stopped by its PID; it skips, or
  fails under ``CI=true``, as the Redis one does; ``fastlease_redis_cluster_url`` is its
  ``redis+cluster://`` URL;
- ``fastlease_postgres_dsn``: one throwaway PostgreSQL cluster per session (``initdb`` in a temporary
  directory, the server on a free 127.0.0.1 port, the role ``postgres`` trusted), stopped by its PID;
  it skips, or fails under ``CI=true``, as the Redis one does.

The modules, by job: ``clock`` (FakeClock), ``faults`` (FaultInjector), ``fixtures`` (the pytest
fixtures), ``moto_server`` (``MotoServer``, a moto server that serialises its requests),
``redis_server`` (``RedisServer``, a throwaway ``redis-server``), ``redis_cluster``
(``RedisClusterServer``, a throwaway Redis Cluster, with slot migrations and node faults; what its nodes
say about slots is read in ``_cluster_slots``) and ``postgres_server``
(``PostgresServer``, a throwaway PostgreSQL cluster), all started by the one launcher in ``_process``,
which also stops them when the test process dies.

Importing this package imports pytest only when pytest is installed, and no server module: they
are imported where they are used.
"""

from __future__ import annotations

from ..stores.base import NO_USAGE  # re-exported for tests that call store operations directly
from .clock import FakeClock
from .faults import FAULTS, FaultInjector

__all__ = [
    "FakeClock",
    "FaultInjector",
    "FAULTS",
    "NO_USAGE",
    "fastlease_clock",
    "fastlease_dynamodb_client",
    "fastlease_dynamodb_table",
    "fastlease_memory_client",
    "fastlease_postgres_dsn",
    "fastlease_redis_cluster",
    "fastlease_redis_cluster_url",
    "fastlease_redis_url",
    "fastlease_sqlite_client",
]

try:
    # Module attributes, so that pytest finds them when it loads this package as a plugin.
    from .fixtures import (
        fastlease_clock,
        fastlease_dynamodb_client,
        fastlease_dynamodb_table,
        fastlease_memory_client,
        fastlease_postgres_dsn,
        fastlease_redis_cluster,
        fastlease_redis_cluster_url,
        fastlease_redis_url,
        fastlease_sqlite_client,
    )
except ModuleNotFoundError as error:  # the helpers above work without pytest; the fixtures need it
    if error.name != "pytest":
        raise
