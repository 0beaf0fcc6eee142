"""The store contract (``fastlease.stores.base.LockStore``): the one suite every store passes.

Each store adapter is a set of single atomic operations; these tests pin down exactly what each one
does, so the engine can rely on them. Later stores join by adding a factory to ``STORES``.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator

import pytest

from fastlease.stores.base import DELETED, DELETED_WITH_WAITERS, NOT_DELETED, LockRow
from fastlease.stores.memory import MemoryStore
from fastlease.testing import NO_USAGE

USAGE = NO_USAGE
T = 5.0  # request timeout passed to every operation
#: The idempotency record table: made by the factory where a store needs its tables made.
RECORDS = "records"


@contextlib.contextmanager
def memory_store() -> Iterator[Any]:
    yield MemoryStore()


@contextlib.contextmanager
def dynamodb_mock_store(request: pytest.FixtureRequest, fencing: bool = False) -> Iterator[Any]:
    """DynamoDB through boto3 under moto's in-process mock_aws."""
    from moto import mock_aws

    from fastlease.dynamodb import DynamoDBClient

    with mock_aws():
        client = DynamoDBClient(session=request.getfixturevalue("in_process_aws_session"), fencing=fencing)
        assert client.transport == "fast"  # answered in-process through before-send
        for table in ("locks", "other"):
            client.create_lock_table(table)
        client.create_idempotency_table(RECORDS)
        try:
            yield client.store
        finally:
            client.close()


@contextlib.contextmanager
def dynamodb_server_store(request: pytest.FixtureRequest, fast_path: bool = True,
                          fencing: bool = False) -> Iterator[Any]:
    """DynamoDB against the serialised moto server in another process."""
    from fastlease.dynamodb import DynamoDBClient

    endpoint = request.getfixturevalue("moto_endpoint")
    client = DynamoDBClient(session=request.getfixturevalue("moto_session"), endpoint_url=endpoint,
                            fast_path=fast_path, fencing=fencing)
    assert client.transport == ("fast" if fast_path else "boto3")
    for table in ("locks", "other", RECORDS):
        if client.lock_table_exists(table):
            client.boto3_client.delete_table(TableName=table)
    for table in ("locks", "other"):
        client.create_lock_table(table)
    client.create_idempotency_table(RECORDS)
    try:
        yield client.store
    finally:
        client.close()


@contextlib.contextmanager
def sqlite_store(request: pytest.FixtureRequest) -> Iterator[Any]:
    from fastlease.stores.sqlite import SQLiteStore

    store = SQLiteStore(request.getfixturevalue("tmp_path") / "locks.db")
    try:
        yield store
    finally:
        store.close()


@contextlib.contextmanager
def redis_store(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A real redis-server, started by the test session."""
    from fastlease.redis import RedisClient

    request.getfixturevalue("redis_db")  # empties the database
    client = RedisClient(request.getfixturevalue("redis_url"))
    try:
        yield client.store
    finally:
        client.close()


@contextlib.contextmanager
def redis_own_connection_store(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The store the renewal process builds from a client's settings: the same scripts on our own RESP
    connection (``stores/redis/wire.py``) instead of redis-py's."""
    from fastlease.redis import RedisClient
    from fastlease.stores.redis.store import RedisStore

    request.getfixturevalue("redis_db")
    client = RedisClient(request.getfixturevalue("redis_url"))
    store = RedisStore.from_renewal_config(client.store.renewal_config())
    assert store.connection_kwargs and type(store.new_connection()).__module__ == "fastlease.stores.redis.wire"
    try:
        yield store
    finally:
        store.close()
        client.close()


@contextlib.contextmanager
def redis_cluster_store(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The session's three-node Redis Cluster, every primary emptied."""
    from fastlease.redis import RedisClient

    request.getfixturevalue("redis_cluster_db")
    client = RedisClient(request.getfixturevalue("redis_cluster_url"))
    try:
        yield client.store
    finally:
        client.close()


@contextlib.contextmanager
def redis_cluster_own_connection_store(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The store the renewal process builds from a cluster client's settings: its routing on our own
    RESP connections (MOVED and ASK read from the reply's text), without redis-py."""
    from fastlease.redis import RedisClient
    from fastlease.stores.redis.cluster import RedisClusterStore

    request.getfixturevalue("redis_cluster_db")
    client = RedisClient(request.getfixturevalue("redis_cluster_url"))
    store = RedisClusterStore.from_renewal_config(client.store.renewal_config())
    assert type(store.new_connection()).__module__ == "fastlease.stores.redis.wire" and store.release_feed is None
    try:
        yield store
    finally:
        store.close()
        client.close()


@contextlib.contextmanager
def postgres_store(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A real PostgreSQL server, started by the test session; the tables made by create_lock_table in an
    emptied schema."""
    from fastlease.postgres import PostgresClient

    client = PostgresClient(request.getfixturevalue("postgres_db"))
    for table in ("locks", "other"):
        client.create_lock_table(table)
    client.create_idempotency_table(RECORDS)
    try:
        yield client.store
    finally:
        client.close()


#: Every store joins the suite here: a factory that yields a store with fresh lock tables "locks" and "other"
#: and the record table RECORDS.
STORES: dict[str, Callable[[pytest.FixtureRequest], Any]] = {
    "memory": lambda request: memory_store(),
    "dynamodb-mock": dynamodb_mock_store,
    "dynamodb-server": dynamodb_server_store,
    "dynamodb-server-boto3": lambda request: dynamodb_server_store(request, fast_path=False),
    "dynamodb-fencing-mock": lambda request: dynamodb_mock_store(request, fencing=True),
    "dynamodb-fencing-server": lambda request: dynamodb_server_store(request, fencing=True),
    "sqlite": sqlite_store,
    "redis": redis_store,
    "redis-own-connection": redis_own_connection_store,
    "redis-cluster": redis_cluster_store,
    "redis-cluster-own-connection": redis_cluster_own_connection_store,
    "postgres": postgres_store,
}
#: In-process moto (mock_aws) does not make a conditional write atomic against concurrent threads
#: (moto's limitation, not the adapter's), so the race test runs where the store itself is atomic.
ATOMIC_STORES = sorted(set(STORES) - {"dynamodb-mock", "dynamodb-fencing-mock"})
#: Stores that need a server process: their cases are marked ``server`` (the wheel tests deselect them).
SERVER_STORES = {"dynamodb-server", "dynamodb-server-boto3", "dynamodb-fencing-server",
                 "redis", "redis-own-connection", "redis-cluster", "redis-cluster-own-connection",
                 "postgres"}
#: Stores whose keys cannot hold NUL (PostgreSQL's text type): they refuse such a key with ValueError,
#: before any request, rather than store something else.
NUL_REFUSING_STORES = {"postgres"}


def store_params(names: list[str]) -> list[Any]:
    return [pytest.param(name, marks=pytest.mark.server) if name in SERVER_STORES else name for name in names]


@pytest.fixture(params=store_params(sorted(STORES)))
def store(request: pytest.FixtureRequest) -> Iterator[Any]:
    with STORES[request.param](request) as opened:
        yield opened


@pytest.fixture(params=store_params(ATOMIC_STORES))
def atomic_store(request: pytest.FixtureRequest) -> Iterator[Any]:
    with STORES[request.param](request) as opened:
        yield opened


def put(
    store: Any, key: str = "k", owner: str = "o1", version: str = "v1", lease_ms: int = 30_000, table: str = "locks"
) -> bool:
    return store.put_if_absent(table, key, owner, version, lease_ms, T, USAGE) is not None


def read(store: Any, key: str = "k", table: str = "locks") -> Any:
    """The row, its fencing token left out (stores differ there: see the fencing test)."""
    row = store.read(table, key, T, USAGE)
    return None if row is None else row._replace(fence=None)


def test_read_of_an_absent_key_is_none(store):
    assert read(store) is None


def test_put_if_absent_creates_a_protocol_1_row_with_exact_types(store):
    token = store.put_if_absent("locks", "k", "o1", "v1", 30_000, T, USAGE)
    assert type(token) is int and token >= 0  # the fencing token, or 0 on a store that keeps none
    row = read(store)
    assert row == LockRow("o1", "v1", 30_000, 1)
    assert [type(value) for value in row[:5]] == [str, str, int, int, bool]


def test_put_if_absent_never_overwrites(store):
    assert put(store) is True
    assert put(store, owner="o2", version="v2", lease_ms=100) is False
    assert read(store) == LockRow("o1", "v1", 30_000, 1)


def test_replace_if_needs_the_exact_owner_and_version(store):
    assert store.replace_if("locks", "k", "o1", "v1", "o2", "v2", 1000, T, USAGE) is None  # absent
    put(store)
    assert store.replace_if("locks", "k", "o1", "vX", "o2", "v2", 1000, T, USAGE) is None
    assert store.replace_if("locks", "k", "oX", "v1", "o2", "v2", 1000, T, USAGE) is None
    assert read(store) == LockRow("o1", "v1", 30_000, 1)
    token = store.replace_if("locks", "k", "o1", "v1", "o2", "v2", 1000, T, USAGE)
    assert type(token) is int and token >= 0  # the new fencing token, or 0 on a store that keeps none
    assert read(store) == LockRow("o2", "v2", 1000, 1)  # the whole row, with the new lease


def test_update_version_if_changes_only_the_version(store):
    assert store.update_version_if("locks", "k", "o1", "v1", "v2", T, USAGE) is False  # absent
    put(store, lease_ms=12_345)
    assert store.update_version_if("locks", "k", "o1", "vX", "v2", T, USAGE) is False
    assert store.update_version_if("locks", "k", "oX", "v1", "v2", T, USAGE) is False
    assert store.update_version_if("locks", "k", "o1", "v1", "v2", T, USAGE) is True
    assert read(store) == LockRow("o1", "v2", 12_345, 1)
    assert store.update_version_if("locks", "k", "o1", "v1", "v3", T, USAGE) is False  # old version


def test_delete_if_owner_matches_owner_only_and_says_what_it_deleted(store):
    assert store.delete_if_owner("locks", "k", "o1", T, USAGE) == NOT_DELETED  # absent
    put(store)
    store.update_version_if("locks", "k", "o1", "v1", "v2", T, USAGE)
    assert store.delete_if_owner("locks", "k", "oX", T, USAGE) == NOT_DELETED
    assert read(store) is not None
    deleted = store.delete_if_owner("locks", "k", "o1", T, USAGE)  # whatever the version
    assert type(deleted) is int and deleted == DELETED  # no waiting hint on the row
    assert read(store) is None
    assert store.delete_if_owner("locks", "k", "o1", T, USAGE) == NOT_DELETED


def test_mark_waiting_sets_only_the_hint_once_for_the_exact_owner_and_version(store):
    assert store.mark_waiting("locks", "k", "o1", "v1", T, USAGE) is False  # absent: nothing created
    assert read(store) is None
    put(store, lease_ms=12_345)
    assert store.mark_waiting("locks", "k", "o1", "vX", T, USAGE) is False
    assert store.mark_waiting("locks", "k", "oX", "v1", T, USAGE) is False
    assert read(store).waiting is False
    assert store.mark_waiting("locks", "k", "o1", "v1", T, USAGE) is True
    assert read(store) == LockRow("o1", "v1", 12_345, 1, True)  # observations of (owner, version) hold
    assert store.mark_waiting("locks", "k", "o1", "v1", T, USAGE) is False  # once per hold
    # Renewal keeps the mark; release hands it back to the holder.
    assert store.update_version_if("locks", "k", "o1", "v1", "v2", T, USAGE) is True
    assert read(store) == LockRow("o1", "v2", 12_345, 1, True)
    assert store.delete_if_owner("locks", "k", "o1", T, USAGE) == DELETED_WITH_WAITERS
    # A takeover writes a fresh row without it.
    put(store, owner="o3", version="v3")
    store.mark_waiting("locks", "k", "o3", "v3", T, USAGE)
    assert store.replace_if("locks", "k", "o3", "v3", "o4", "v4", 1000, T, USAGE) is not None
    assert read(store) == LockRow("o4", "v4", 1000, 1, False)


def test_fencing_tokens_strictly_increase_and_survive_release_or_are_absent(store):
    tokens = [store.put_if_absent("locks", "k", "o1", "v1", 1000, T, USAGE)]
    assert store.update_version_if("locks", "k", "o1", "v1", "v2", T, USAGE) is True  # renewal: no new token
    tokens.append(store.read("locks", "k", T, USAGE).fence)
    tokens.append(store.replace_if("locks", "k", "o1", "v2", "o2", "v3", 1000, T, USAGE))  # takeover
    tokens.append(store.read("locks", "k", T, USAGE).fence)
    assert store.delete_if_owner("locks", "k", "o2", T, USAGE) == DELETED
    tokens.append(store.put_if_absent("locks", "k", "o3", "v4", 1000, T, USAGE))  # after release
    tokens.append(store.put_if_absent("locks", "other", "o4", "v5", 1000, T, USAGE))  # another key
    if tokens[0] == 0:  # a store without fencing (DynamoDB protocol v1): 0, and rows carry None
        assert tokens == [0, None, 0, None, 0, 0]
    elif getattr(store, "fencing", False):  # DynamoDB's counter item: increasing, not dense (protocol.md)
        assert [type(token) for token in tokens] == [int] * 6
        assert tokens[0] == tokens[1] < tokens[2] == tokens[3] < tokens[4]
    else:
        assert [type(token) for token in tokens] == [int] * 6
        assert tokens == [1, 1, 2, 2, 3, 1]


@pytest.mark.parametrize("key", [
    "a", "a ", "A", "é", "{k}", "k'\"\n;--", "x" * 2048, "日本:🙂",
    # Shaped like injections into each store's language: stored and matched literally, or refused.
    "#owner = :owner OR attribute_exists(#key)", "x'); DROP TABLE fastlease_lock_locks; --",
    "]] .. redis.call('FLUSHALL') .. [[", "%s%n%x${jndi:ldap://127.0.0.1/a}", "\x00\x01\r\n*1\r\n$4\r\nPING\r\n",
])
def test_keys_and_tables_are_isolated_and_exact(store, key, request):
    if "\x00" in key and request.node.callspec.params["store"] in NUL_REFUSING_STORES:
        for operation in (lambda: put(store, key=key, owner="mine"), lambda: read(store, key=key)):
            with pytest.raises(ValueError, match=r"NUL"):
                operation()
        return
    assert put(store, key=key, owner="mine") is True
    assert put(store, key=key, table="other", owner="theirs") is True
    assert read(store, key=key).owner == "mine"
    assert read(store, key=key, table="other").owner == "theirs"
    neighbours = {"a", "a ", "A"} - {key}
    assert all(read(store, key=other) is None for other in neighbours)


def test_concurrent_puts_have_exactly_one_winner(atomic_store):
    store = atomic_store
    rounds, threads = 200, 8
    wins = [[0] * threads for _ in range(rounds)]
    barrier = threading.Barrier(threads)

    def contend(index: int) -> None:
        for r in range(rounds):
            barrier.wait(10)
            wins[r][index] = put(store, key=f"race-{r}", owner=f"o{index}")

    workers = [threading.Thread(target=contend, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert not any(worker.is_alive() for worker in workers)
    assert [sum(row) for row in wins] == [1] * rounds
    for r in range(rounds):
        winner = wins[r].index(True)
        assert read(store, key=f"race-{r}").owner == f"o{winner}"


def test_every_request_of_a_networked_or_file_store_is_logged_at_debug_without_data(store, caplog):
    # Style: one DEBUG line per request (operation, key, outcome). The in-memory store sends no request.
    import logging

    from fastlease.stores.base import Record

    caplog.set_level(logging.DEBUG, logger="fastlease.stores")
    put(store, key="logged-key")
    read(store, key="logged-key")
    finish = getattr(store, "finish_if_owner", None)
    if finish is not None:  # the idempotency record's data must never reach a log line
        finish("locks", "logged-key", RECORDS, Record("COMPLETED", "f", b"private-result-bytes", 0, "o1"), 0, T)
    lines = [record.getMessage() for record in caplog.records
             if record.name.startswith("fastlease.stores.") and record.levelno == logging.DEBUG]
    if isinstance(store, MemoryStore):
        assert lines == []  # in-process dict operations, not requests: documented as not logged
        return
    about_the_key = [line for line in lines if "'logged-key'" in line]
    assert len(about_the_key) >= (3 if finish is not None else 2), lines
    assert all(" -> " in line for line in about_the_key), about_the_key
    assert not [line for line in lines if "private-result-bytes" in line]
