"""The pytest fixtures of ``pytest_plugins = ["fastlease.testing"]`` (``fastlease.testing`` re-exports them;
this module needs pytest, which the package imports only when it is installed)."""

from __future__ import annotations

import os
from typing import Any, Iterator

import pytest

from .clock import FakeClock


def _running_in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture
def fastlease_clock() -> FakeClock:
    """A :class:`FakeClock`: time moves only when the test (or a wait) moves it."""
    return FakeClock()


@pytest.fixture
def fastlease_memory_client(fastlease_clock: FakeClock) -> Iterator[Any]:
    """A ``MemoryClient`` on ``fastlease_clock``: renewals and takeovers happen as the test advances it."""
    from ..memory import MemoryClient

    client = MemoryClient(clock=fastlease_clock)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def fastlease_sqlite_client(tmp_path: Any) -> Iterator[Any]:
    """A ``SQLiteClient`` on ``tmp_path / "fastlease.sqlite3"`` (real clocks; other processes may open it)."""
    from ..sqlite import SQLiteClient

    client = SQLiteClient(tmp_path / "fastlease.sqlite3")
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def fastlease_dynamodb_table() -> str:
    """The lock table ``fastlease_dynamodb_client`` creates; override this fixture to choose another name."""
    return "locks"


@pytest.fixture
def fastlease_dynamodb_client(fastlease_dynamodb_table: str) -> Iterator[Any]:
    """A ``DynamoDBClient`` inside moto's in-process ``mock_aws`` with ``fastlease_dynamodb_table`` created.

    Every boto3 client the test makes while it runs also talks to the same mock. In-process moto does
    not make conditional writes atomic against concurrent threads: tests of races between processes
    need a moto server (``fastlease.testing.moto_server.MotoServer`` serialises its requests)."""
    import boto3
    from moto import mock_aws

    from ..dynamodb import DynamoDBClient

    with mock_aws():
        session = boto3.session.Session(
            aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
        )
        client = DynamoDBClient(session=session)
        client.create_lock_table(fastlease_dynamodb_table)
        try:
            yield client
        finally:
            client.close()


def start_or_skip(server: Any, unavailable: type[Exception], kind: str, **options: Any) -> str:
    """``server.start(**options)``, its address returned. Where it cannot start (``unavailable``), skip the
    test; under ``CI=true``, fail it, so that CI never passes by skipping."""
    try:
        address: str = server.start(**options)
    except unavailable as error:
        if _running_in_ci():
            pytest.fail(f"CI=true: the {kind} tests must run, but {error}")
        pytest.skip(str(error))
    return address


def _session_server(server: Any, unavailable: type[Exception], kind: str) -> Iterator[str]:
    """Start ``server`` (:func:`start_or_skip`) and yield its address until the session ends, then stop it
    by its PID."""
    address = start_or_skip(server, unavailable, kind)
    try:
        yield address
    finally:
        server.stop()


@pytest.fixture(scope="session")
def fastlease_redis_url() -> Iterator[str]:
    """``redis://127.0.0.1:<port>/0`` of a ``redis-server`` started for the session and stopped by its PID.

    Skips where ``redis-server`` cannot start, except under ``CI=true``, where it fails."""
    from .redis_server import RedisServer, RedisServerUnavailable

    yield from _session_server(RedisServer(), RedisServerUnavailable, "Redis")


@pytest.fixture(scope="session")
def fastlease_redis_cluster() -> Iterator[Any]:
    """A :class:`~fastlease.testing.redis_cluster.RedisClusterServer` (three primaries, no replicas, on free
    127.0.0.1 ports) started for the session, each node stopped by its PID at the end: for tests that
    need its nodes. Tests that migrate slots or kill nodes should start a cluster of their own.

    Skips where the cluster cannot start, except under ``CI=true``, where it fails."""
    from .redis_cluster import RedisClusterServer, RedisClusterUnavailable

    server = RedisClusterServer()
    start_or_skip(server, RedisClusterUnavailable, "Redis Cluster")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def fastlease_redis_cluster_url(fastlease_redis_cluster: Any) -> str:
    """``redis+cluster://127.0.0.1:<p1>,127.0.0.1:<p2>,127.0.0.1:<p3>`` of the session's
    ``fastlease_redis_cluster``.

    Skips where the cluster cannot start, except under ``CI=true``, where it fails."""
    url: str = fastlease_redis_cluster.url
    return url


@pytest.fixture(scope="session")
def fastlease_postgres_dsn() -> Iterator[str]:
    """``postgresql://postgres@127.0.0.1:<port>/postgres`` of a throwaway PostgreSQL cluster made for the
    session (``initdb`` in a temporary directory) and stopped by its postmaster's PID.

    Skips where PostgreSQL cannot start, except under ``CI=true``, where it fails."""
    from .postgres_server import PostgresServer, PostgresServerUnavailable

    yield from _session_server(PostgresServer(), PostgresServerUnavailable, "PostgreSQL")
