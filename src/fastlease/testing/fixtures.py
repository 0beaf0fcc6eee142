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


def _session_server(server: Any, unavailable: type[Exception], kind: str) -> Iterator[str]:
    """Start ``server`` and yield its address until the session ends, then stop it by its PID. Where it
    cannot start (``unavailable``), skip; under ``CI=true``, fail, so that CI never passes by skipping."""
    try:
        address: str = server.start()
    except unavailable as error:
        if _running_in_ci():
            pytest.fail(f"CI=true: the {kind} tests must run, but {error}")
        pytest.skip(str(error))
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
def fastlease_postgres_dsn() -> Iterator[str]:
    """``postgresql://postgres@127.0.0.1:<port>/postgres`` of a throwaway PostgreSQL cluster made for the
    session (``initdb`` in a temporary directory) and stopped by its postmaster's PID.

    Skips where PostgreSQL cannot start, except under ``CI=true``, where it fails."""
    from .postgres_server import PostgresServer, PostgresServerUnavailable

    yield from _session_server(PostgresServer(), PostgresServerUnavailable, "PostgreSQL")
