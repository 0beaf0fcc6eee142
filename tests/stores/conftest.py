"""Fixtures of the PostgreSQL store's tests (``test_postgres.py``, ``test_postgres_feed.py``). psycopg is
imported in the fixtures: the wheel's server-free suite, which has no psycopg, still loads this file."""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

import pytest


@pytest.fixture
def admin(postgres_db: str) -> Iterator[Any]:
    """The test's own autocommit connection, for looking at the server from outside the store."""
    import psycopg

    with psycopg.connect(postgres_db, autocommit=True) as connection:
        yield connection


@pytest.fixture
def make_client(postgres_db: str) -> Iterator[Callable[..., Any]]:
    """PostgresClients on the test's database, each with its own application_name; closed after."""
    from psycopg.conninfo import make_conninfo

    from fastlease import PostgresClient

    clients: list[PostgresClient] = []

    def build(app: str = "fl-test", *, tables: tuple[str, ...] = (), user: Optional[str] = None,
              **kwargs: Any) -> PostgresClient:
        settings = {"application_name": app} if user is None else {"application_name": app, "user": user}
        client = PostgresClient(make_conninfo(postgres_db, **settings), **kwargs)
        clients.append(client)
        for table in tables:
            client.create_lock_table(table)
        return client

    yield build
    for client in clients:
        client.close()
