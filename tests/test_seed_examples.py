"""The reference library's documented usage patterns (pydynox's distributed lock: async workers that
coordinate customer work, a sync section whose transaction checks ownership, the table helpers), run
against the serialised moto server with only their imports and client construction changed."""

from __future__ import annotations

import pytest


@pytest.fixture
def seed_client(moto_endpoint, moto_session):
    from fastlease.dynamodb import DynamoDBClient

    client = DynamoDBClient(session=moto_session, endpoint_url=moto_endpoint)
    for table in ("script_locks", "import_results", "worker_locks"):
        if client.sync_table_exists(table):
            client.boto3_client.delete_table(TableName=table)
    yield client
    client.close()


def test_async_workers_coordinate_customer_work(seed_client):
    """Async workers coordinate customer work through one lock table."""

    import asyncio

    from fastlease import distributed_lock  # changed: was pydynox.lock

    client = seed_client  # changed: was DynamoDBClient()

    # Deployment setup. Normally provision the table outside the application.
    if not client.sync_table_exists("worker_locks"):
        client.sync_create_table("worker_locks", partition_key=("key", "S"), wait=True)

    @distributed_lock(client, table="worker_locks", key="customer:{customer_id}", wait_timeout=2)
    async def synchronize_customer(customer_id: str) -> str:
        await asyncio.sleep(0.01)  # Replace with the customer's import or repair work.
        return f"Updated {customer_id}"

    async def main():
        # Same customer waits; different customers can proceed independently.
        results = await asyncio.gather(
            synchronize_customer("123"),
            synchronize_customer(customer_id="123"),
            synchronize_customer("456"),
        )
        assert results == ["Updated 123", "Updated 123", "Updated 456"]

    asyncio.run(main())


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
