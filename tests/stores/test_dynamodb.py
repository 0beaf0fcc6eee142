"""DynamoDB store under moto's in-process ``mock_aws``: rows, parsing, errors, tables, transactions."""

from __future__ import annotations

import subprocess
import sys

import boto3
import pytest
from botocore.config import Config
from moto import mock_aws

from fastlease import LockLost, LockNotAcquired, SyncDistributedLock, distributed_lock
from fastlease.dynamodb import DynamoDBClient, SyncTransaction, TransactionCanceled
from fastlease.exceptions import MalformedLockRow, StoreError, StoreRequestRejected
from fastlease.stores.dynamodb.store import DynamoDBStore
from fastlease.stores.dynamodb.transport import TIMEOUT_BUCKETS_S, ServiceError
from fastlease.stores.dynamodb.transport import timeout_bucket as _bucket
from fastlease.testing import NO_USAGE, FakeClock

REGION = "us-east-1"


@pytest.fixture
def aws(in_process_aws_session):
    with mock_aws():
        yield in_process_aws_session


@pytest.fixture(params=["fast", "boto3"])
def transport(request):
    return request.param


@pytest.fixture
def make_dynamodb(aws, core, transport):
    clients = []

    def build(**kwargs):
        kwargs.setdefault("session", aws)
        kwargs.setdefault("fast_path", transport == "fast")
        client = DynamoDBClient(_engine_module=core, **kwargs)
        assert client.transport == transport
        clients.append(client)
        return client

    yield build
    for client in clients:
        client.close()


@pytest.fixture
def ddb(make_dynamodb):
    client = make_dynamodb()
    client.create_lock_table("locks")
    return client


def raw_item(client, key="k", table="locks"):
    return client.boto3_client.get_item(TableName=table, Key={"key": {"S": key}}, ConsistentRead=True).get("Item")


def test_a_hold_writes_a_protocol_1_row_and_costs_two_writes(ddb):
    with SyncDistributedLock(ddb, table="locks", key="import:daily") as lease:
        item = raw_item(ddb, "import:daily")
        assert set(item) == {"key", "owner", "version", "lease_ms", "protocol"}
        assert item["owner"] == {"S": lease.owner}
        assert item["lease_ms"] == {"N": "30000"} and item["protocol"] == {"N": "1"}
        assert "S" in item["version"]
    metrics = lease.metrics
    assert (metrics.write_requests, metrics.read_requests) == (2, 0)
    assert metrics.consumed_wcu == 2.0 and metrics.consumed_rcu == 0.0
    assert lease.fencing_token is None  # protocol v1 keeps no fencing token
    assert raw_item(ddb, "import:daily") is None


@pytest.mark.parametrize(
    "item",
    [
        {"owner": {"S": "o"}, "version": {"S": "v"}, "lease_ms": {"N": "10000"}, "protocol": {"N": "2"}},
        {"owner": {"S": "o"}, "version": {"S": "v"}, "lease_ms": {"S": "10000"}, "protocol": {"N": "1"}},
        {"owner": {"S": "o"}, "version": {"S": "v"}, "lease_ms": {"N": "10000.5"}, "protocol": {"N": "1"}},
        {"owner": {"S": "o"}, "version": {"S": "v"}, "lease_ms": {"N": "50"}, "protocol": {"N": "1"}},
        {"owner": {"S": "o"}, "version": {"S": "v"}, "lease_ms": {"N": "10000"}},
        {"owner": {"N": "1"}, "version": {"S": "v"}, "lease_ms": {"N": "10000"}, "protocol": {"N": "1"}},
        {"version": {"S": "v"}, "lease_ms": {"N": "10000"}, "protocol": {"N": "1"}},
        {"owner": {"S": "o"}, "version": {"S": "v"}, "lease_ms": {"N": "10000"}, "protocol": {"S": "1"}},
        {"owner": {"S": "o"}, "version": {"S": "v"}, "lease_ms": {"N": "10000"}, "protocol": {"N": "1"},
         "waiting": {"S": "true"}},
    ],
)
def test_malformed_rows_fail_closed_and_are_never_taken_over(make_dynamodb, item):
    clock = FakeClock()
    client = make_dynamodb(clock=clock)
    client.create_lock_table("locks")
    stored = {"key": {"S": "k"}, **item}
    client.boto3_client.put_item(TableName="locks", Item=stored)
    with pytest.raises(MalformedLockRow):
        with SyncDistributedLock(client, table="locks", key="k", wait_timeout=60):
            pass
    clock.advance(3600)
    with pytest.raises(MalformedLockRow):
        with SyncDistributedLock(client, table="locks", key="k", wait_timeout=0):
            pass
    assert raw_item(client) == stored


def test_a_missing_table_fails_at_once_and_is_never_created(make_dynamodb):
    clock = FakeClock()
    client = make_dynamodb(clock=clock)
    before = clock.monotonic_ns()
    with pytest.raises(StoreRequestRejected, match="ResourceNotFoundException") as info:
        with SyncDistributedLock(client, table="no_such_table", key="k", wait_timeout=30):
            pass
    assert clock.monotonic_ns() == before  # no waiting: retrying cannot create a table
    assert info.value.key == "k"
    assert client.lock_table_exists("no_such_table") is False
    # The table is named, and how to create it: with idempotency, two tables could be missing.
    assert "table 'no_such_table' does not exist" in str(info.value)
    assert "create_lock_table" in str(info.value) and "create_idempotency_table" in str(info.value)


def test_a_missing_record_table_is_named_in_an_idempotent_call(make_dynamodb):
    from fastlease.idempotency import IdempotentCall

    client = make_dynamodb()
    client.create_lock_table("payments_locks")
    with pytest.raises(StoreRequestRejected, match="table 'payments' does not exist"):
        with IdempotentCall(client, table="payments", key="k") as call:
            call.complete("done")


def test_one_call_creates_both_tables_an_idempotent_call_needs(make_dynamodb):
    from fastlease.idempotency import IdempotentCall

    client = make_dynamodb()
    client.create_idempotency_table("payments")
    assert client.lock_table_exists("payments_locks")
    with IdempotentCall(client, table="payments", key="p-1") as call:
        call.complete("paid")
    client.create_idempotency_table("orders", lock_table="order_leases")
    assert client.lock_table_exists("order_leases") and not client.lock_table_exists("orders_locks")
    with pytest.raises(ValueError, match="must differ"):
        client.create_idempotency_table("same", lock_table="same")
    assert not client.lock_table_exists("same")


def test_inspecting_a_missing_table_names_it_and_how_to_create_it(make_dynamodb):
    client = make_dynamodb()
    for read in (lambda: client.inspect("no_such_table"), lambda: client.inspect("no_such_table", "k"),
                 lambda: client.holder("no_such_table", "k")):
        with pytest.raises(StoreRequestRejected) as info:
            read()
        assert "table 'no_such_table' does not exist" in str(info.value)
        assert "create_lock_table" in str(info.value)


def test_creating_tables_again_succeeds_and_a_different_schema_is_refused(make_dynamodb):
    # A deployment script (and the README's quick start) run twice: the tables exist already.
    client = make_dynamodb()
    for _ in range(2):
        client.create_lock_table("locks")
        client.create_idempotency_table("records")
        client.sync_create_table("orders", ("pk", "S"), ("sk", "N"))
    ttl = client.boto3_client.describe_time_to_live(TableName="records")["TimeToLiveDescription"]
    assert ttl["AttributeName"] == "expires_at"
    with pytest.raises(StoreRequestRejected) as info:
        client.create_lock_table("orders")
    assert str(info.value) == (
        "DynamoDB table 'orders' already exists with key schema pk (S, partition key) + sk (N, sort key), "
        "not key (S, partition key): use another table name, or delete that table first")
    with pytest.raises(StoreRequestRejected, match="with key schema pk \\(S, partition key\\) \\+ sk"):
        client.sync_create_table("orders", ("pk", "S"), ("sk", "S"))
    client.boto3_client.update_time_to_live(
        TableName="locks", TimeToLiveSpecification={"Enabled": True, "AttributeName": "gone_at"})
    with pytest.raises(StoreRequestRejected, match="has TTL on 'gone_at'"):
        client.create_idempotency_table("locks")


@pytest.mark.parametrize("missing", ["region", "credentials"])
def test_a_client_without_region_or_credentials_says_what_to_set(monkeypatch, tmp_path, missing):
    from fastlease.exceptions import StoreConfigurationError

    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                 "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                 "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))  # nothing configured
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance metadata request from a test
    if missing == "credentials":
        monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    with pytest.raises(StoreConfigurationError) as info:
        DynamoDBClient()
    assert isinstance(info.value, StoreRequestRejected)  # what store misconfiguration raised before
    if missing == "region":
        # The advice names only what boto3 reads (it ignores AWS_REGION), and following it works.
        assert "needs an AWS Region" in str(info.value) and "set AWS_DEFAULT_REGION" in str(info.value)
        assert "AWS_REGION" not in str(info.value)
        monkeypatch.setenv("AWS_REGION", REGION)
        with pytest.raises(StoreConfigurationError, match="needs an AWS Region"):
            DynamoDBClient()
        monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
        with pytest.raises(StoreConfigurationError, match="found no AWS credentials"):  # the Region is found
            DynamoDBClient()
    else:
        assert "found no AWS credentials" in str(info.value) and "AWS_ACCESS_KEY_ID" in str(info.value)
    with pytest.raises(StoreConfigurationError):  # the same for a boto3 client made without them
        DynamoDBClient(boto3.client("dynamodb", region_name=REGION))


def test_pydynox_constructor_arguments_build_the_same_client(monkeypatch, moto_endpoint):
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    # pydynox 1.8.0: DynamoDBClient(region=..., endpoint_url=..., access_key=..., secret_key=...)
    client = DynamoDBClient(region="eu-west-2", endpoint_url=moto_endpoint, access_key="testing",
                            secret_key="testing", connect_timeout=2.0, read_timeout=3.0, max_retries=1)
    try:
        assert client.region_name == "eu-west-2"
        config = client.boto3_client.meta.config
        assert (config.connect_timeout, config.read_timeout, config.retries["total_max_attempts"]) == (2.0, 3.0, 2)
        credentials = client.boto3_client._request_signer._credentials
        assert (credentials.access_key, credentials.secret_key) == ("testing", "testing")
        client.create_lock_table("ported")
        with SyncDistributedLock(client, table="ported", key="k") as lease:
            assert raw_item(client, table="ported")["owner"] == {"S": lease.owner}
    finally:
        client.close()
    for name, advice in (("role_arn", "sts.assume_role"), ("proxy_url", "proxies="), ("rate_limit", "rate limit"),
                         ("diagnostics", "fastlease.otel")):
        with pytest.raises(TypeError, match=f"no {name}= \\(a pydynox argument\\): .*{advice}"):
            DynamoDBClient(region="eu-west-2", **{name: "x"})
    with pytest.raises(ValueError, match="disagree"):
        DynamoDBClient(region="eu-west-2", region_name="us-east-1")
    with pytest.raises(ValueError, match="read_timeout must be a positive number"):
        DynamoDBClient(region="eu-west-2", read_timeout=0)


def test_abandoned_row_is_taken_over_after_its_lease(make_dynamodb):
    clock = FakeClock()
    client = make_dynamodb(clock=clock)
    client.create_lock_table("locks")
    client.boto3_client.put_item(TableName="locks", Item={
        "key": {"S": "k"}, "owner": {"S": "dead"}, "version": {"S": "v"},
        "lease_ms": {"N": "5000"}, "protocol": {"N": "1"}})
    start = clock.monotonic_ns()
    with SyncDistributedLock(client, table="locks", key="k", wait_timeout=30) as lease:
        assert clock.monotonic_ns() - start == 5_000_000_000
        assert raw_item(client)["owner"] == {"S": lease.owner}
    assert lease.metrics.write_requests == 4  # failed put, waiting mark, takeover, release


def test_contention_between_clients(make_dynamodb):
    first = make_dynamodb()
    first.create_lock_table("locks")
    second = make_dynamodb()
    with SyncDistributedLock(first, table="locks", key="k"):
        with pytest.raises(LockNotAcquired):
            with SyncDistributedLock(second, table="locks", key="k", wait_timeout=0):
                pass


def test_decorator_on_dynamodb(ddb):
    @distributed_lock(ddb, table="locks", key="customer-sync:{customer_id}")
    def synchronize_customer(customer_id: str) -> str:
        assert raw_item(ddb, f"customer-sync:{customer_id}") is not None
        return f"Updated {customer_id}"

    assert synchronize_customer("123") == "Updated 123"


# ---- constructors and configuration ---------------------------------------------------------------


def test_constructor_forms(aws, core):
    user = aws.client("dynamodb", config=Config(retries={"max_attempts": 7, "mode": "standard"}, read_timeout=42))
    retries_before = dict(user.meta.config.retries)
    from_client = DynamoDBClient(user, fast_path=False, _engine_module=core)
    try:
        assert from_client.boto3_client is user
        assert from_client.region_name == REGION
        from_client.create_lock_table("locks")
        with SyncDistributedLock(from_client, table="locks", key="k", lease_duration=3):
            pass
        # the user's client keeps its own retries and timeouts
        assert user.meta.config.retries == retries_before == {"total_max_attempts": 8, "mode": "standard"}
        assert user.meta.config.read_timeout == 42
        lock_clients = from_client.store.transport._clients
        assert lock_clients, "the lock request went through a lock-only client"
        for bucket, lock_client in lock_clients.items():
            assert lock_client.meta.config.retries["total_max_attempts"] == 1
            assert lock_client.meta.config.read_timeout == bucket <= 1.0  # min(lease/3, 5 s)
    finally:
        from_client.close()
    with pytest.raises(ValueError, match="not both"):
        DynamoDBClient(user, region_name=REGION)
    with pytest.raises(TypeError, match="fast_path must be True or False"):
        DynamoDBClient(user, fast_path="yes")
    with pytest.raises(TypeError, match="DynamoDB client"):
        DynamoDBClient(aws.client("s3"))


def test_fast_path_is_the_default_and_falls_back_where_it_cannot_serve(aws, core, monkeypatch):
    default = DynamoDBClient(session=aws, _engine_module=core)
    proxied = DynamoDBClient(aws.client("dynamodb", config=Config(proxies={"https": "http://127.0.0.1:9"})),
                             _engine_module=core)
    fips = DynamoDBClient(aws.client("dynamodb", config=Config(use_fips_endpoint=True)), _engine_module=core)
    try:
        assert default.transport == "fast"
        assert proxied.transport == "boto3"
        assert fips.transport == "boto3"
    finally:
        for client in (default, proxied, fips):
            client.close()


def test_endpoint_and_region_arguments(aws, core):
    client = DynamoDBClient(session=aws, region_name="eu-west-1", _engine_module=core)
    try:
        assert client.region_name == "eu-west-1"
        assert "eu-west-1" in client.endpoint_url
    finally:
        client.close()


def test_timeout_buckets_never_exceed_the_requested_timeout():
    for timeout in (0.001, 0.05, 0.07, 0.33, 1.0, 4.99, 5.0, 30.0):
        bucket = _bucket(timeout)
        assert bucket in TIMEOUT_BUCKETS_S
        assert bucket <= max(timeout, TIMEOUT_BUCKETS_S[0])
    assert _bucket(30.0) == 5.0


def test_import_fastlease_does_notimport_boto3():
    probe = "import sys, fastlease; assert 'boto3' not in sys.modules and 'botocore' not in sys.modules; print('ok')"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "ok", result.stderr


# ---- error classification (our transport interface, not a fake of boto3) ---------------------------


class _FailingTransport:
    def __init__(self, error):
        self.error = error

    def call(self, operation, params, timeout_s):
        raise self.error


class _Usage:
    def add_capacity(self, rcu, wcu):
        pass


@pytest.mark.parametrize(
    ("code", "status", "outcome"),
    [
        ("ConditionalCheckFailedException", 400, False),
        ("ProvisionedThroughputExceededException", 400, "not committed"),
        ("ThrottlingException", 400, "not committed"),
        ("InternalServerError", 500, "maybe committed"),
        ("SomethingNew", 503, "maybe committed"),
        ("AccessDeniedException", 400, "rejected"),
        ("ValidationException", 400, "rejected"),
    ],
)
def test_service_errors_are_classified(code, status, outcome):
    store = DynamoDBStore(_FailingTransport(ServiceError(code, "m", status)))
    call = lambda: store.put_if_absent("locks", "k", "o", "v", 1000, 1.0, _Usage())  # noqa: E731
    if outcome is False:
        assert call() is None  # a failed condition: not written
    elif outcome == "rejected":
        with pytest.raises(StoreRequestRejected):
            call()
    else:
        with pytest.raises(StoreError) as info:
            call()
        assert info.value.maybe_committed is (outcome == "maybe committed")


# ---- transactions -------------------------------------------------------------------------------


@pytest.fixture
def results_table(ddb):
    ddb.boto3_client.create_table(
        TableName="import_results",
        AttributeDefinitions=[{"AttributeName": "job_id", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "job_id", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
    )
    return "import_results"


def result_item(client, job_id="daily"):
    return client.boto3_client.get_item(TableName="import_results", Key={"job_id": {"S": job_id}}).get("Item")


def test_check_in_commits_with_the_lease(ddb, results_table):
    with SyncDistributedLock(ddb, table="locks", key="import:daily") as lease:
        with SyncTransaction(ddb) as tx:
            lease.check_in(tx)
            tx.put("import_results", {"job_id": "daily", "summary": "Imported 100 rows", "rows": 100})
    assert result_item(ddb) == {"job_id": {"S": "daily"}, "summary": {"S": "Imported 100 rows"}, "rows": {"N": "100"}}
    assert lease.metrics.write_requests == 2


def test_commit_after_takeover_is_rejected_as_lock_lost(ddb, results_table):
    with pytest.raises(LockLost):  # the exit finds the row taken as well
        with SyncDistributedLock(ddb, table="locks", key="import:daily") as lease:
            tx = SyncTransaction(ddb)
            lease.check_in(tx)
            tx.put("import_results", {"job_id": "daily", "summary": "stale"})
            ddb.boto3_client.update_item(  # another owner takes the row meanwhile
                TableName="locks", Key={"key": {"S": "import:daily"}},
                UpdateExpression="SET #o = :o", ExpressionAttributeNames={"#o": "owner"},
                ExpressionAttributeValues={":o": {"S": "thief"}})
            with pytest.raises(LockLost) as info:
                tx.commit()
            assert info.value.cause == "stolen"
            assert isinstance(info.value.__cause__, TransactionCanceled)
            assert info.value.__cause__.failed_items[0][:3] == (0, "ConditionCheck", "locks")
            assert lease.lost_cause == "stolen" and lease.state == "lost"  # the lease learned it too
            with pytest.raises(LockLost, match="stolen"):
                lease.raise_if_lost()
    assert result_item(ddb) is None


def test_a_failed_user_condition_names_the_item(ddb, results_table):
    with SyncDistributedLock(ddb, table="locks", key="import:daily") as lease:
        tx = SyncTransaction(ddb)
        lease.check_in(tx)
        tx.put("import_results", {"job_id": "a", "n": 1})
        tx.put("import_results", {"job_id": "b"}, condition="attribute_exists(job_id)")
        with pytest.raises(TransactionCanceled) as info:
            tx.commit()
    assert info.value.failed_items == [(2, "Put", "import_results", {"job_id": "b"}, "ConditionalCheckFailed")]
    assert "item 2 (Put on import_results" in str(info.value)
    assert result_item(ddb, "a") is None


def test_check_in_rules(ddb, make_dynamodb, results_table):
    other = make_dynamodb()
    with SyncDistributedLock(ddb, table="locks", key="k") as lease:
        with pytest.raises(ValueError, match="another client"):
            lease.check_in(SyncTransaction(other))
        tx = SyncTransaction(ddb)
        tx.update("locks", {"key": "k"}, "SET x = :x", values={":x": 1})
        with pytest.raises(ValueError, match="lock item"):
            lease.check_in(tx)
        tx = SyncTransaction(ddb)
        lease.check_in(tx)
        with pytest.raises(ValueError, match="already checked in"):
            lease.check_in(tx)
        with pytest.raises(ValueError, match="lock item"):
            tx.delete("locks", {"key": "k"})
        with pytest.raises(TypeError, match="Transaction"):
            lease.check_in(object())


def test_an_inherited_lease_cannot_check_in_a_transaction_in_a_forked_child(ddb, results_table, in_forked_child):
    # Before, the child's check_in and commit succeeded: its write landed under the parent's lease.
    with SyncDistributedLock(ddb, table="locks", key="import:daily") as lease:
        def write_under_the_parent_s_lease() -> str:
            tx = SyncTransaction(ddb)
            try:
                lease.check_in(tx)
            except RuntimeError as error:
                return "refused" if "forked child" in str(error) else str(error)
            tx.put("import_results", {"job_id": "daily", "summary": "from the child"})
            tx.commit()
            return "committed"

        assert in_forked_child(write_under_the_parent_s_lease) == "refused"
        with SyncTransaction(ddb) as tx:  # the parent's own check-in still works
            lease.check_in(tx)
            tx.put("import_results", {"job_id": "daily", "summary": "from the parent"})
    assert result_item(ddb)["summary"] == {"S": "from the parent"}


def test_check_in_raises_lock_lost_when_not_valid(make_dynamodb):
    clock = FakeClock()
    client = make_dynamodb(clock=clock)
    client.create_lock_table("locks")
    with pytest.raises(LockLost, match="lapsed before the block ended"):  # leaving the block says so too
        with SyncDistributedLock(client, table="locks", key="k", lease_duration=3) as lease:
            clock.jump_wall(-1)  # a backwards wall jump: validity ends
            with pytest.raises(LockLost):
                lease.check_in(SyncTransaction(client))


def test_condition_check_item_for_a_hand_built_transaction(ddb, results_table):
    with SyncDistributedLock(ddb, table="locks", key="k") as lease:
        item = lease.condition_check_item()
        assert item["ConditionCheck"]["ExpressionAttributeValues"] == {":owner": {"S": lease.owner}}
        ddb.boto3_client.transact_write_items(TransactItems=[
            item, {"Put": {"TableName": "import_results", "Item": {"job_id": {"S": "hand"}}}}])
    assert result_item(ddb, "hand") == {"job_id": {"S": "hand"}}


def test_empty_transaction_sends_nothing_and_commits_once(ddb):
    tx = SyncTransaction(ddb)
    with tx:
        pass
    with pytest.raises(RuntimeError, match="already committed"):
        tx.commit()


def test_default_constructor_honours_the_aws_configuration_chain(moto_endpoint, monkeypatch, core):
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-central-1")
    client = DynamoDBClient(_engine_module=core)
    try:
        assert client.endpoint_url == moto_endpoint
        assert client.region_name == "eu-central-1"
        table = f"chain_{core.IMPLEMENTATION}"
        if not client.lock_table_exists(table):
            client.create_lock_table(table)
        with SyncDistributedLock(client, table=table, key="k") as lease:
            assert lease.state == "held"
    finally:
        client.close()


def test_missing_boto3_names_the_extra_to_install():
    probe = (
        "import sys; sys.modules['boto3'] = None\n"
        "from fastlease import DynamoDBClient\n"
        "try:\n    DynamoDBClient()\nexcept ImportError as error:\n    print(error)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert "pip install 'fastlease[dynamodb]'" in result.stdout, result.stderr


def test_async_guard_and_transaction(ddb, results_table):
    import asyncio

    from fastlease import DistributedLock
    from fastlease.dynamodb import Transaction

    async def main():
        async with DistributedLock(ddb, table="locks", key="import:daily") as lease:
            async with Transaction(ddb) as tx:
                lease.check_in(tx)
                tx.put("import_results", {"job_id": "daily", "summary": "async"})
        return lease

    lease = asyncio.run(main())
    assert lease.metrics.write_requests == 2
    assert result_item(ddb)["summary"] == {"S": "async"}


def test_no_credentials_fails_at_once_with_a_clear_error(monkeypatch, core):
    for name in [name for name in __import__("os").environ if name.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    # At construction now (StoreConfigurationError, a StoreRequestRejected), before any lock waits on it.
    with pytest.raises(StoreRequestRejected, match="found no AWS credentials"):
        DynamoDBClient(region_name="us-east-1", endpoint_url="http://127.0.0.1:9", clock=FakeClock(),
                       _engine_module=core)


def test_a_credential_refresh_failure_is_a_retryable_error_not_a_raw_botocore_one(aws, core, transport):
    # Real botocore refreshable credentials (as from STS, IMDS or a credential process) whose refresh
    # fails: nothing is sent, so the store reports "not applied" and the engine may try again.
    from botocore.credentials import RefreshableCredentials
    from botocore.exceptions import CredentialRetrievalError

    def refresh() -> dict:
        raise CredentialRetrievalError(provider="test-provider", error_msg="metadata service unreachable")

    user = aws.client("dynamodb")
    user._request_signer._credentials = RefreshableCredentials.create_from_metadata(
        metadata={"access_key": "testing", "secret_key": "testing", "token": "t",
                  "expiry_time": "2000-01-01T00:00:00Z"},
        refresh_using=refresh, method="test",
    )
    client = DynamoDBClient(user, fast_path=transport == "fast", _engine_module=core)
    try:
        assert client.transport == transport
        with pytest.raises(StoreError) as info:
            client.store.put_if_absent("locks", "k", "o", "v", 30_000, 5.0, NO_USAGE)
        assert info.value.maybe_committed is False
        assert isinstance(info.value.__cause__, CredentialRetrievalError)
    finally:
        client.close()


# ---- pydynox-style helpers: code ported from pydynox 1.8.0 runs with only its imports changed ------


def pydynox_style_snippet(client, SyncDistributedLock, SyncTransaction, prefix):  # noqa: N803 - imported names
    """Code as written for pydynox 1.8.0: table helpers with a sort key, item helpers and transactions
    with positional condition, names and values (and pydynox's keywords), a lease checked in. The
    caller passes either library's client and classes: only the imports differ."""
    locks, orders = f"{prefix}_locks", f"{prefix}_orders"
    for table in (locks, orders):
        if client.sync_table_exists(table):
            client.sync_delete_table(table, wait=True)
    client.sync_create_table(locks, ("key", "S"), wait=True)
    client.sync_create_table(orders, ("pk", "S"), sort_key=("sk", "N"), wait=True)
    first, second, third = ({"pk": "customer#1", "sk": n} for n in (1, 2, 3))

    client.sync_put_item(orders, {**first, "status": "new", "total": 10})
    client.sync_put_item(orders, {**first, "status": "new", "total": 12}, "#s = :s", {"#s": "status"}, {":s": "new"})
    with SyncDistributedLock(client, table=locks, key="customer#1") as lease:
        with SyncTransaction(client) as tx:
            lease.check_in(tx)
            tx.update(orders, first, "SET #s = :paid", "#s = :new", {"#s": "status"}, {":paid": "paid", ":new": "new"})
            tx.put(orders, {**second, "status": "new"}, "attribute_not_exists(#pk)", {"#pk": "pk"})
            tx.condition_check(orders, third, "attribute_not_exists(#pk)", {"#pk": "pk"})
    with SyncTransaction(client) as tx:
        tx.delete(orders, second, condition_expression="#s = :s", expression_attribute_names={"#s": "status"},
                  expression_attribute_values={":s": "new"})
        tx.update(orders, first, update_expression="SET #t = #t + :tip", expression_attribute_names={"#t": "total"},
                  expression_attribute_values={":tip": 3})
    paid = client.sync_get_item(orders, first, consistent_read=True)
    deleted = client.sync_get_item(orders, second, True)
    client.sync_delete_item(orders, first, "#s = :s", {"#s": "status"}, {":s": "paid"})
    after = client.sync_get_item(orders, first, consistent_read=True)
    client.sync_delete_table(orders, wait=True)
    client.sync_delete_table(locks, wait=True)
    return paid, deleted, after, client.sync_table_exists(orders)


SNIPPET_OUTCOME = ({"pk": "customer#1", "sk": 1, "status": "paid", "total": 15}, None, None, False)


def test_a_pydynox_style_snippet_runs_on_fastlease(make_dynamodb):
    assert pydynox_style_snippet(make_dynamodb(), SyncDistributedLock, SyncTransaction, "port") == SNIPPET_OUTCOME


def test_the_same_snippet_runs_on_pydynox_and_on_fastlease_against_one_moto_server(moto_endpoint, moto_session):
    # pydynox is imported here, not at the top: the wheel tests collect this file without the peer.
    from pydynox import DynamoDBClient as PydynoxClient
    from pydynox.lock import SyncDistributedLock as PydynoxLock
    from pydynox.transaction import SyncTransaction as PydynoxTransaction

    theirs = PydynoxClient(region=REGION, access_key="testing", secret_key="testing", endpoint_url=moto_endpoint)
    assert pydynox_style_snippet(theirs, PydynoxLock, PydynoxTransaction, "port_pydynox") == SNIPPET_OUTCOME
    ours = DynamoDBClient(session=moto_session, endpoint_url=moto_endpoint)
    try:
        assert pydynox_style_snippet(ours, SyncDistributedLock, SyncTransaction, "port_fastlease") == SNIPPET_OUTCOME
    finally:
        ours.close()


def test_transaction_expressions_positionally_or_by_either_keyword(ddb, results_table):
    key, names, values = {"job_id": "daily"}, {"#r": "rows"}, {":n": 100}
    forms = [
        lambda tx: tx.update(results_table, key, "SET #r = :n", "attribute_not_exists(#r)", names, values),
        lambda tx: tx.update(results_table, key, update="SET #r = :n", condition="attribute_not_exists(#r)",
                             names=names, values=values),
        lambda tx: tx.update(results_table, key, update_expression="SET #r = :n",
                             condition_expression="attribute_not_exists(#r)",
                             expression_attribute_names=names, expression_attribute_values=values),
    ]
    built = []
    for form in forms:
        tx = SyncTransaction(ddb)
        form(tx)
        built.append(tx)
    assert built[0]._items == built[1]._items == built[2]._items
    assert built[0]._items[0]["Update"]["ConditionExpression"] == "attribute_not_exists(#r)"
    built[0].commit()
    assert result_item(ddb) == {"job_id": {"S": "daily"}, "rows": {"N": "100"}}
    with pytest.raises(TransactionCanceled):  # the positional condition is enforced: rows exists now
        built[1].commit()
    for form in (
        lambda tx: tx.put(results_table, {**key, "rows": 7}, "#r = :n", names, values),
        lambda tx: tx.condition_check(results_table, key, "#r = :n", names, {":n": 7}),
        lambda tx: tx.delete(results_table, key, "#r = :n", names, {":n": 7}),
    ):
        tx = SyncTransaction(ddb)
        form(tx)
        tx.commit()
    assert result_item(ddb) is None  # each positional condition held: put, checked, deleted


@pytest.mark.parametrize(("build", "message"), [
    (lambda tx: tx.put("t_results", {"job_id": "a"}, "attribute_exists(job_id)",
                       condition_expression="attribute_exists(job_id)"), "pass condition or condition_expression"),
    (lambda tx: tx.delete("t_results", {"job_id": "a"}, names={"#j": "job_id"},
                          expression_attribute_names={"#j": "job_id"}), "pass names or expression_attribute_names"),
    (lambda tx: tx.update("t_results", {"job_id": "a"}), "needs the update expression"),
    (lambda tx: tx.condition_check("t_results", {"job_id": "a"}), "needs the condition expression"),
    (lambda tx: tx.put("t_results", {"job_id": "a"}, {"#j": "job_id"}), "condition expression must be a str"),
    (lambda tx: tx.put("t_results", {"job_id": "a"}, "attribute_exists(#j)", "#j"),
     "expression attribute names must be a mapping"),
    (lambda tx: tx.put("t_results", {"job_id": "a"}, "#j = :v", {"#j": "job_id"}, [":v"]),
     "expression attribute values must be a mapping"),
])
def test_transaction_arguments_that_cannot_be_meant_are_refused(ddb, build, message):
    tx = SyncTransaction(ddb)
    with pytest.raises(TypeError, match=message):
        build(tx)
    assert tx._items == []


def test_sync_put_get_and_delete_item_with_positional_conditions(make_dynamodb):
    client = make_dynamodb()
    client.sync_create_table("orders", ("order_id", "S"))
    failed = client.boto3_client.exceptions.ConditionalCheckFailedException
    client.sync_put_item("orders", {"order_id": "1", "status": "new", "lines": ["a", "b"]})
    with pytest.raises(failed):
        client.sync_put_item("orders", {"order_id": "1"}, "attribute_not_exists(#o)", {"#o": "order_id"})
    assert client.sync_get_item("orders", {"order_id": "1"}) == {"order_id": "1", "status": "new", "lines": ["a", "b"]}
    with pytest.raises(failed):
        client.sync_delete_item("orders", {"order_id": "1"}, "#s = :s", {"#s": "status"}, {":s": "paid"})
    client.sync_delete_item("orders", {"order_id": "1"}, condition_expression="#s = :s",
                            expression_attribute_names={"#s": "status"}, expression_attribute_values={":s": "new"})
    assert client.sync_get_item("orders", {"order_id": "1"}) is None
    client.sync_delete_item("orders", {"order_id": "1"})  # a missing item is no error
    with pytest.raises(TypeError, match="item must be a mapping"):
        client.sync_put_item("orders", [("order_id", "2")])
    with pytest.raises(TypeError, match="condition expression must be a str"):
        client.sync_delete_item("orders", {"order_id": "2"}, {"#s": "status"})


def test_sync_get_item_sends_consistent_read_as_asked(make_dynamodb):
    client = make_dynamodb()
    client.sync_create_table("orders", ("order_id", "S"))
    sent = []
    client.boto3_client.meta.events.register(
        "provide-client-params.dynamodb.GetItem", lambda params, **_: sent.append(params["ConsistentRead"]))
    client.sync_get_item("orders", {"order_id": "1"})
    client.sync_get_item("orders", {"order_id": "1"}, consistent_read=False)
    client.sync_get_item("orders", {"order_id": "1"}, True)
    assert sent == [True, False, True]  # strongly consistent unless asked otherwise
    with pytest.raises(TypeError, match="consistent_read must be True or False, got 'yes'"):
        client.sync_get_item("orders", {"order_id": "1"}, consistent_read="yes")


def test_sync_create_table_with_a_sort_key_and_sync_delete_table(make_dynamodb):
    client = make_dynamodb()
    client.sync_create_table("events", ("stream", "S"), ("seq", "N"), wait=True, timeout_seconds=10)
    table = client.boto3_client.describe_table(TableName="events")["Table"]
    assert table["KeySchema"] == [{"AttributeName": "stream", "KeyType": "HASH"},
                                  {"AttributeName": "seq", "KeyType": "RANGE"}]
    assert sorted(table["AttributeDefinitions"], key=lambda d: d["AttributeName"]) == [
        {"AttributeName": "seq", "AttributeType": "N"}, {"AttributeName": "stream", "AttributeType": "S"}]
    assert table["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    client.sync_put_item("events", {"stream": "s", "seq": 2, "body": b"\x00"})
    assert client.sync_get_item("events", {"stream": "s", "seq": 2})["body"].value == b"\x00"
    client.sync_delete_table("events", wait=True, timeout_seconds=10)
    assert client.sync_table_exists("events") is False
    client.sync_create_table("events", partition_key=("stream", "S"), sort_key=("seq", "N"), wait=False)
    assert client.sync_table_exists("events") is True
    client.sync_delete_table("events", wait=False)
    with pytest.raises(client.boto3_client.exceptions.ResourceNotFoundException):
        client.sync_delete_table("events")


@pytest.mark.parametrize(("arguments", "error", "message"), [
    ({"partition_key": "id"}, TypeError, r"partition_key must be a \(name, type\) pair such as \('id', 'S'\), got"),
    ({"partition_key": ("id",)}, TypeError, r"partition_key must be a \(name, type\) pair"),
    ({"partition_key": ("", "S")}, TypeError, "partition_key name must be a non-empty str, got ''"),
    ({"partition_key": ("id", "S"), "sort_key": "seq"}, TypeError, r"sort_key must be a \(name, type\) pair"),
    ({"partition_key": ("id", "S"), "sort_key": ("seq", "X")}, ValueError, "sort key type must be 'S', 'N' or 'B'"),
    ({"partition_key": ("id", "S"), "sort_key": ("id", "N")}, ValueError, "another attribute than partition_key"),
    ({"partition_key": ("id", "S"), "wait": "yes"}, TypeError, "wait must be True or False, got 'yes'"),
    ({"partition_key": ("id", "S"), "timeout_seconds": 0}, ValueError, "timeout_seconds must be positive"),
    ({"partition_key": ("id", "S"), "timeout_seconds": "60"}, TypeError, "timeout_seconds must be a number"),
])
def test_sync_create_table_refuses_bad_keys_before_sending_anything(make_dynamodb, arguments, error, message):
    client = make_dynamodb()
    with pytest.raises(error, match=message):
        client.sync_create_table("bad_table", **arguments)
    assert client.sync_table_exists("bad_table") is False


def test_async_item_helpers_delegate_to_the_sync_ones_on_the_clients_workers(make_dynamodb):
    import asyncio
    import threading

    client = make_dynamodb()
    client.sync_create_table("orders", ("order_id", "S"))
    calls = []

    def recorder(name):
        sync = getattr(client, name)

        def recording(*args):
            calls.append((name, args, threading.current_thread().name))
            return sync(*args)
        return recording

    for name in ("sync_get_item", "sync_put_item", "sync_delete_item"):
        setattr(client, name, recorder(name))  # on the instance: the async forms must call through it

    async def main():
        await client.put_item("orders", {"order_id": "1", "n": 1}, "attribute_not_exists(#o)", {"#o": "order_id"})
        got = await client.get_item("orders", {"order_id": "1"}, consistent_read=True)
        with pytest.raises(client.boto3_client.exceptions.ConditionalCheckFailedException):
            await client.delete_item("orders", {"order_id": "1"}, "#n = :n", {"#n": "n"}, {":n": 2})
        await client.delete_item("orders", {"order_id": "1"})
        return got, await client.get_item("orders", {"order_id": "1"})

    assert asyncio.run(main()) == ({"order_id": "1", "n": 1}, None)
    assert [(name, args) for name, args, _ in calls] == [
        ("sync_put_item", ("orders", {"order_id": "1", "n": 1}, "attribute_not_exists(#o)", {"#o": "order_id"},
                           None)),
        ("sync_get_item", ("orders", {"order_id": "1"}, True)),
        ("sync_delete_item", ("orders", {"order_id": "1"}, "#n = :n", {"#n": "n"}, {":n": 2})),
        ("sync_delete_item", ("orders", {"order_id": "1"}, None, None, None)),
        ("sync_get_item", ("orders", {"order_id": "1"}, True)),
    ]
    assert all(thread.startswith("fastlease-async_") for _, _, thread in calls)  # the client's pool, not the loop
