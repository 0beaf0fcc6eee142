"""The reference documentation's examples (../shared/seeds/pydynox-lock-docs.txt), run against the
serialised moto server with only their imports and client construction changed."""

from __future__ import annotations

import pytest


@pytest.fixture
def seed_client(moto_endpoint, moto_session):
    from fastlease.dynamodb import DynamoDBClient

    client = DynamoDBClient(session=moto_session, endpoint_url=moto_endpoint)
    for table in ("script_locks", "import_results"):
        if client.sync_table_exists(table):
            client.boto3_client.delete_table(TableName=table)
    yield client
    client.close()


def test_sync_section_with_a_transaction_ownership_check(seed_client):
    # --- the seed example, verbatim from here but for the two changed lines marked below ---
    from fastlease import SyncDistributedLock  # changed: was pydynox.lock
    from fastlease.dynamodb import SyncTransaction  # changed: was pydynox.transaction

    client = seed_client  # changed: was DynamoDBClient()
    for table, partition_key in (("script_locks", "key"), ("import_results", "job_id")):
        if not client.sync_table_exists(table):
            client.sync_create_table(table, partition_key=(partition_key, "S"), wait=True)

    with SyncDistributedLock(client, table="script_locks", key="import:daily") as lease:
        summary = "Imported 100 rows"
        with SyncTransaction(client) as transaction:
            lease.check_in(transaction)
            transaction.put("import_results", {"job_id": "daily", "summary": summary})

    assert lease.metrics.write_requests == 2
    assert client.sync_get_item("import_results", {"job_id": "daily"})["summary"] == summary


def test_sync_get_item_and_create_table_helpers(seed_client):
    seed_client.sync_create_table("import_results", partition_key=("job_id", "S"))
    assert seed_client.sync_get_item("import_results", {"job_id": "none"}) is None
    with pytest.raises(ValueError, match="partition key type"):
        seed_client.sync_create_table("other_table", partition_key=("id", "X"))
