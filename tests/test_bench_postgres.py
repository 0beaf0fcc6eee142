"""bench/postgres_cycle.py counts round trips for real: from libpq's protocol trace of the connections,
one ReadyForQuery per request the client waited for, so a statement more or less shows in the count."""

from __future__ import annotations

import sys
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import postgres_cycle  # noqa: E402

from fastlease.postgres import PostgresClient  # noqa: E402


def counted(contender: postgres_cycle.Contender) -> float:
    for _ in range(10):  # warm-up: connections, and psycopg's prepare after its 5th execution
        contender.cycle()
    postgres_cycle.count_round_trips("under test", contender)
    return contender.round_trips


def test_the_advisory_pair_is_two_round_trips_and_a_third_statement_counts(postgres_db: str) -> None:
    with psycopg.connect(postgres_db, autocommit=True) as connection:
        assert counted(postgres_cycle.advisory_contender(connection)) == 2.0
        pair = postgres_cycle.advisory_contender(connection)

        def with_a_third_statement() -> None:
            pair.cycle()
            connection.execute("SELECT 1")

        assert counted(postgres_cycle.Contender(with_a_third_statement, lambda: [connection], lambda: None)) == 3.0


def test_a_fastlease_cycle_is_counted_on_the_client_own_connections(postgres_db: str) -> None:
    client = PostgresClient(postgres_db, _engine_module=postgres_cycle.compiled)
    try:
        client.create_lock_table(postgres_cycle.TABLE)
        assert counted(postgres_cycle.fastlease_contender(client, "counted")) == 2.0
    finally:
        client.close()
