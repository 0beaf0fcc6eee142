"""Fencing tokens on DynamoDB (``DynamoDBClient(fencing=True)``): the counter item, its condition, and what
pydynox's acquisitions and takeovers do to it. Against the serialised moto server, where each request is
atomic, and with pydynox 1.8.0 itself."""

from __future__ import annotations

import time

import pytest

from fastlease import LockNotAcquired, SyncDistributedLock
from fastlease.dynamodb import DynamoDBClient
from fastlease.exceptions import StoreError
from fastlease.idempotency import idempotent
from fastlease.stores.dynamodb.store import FENCE_KEY_PREFIX, fence_key
from fastlease.stores.dynamodb.transport import ServiceError
from fastlease.testing import NO_USAGE

pytestmark = pytest.mark.server

REGION = "us-east-1"


@pytest.fixture
def make_client(moto_endpoint, moto_session, core):
    clients = []

    def build(**kwargs):
        kwargs.setdefault("fencing", True)
        client = DynamoDBClient(session=moto_session, endpoint_url=moto_endpoint, _engine_module=core, **kwargs)
        clients.append(client)
        return client

    yield build
    for client in clients:
        client.close()


@pytest.fixture
def table(make_client, request):
    admin = make_client()
    name = f"fence_{request.node.name[:40].strip('_')}".replace("[", "_").replace("]", "")
    if admin.lock_table_exists(name):
        admin.boto3_client.delete_table(TableName=name)
    admin.create_lock_table(name)
    return name


def counter(client, table, key):
    item = client.boto3_client.get_item(TableName=table, Key={"key": {"S": fence_key(key)}},
                                        ConsistentRead=True).get("Item")
    return None if item is None else int(item["fence"]["N"])


def hold(client, table, key="k", **options):
    options.setdefault("lease_duration", 5.0)
    with SyncDistributedLock(client, table=table, key=key, **options) as lease:
        row = client.boto3_client.get_item(TableName=table, Key={"key": {"S": key}}, ConsistentRead=True)["Item"]
        assert row["fence"] == {"N": str(lease.fencing_token)}  # the row carries it, so reads see it
        assert counter(client, table, key) == lease.fencing_token
        return lease


def test_every_acquisition_gets_a_higher_token_in_one_request_and_the_counter_stays(make_client, table):
    client = make_client()
    leases = [hold(client, table) for _ in range(3)]
    tokens = [lease.fencing_token for lease in leases]
    assert all(type(token) is int for token in tokens) and tokens == sorted(set(tokens))
    # Still one write to acquire and one to release: the counter rides in the acquisition's transaction.
    assert [(lease.metrics.write_requests, lease.metrics.read_requests) for lease in leases] == [(2, 0)] * 3
    assert counter(client, table, "k") == tokens[-1]  # release deletes the row, not the counter
    assert [row["key"] for row in client.inspect(table)] == []  # counters are not listed as leases
    assert make_client(fencing=False).inspect(table, "k") == []


def test_a_counter_ahead_of_the_clock_costs_one_cancelled_write_and_the_token_still_rises(make_client, table):
    first = hold(make_client(), table).fencing_token
    ahead = first + 3_600 * 10**6  # as if a client an hour ahead had acquired last
    admin = make_client()
    admin.boto3_client.put_item(TableName=table, Item={"key": {"S": fence_key("k")}, "fence": {"N": str(ahead)}})
    fresh = make_client()  # has never seen the key: its guess is its clock, below the counter
    lease = hold(fresh, table, wait_timeout=0)  # one attempt is enough: the cancellation says the value
    assert lease.fencing_token == ahead + 1
    assert (lease.metrics.write_requests, lease.metrics.read_requests, lease.metrics.conditional_failures) == \
        (3, 1, 1)  # the cancelled put, the read that finds the key free, the put; then the release
    assert hold(fresh, table).fencing_token == ahead + 2  # remembered: no cancellation the next time
    assert hold(fresh, table).metrics.conditional_failures == 0


def test_tokens_rise_across_clients_and_a_held_key_keeps_its_token(make_client, table):
    one, two = make_client(), make_client()
    with SyncDistributedLock(one, table=table, key="k", lease_duration=5.0) as lease:
        with pytest.raises(LockNotAcquired):
            with SyncDistributedLock(two, table=table, key="k", lease_duration=5.0, wait_timeout=0):
                pass
        assert counter(one, table, "k") == lease.fencing_token  # the failed attempt raised nothing
        held = lease.fencing_token
    assert hold(two, table).fencing_token > held


def abandon(client, table, token):
    """The row a fenced holder that died leaves: its token in the row and in the counter."""
    client.boto3_client.put_item(TableName=table, Item={
        "key": {"S": "k"}, "owner": {"S": "dead-owner"}, "version": {"S": "dead-version"},
        "lease_ms": {"N": "500"}, "protocol": {"N": "1"}, "fence": {"N": str(token)}})


def test_a_takeover_of_an_abandoned_row_gets_a_higher_token(make_client, table):
    client = make_client()
    old = hold(client, table).fencing_token
    abandon(client, table, old)
    taker = hold(make_client(), table, lease_duration=0.5, wait_timeout=5.0)
    assert taker.fencing_token > old and taker.metrics.read_requests >= 1


def test_pydynox_acquisitions_leave_the_counter_alone_and_tokens_keep_rising(make_client, table, moto_endpoint):
    from pydynox import DynamoDBClient as PydynoxClient
    from pydynox.lock import SyncDistributedLock as PydynoxLock

    ours = make_client()
    before = hold(ours, table).fencing_token
    theirs = PydynoxClient(region=REGION, access_key="testing", secret_key="testing", endpoint_url=moto_endpoint)
    with PydynoxLock(theirs, table=table, key="k", lease_duration=5.0, wait_timeout=2):
        with pytest.raises(LockNotAcquired):  # the two still exclude each other
            hold(ours, table, wait_timeout=0)
    assert counter(ours, table, "k") == before  # pydynox's hold neither read nor raised it
    after = hold(make_client(), table).fencing_token  # a client that never saw the key
    assert after > before
    # pydynox reads, holds and releases a key whose counter exists and whose last row carried a token.
    with PydynoxLock(theirs, table=table, key="k", lease_duration=5.0, wait_timeout=2):
        pass


def test_pydynox_takes_over_a_fenced_row_and_fastlease_takes_its_row_back_higher(make_client, table, moto_endpoint):
    from pydynox import DynamoDBClient as PydynoxClient
    from pydynox.lock import SyncDistributedLock as PydynoxLock

    crashed = make_client()
    old = hold(crashed, table).fencing_token
    abandon(crashed, table, old)
    theirs = PydynoxClient(region=REGION, access_key="testing", secret_key="testing", endpoint_url=moto_endpoint)
    with PydynoxLock(theirs, table=table, key="k", lease_duration=0.5, wait_timeout=5):  # takes the row over
        row = crashed.boto3_client.get_item(TableName=table, Key={"key": {"S": "k"}}, ConsistentRead=True)["Item"]
        assert "fence" not in row  # pydynox's takeover writes a whole row of its own, without the token
    assert counter(crashed, table, "k") == old  # and leaves the counter as it was
    # A pydynox holder that died in turn: its row, with no token, taken over by a client that never saw it.
    crashed.boto3_client.put_item(TableName=table, Item={**row, "lease_ms": {"N": "500"}})
    taker = hold(make_client(), table, lease_duration=0.5, wait_timeout=5.0)
    assert taker.fencing_token > old


def test_an_idempotent_completion_deletes_the_counter_with_the_row(make_client):
    client = make_client()
    for name in ("fence_records", "fence_records_locks"):
        if client.lock_table_exists(name):
            client.boto3_client.delete_table(TableName=name)
    client.create_idempotency_table("fence_records")
    calls = []

    @idempotent(client, table="fence_records", key="order:{order_id}", lease_duration=5.0)
    def charge(order_id):
        calls.append(order_id)
        return {"charged": order_id}

    assert charge(order_id="7") == {"charged": "7"} == charge(order_id="7") and calls == ["7"]
    locks = client.boto3_client.scan(TableName="fence_records_locks", ConsistentRead=True)["Items"]
    assert locks == []  # neither the lease row nor its counter is left


def test_a_conflict_with_another_transaction_is_not_applied_and_retried(make_client, table, monkeypatch):
    client = make_client()
    store = client.store
    real_call = store.transport.call
    answers = iter([ServiceError("TransactionCanceledException", "Transaction cancelled [TransactionConflict, None]",
                                 400, [{"Code": "TransactionConflict"}, {"Code": "None"}])])

    def call(operation, params, timeout_s):
        if operation == "TransactWriteItems":
            answer = next(answers, None)
            if answer is not None:
                raise answer
        return real_call(operation, params, timeout_s)

    monkeypatch.setattr(store.transport, "call", call)
    with pytest.raises(StoreError) as info:
        store.put_if_absent(table, "k", "o1", "v1", 1000, 5.0, NO_USAGE)
    assert info.value.maybe_committed is False and counter(client, table, "k") is None
    lease = hold(client, table)  # the engine backs off and tries again
    assert lease.fencing_token > 0


def test_keys_beginning_with_nul_are_refused_everywhere(make_client, table):
    with pytest.raises(ValueError, match=r"lock key must not begin with NUL .* got '\\x00fence"):
        SyncDistributedLock(make_client(), table=table, key=fence_key("k"))
    assert fence_key("k").startswith(FENCE_KEY_PREFIX) and len(fence_key("x" * 2048)) == len(FENCE_KEY_PREFIX) + 64


def test_fencing_must_be_a_bool(make_client):
    with pytest.raises(TypeError, match=r"fencing must be True or False, got 'yes'"):
        make_client(fencing="yes")


def test_clock_guess_is_microseconds_now(make_client, table):
    before = time.time_ns() // 1000
    token = hold(make_client(), table).fencing_token
    assert before <= token <= time.time_ns() // 1000
