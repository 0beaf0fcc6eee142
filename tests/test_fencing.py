"""Fencing at the destination (``fastlease.fencing``): a holder paused past its lease is refused by what it
writes to, once its successor has written there, on SQLite, PostgreSQL and Redis destinations."""

from __future__ import annotations

import sqlite3

import pytest

from fastlease import LockLost, SyncDistributedLock
from fastlease.fencing import create_sql_fence_table, redis_fenced_write, sql_fence


def _paused_and_successor(make_client, store):
    """Holder A (paused: it has not noticed yet) and B, which took the key over after A's row went."""
    client = make_client()
    paused = SyncDistributedLock(client, table="locks", key="report").acquire()
    store.remove("locks", "report")  # as after A's lease ran out unrenewed: B's acquisition succeeds
    successor = SyncDistributedLock(make_client(), table="locks", key="report").acquire()
    assert successor.fencing_token > paused.fencing_token and paused.is_valid()
    return paused, successor


def _sqlite_destination(path):
    connection = sqlite3.connect(path, isolation_level=None)
    create_sql_fence_table(connection)
    connection.execute("CREATE TABLE report (id TEXT PRIMARY KEY, value TEXT)")
    return connection


def _write_report(connection, lease, value, begin="BEGIN IMMEDIATE"):
    """The caller's transaction: fence, then the write; rolled back if the fence refuses."""
    connection.execute(begin)
    try:
        sql_fence(connection, "report", lease)
        connection.execute("INSERT INTO report VALUES ('r', ?) ON CONFLICT (id) DO UPDATE SET value = excluded.value",
                           (value,))
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    connection.execute("COMMIT")


def test_sql_fence_on_sqlite_refuses_the_paused_holder_and_rolls_its_write_back(make_client, store, tmp_path):
    destination = _sqlite_destination(tmp_path / "reports.db")
    paused, successor = _paused_and_successor(make_client, store)
    _write_report(destination, paused, "from A, before B wrote")  # nothing newer yet: accepted
    _write_report(destination, successor, "from B")
    _write_report(destination, successor, "from B again")  # the same token, as often as needed
    with pytest.raises(LockLost, match=r"write to 'report' refused: a holder with a newer fencing token than 1"
                                       r" has written") as info:
        _write_report(destination, paused, "from A, after B")
    assert info.value.cause == "stolen" and info.value.key == "report"
    assert destination.execute("SELECT value FROM report").fetchall() == [("from B again",)]
    assert destination.execute("SELECT resource, token FROM fastlease_fences").fetchall() == [
        ("report", successor.fencing_token)]


def test_sql_fence_on_postgresql_refuses_the_paused_holder_in_its_own_transaction(make_client, store, postgres_db):
    import psycopg

    paused, successor = _paused_and_successor(make_client, store)
    with psycopg.connect(postgres_db, autocommit=True) as setup:
        create_sql_fence_table(setup)
        setup.execute("CREATE TABLE report (id TEXT PRIMARY KEY, value TEXT)")
    for lease, value in ((successor, "from B"), (paused, "from A, after B")):
        with psycopg.connect(postgres_db) as connection:
            try:
                with connection.transaction():
                    sql_fence(connection, "report", lease)
                    connection.execute("INSERT INTO report VALUES ('r', %s)", (value,))
            except LockLost as refused:
                assert lease is paused and refused.cause == "stolen"
            else:
                assert lease is successor
    with psycopg.connect(postgres_db) as connection:
        assert connection.execute("SELECT value FROM report").fetchall() == [("from B",)]
        assert connection.execute("SELECT token FROM fastlease_fences").fetchall() == [(successor.fencing_token,)]


def test_redis_fenced_write_refuses_the_paused_holder_and_writes_nothing(make_client, store, redis_db):
    paused, successor = _paused_and_successor(make_client, store)
    redis_fenced_write(redis_db, "report:output", {"value": "from A, before B wrote"}, paused)
    redis_fenced_write(redis_db, "report:output", {"value": "from B", "rows": 3}, successor)
    with pytest.raises(LockLost, match=r"write to Redis key 'report:output' refused") as info:
        redis_fenced_write(redis_db, "report:output", {"value": "from A, after B"}, paused)
    assert info.value.cause == "stolen"
    assert redis_db.hgetall("report:output") == {
        b"value": b"from B", b"rows": b"3", b"fence": str(successor.fencing_token).encode()}


def test_a_lease_known_lost_writes_nothing(make_client, store, tmp_path):
    destination = _sqlite_destination(tmp_path / "reports.db")
    lease = SyncDistributedLock(make_client(), table="locks", key="report").acquire()
    store.remove("locks", "report")
    with pytest.raises(LockLost):
        lease.release()  # it knows now
    with pytest.raises(LockLost, match="not_held|released|lost"):
        _write_report(destination, lease, "too late")
    assert destination.execute("SELECT count(*) FROM report").fetchone() == (0,)


def test_a_lease_without_a_fencing_token_is_refused_never_written_unfenced(fastlease_dynamodb_client, tmp_path):
    destination = _sqlite_destination(tmp_path / "reports.db")
    with SyncDistributedLock(fastlease_dynamodb_client, table="locks", key="report") as lease:
        assert lease.fencing_token is None  # protocol v1 rows keep none
        with pytest.raises(ValueError, match=r"lease on 'report' has no fencing token \(None\): its store keeps "
                                             r"none \(DynamoDB without fencing\): make the client with "
                                             r"DynamoDBClient\(fencing=True\)"):
            _write_report(destination, lease, "unfenced")
    assert destination.execute("SELECT count(*) FROM fastlease_fences").fetchone() == (0,)


def test_bad_arguments_are_refused_with_the_value(make_client, tmp_path):
    destination = _sqlite_destination(tmp_path / "reports.db")
    with SyncDistributedLock(make_client(), table="locks", key="k") as lease:
        with pytest.raises(ValueError, match=r"fence table must be a plain SQL identifier .* got 'x; DROP'"):
            sql_fence(destination, "report", lease, table="x; DROP")
        with pytest.raises(ValueError, match=r"resource must be a non-empty str .* got ''"):
            sql_fence(destination, "", lease)
        with pytest.raises(TypeError, match=r"sql_fence takes a sqlite3 or psycopg connection, got builtins.dict"):
            sql_fence({}, "report", lease)
        with pytest.raises(ValueError, match=r"fields must be a non-empty mapping without 'fence'"):
            redis_fenced_write(None, "k", {"fence": 1}, lease)


def test_dynamodb_fenced_put_refuses_the_paused_holder_and_writes_nothing(make_client, store, in_process_aws_session):
    from moto import mock_aws

    from fastlease.fencing import dynamodb_fenced_put

    paused, successor = _paused_and_successor(make_client, store)  # leases on one store, writes to another
    with mock_aws():
        dynamodb = in_process_aws_session.client("dynamodb")
        dynamodb.create_table(TableName="reports", BillingMode="PAY_PER_REQUEST",
                              KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
                              AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}])
        dynamodb_fenced_put(dynamodb, "reports", {"id": {"S": "r"}, "value": {"S": "from A, before B"}}, paused)
        dynamodb_fenced_put(dynamodb, "reports", {"id": {"S": "r"}, "value": {"S": "from B"}}, successor)
        with pytest.raises(LockLost, match=r"write to DynamoDB table 'reports' refused: a holder with a newer "
                                           r"fencing token than 1 has written") as info:
            dynamodb_fenced_put(dynamodb, "reports", {"id": {"S": "r"}, "value": {"S": "from A, after B"}}, paused)
        assert info.value.cause == "stolen"
        stored = dynamodb.get_item(TableName="reports", Key={"id": {"S": "r"}}, ConsistentRead=True)["Item"]
        assert stored == {"id": {"S": "r"}, "value": {"S": "from B"}, "fence": {"N": str(successor.fencing_token)}}
        with pytest.raises(ValueError, match=r"item must not carry 'fence'"):
            dynamodb_fenced_put(dynamodb, "reports", {"id": {"S": "r"}, "fence": {"N": "9"}}, successor)
