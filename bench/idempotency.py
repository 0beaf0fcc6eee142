"""Idempotency overhead per request: a first execution and a replayed hit, on every store, side by side
with aws-lambda-powertools' idempotency utility on the same DynamoDB server.

In one run: a moto server (serialised, another process) and a redis-server are started here. Each
contender wraps the same trivial handler (it returns a small dict), is called once for each of N new
keys (first executions), then once more for each (replays). Reported per request: wall time, client
CPU (``time.process_time``: every thread of this process) and, for fastlease, the store requests.
Powertools 3.37.0 runs with its defaults (no local cache) through a boto3 client on the same server.

Run: ``.venv/bin/python bench/idempotency.py [--requests N]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
import uuid
import warnings
from typing import Any, Callable

CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": "us-east-1"}


def measure(call: Callable[[str], Any], keys: list[str]) -> tuple[float, float]:
    """(wall µs per request, CPU µs per request)."""
    cpu, wall = time.process_time(), time.perf_counter()
    for key in keys:
        call(key)
    return ((time.perf_counter() - wall) / len(keys) * 1e6, (time.process_time() - cpu) / len(keys) * 1e6)


def fastlease_handler(client: Any, table: str) -> Callable[[str], Any]:
    from fastlease.idempotency import idempotent

    @idempotent(client, table=table, key="order:{order_id}")
    def handle(order_id: str) -> dict:
        return {"order_id": order_id, "status": "accepted"}

    return handle


def powertools_handler(endpoint: str, table: str) -> Callable[[str], Any]:
    import boto3
    from aws_lambda_powertools.utilities.idempotency import (
        DynamoDBPersistenceLayer,
        IdempotencyConfig,
        idempotent_function,
    )

    persistence = DynamoDBPersistenceLayer(
        table_name=table, boto3_client=boto3.client("dynamodb", endpoint_url=endpoint, **CREDENTIALS))

    @idempotent_function(data_keyword_argument="order", persistence_store=persistence, config=IdempotencyConfig())
    def handle(order: dict) -> dict:
        return {"order_id": order["order_id"], "status": "accepted"}

    return lambda key: handle(order={"order_id": key})


def print_request_costs(store: Any) -> None:
    """What one request of each kind costs on this moto server (its transactions are slow)."""
    from fastlease.stores.base import Record
    from fastlease.testing import NO_USAGE

    keys = [uuid.uuid4().hex for _ in range(100)]
    costs = {}
    for name, request in (
        ("GetItem", lambda key: store.read_record("orders", key, 5.0)),
        ("PutItem", lambda key: store.put_if_absent("orders_locks", key, "o", "v", 30_000, 5.0, NO_USAGE)),
        ("TransactWriteItems", lambda key: store.finish_if_owner(
            "orders_locks", key, "orders", Record("COMPLETED", "", b"{}", 0, "o"), 0, 5.0)),
    ):
        costs[name] = measure(request, keys)[0]
    print("moto server, µs per request: " + ", ".join(f"{name} {cost:,.0f}" for name, cost in costs.items()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="new keys per contender (default 300)")
    args = parser.parse_args()
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    # Powertools warns outside Lambda that it cannot see the remaining time; irrelevant here.
    warnings.filterwarnings("ignore", message="Couldn't determine the remaining time left")
    import boto3

    from fastlease import MemoryClient, SQLiteClient
    from fastlease.dynamodb import DynamoDBClient
    from fastlease.redis import RedisClient
    from fastlease.testing.moto_server import MotoServer
    from fastlease.testing.redis_server import RedisServer

    directory = tempfile.mkdtemp(prefix="fastlease-bench-")
    with MotoServer() as moto, RedisServer() as redis_server:
        dynamodb = DynamoDBClient(session=boto3.session.Session(**CREDENTIALS), endpoint_url=moto.endpoint_url)
        dynamodb.create_idempotency_table("orders")
        dynamodb.create_lock_table("orders_locks")
        boto3.client("dynamodb", endpoint_url=moto.endpoint_url, **CREDENTIALS).create_table(
            TableName="powertools_orders",
            AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
            KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
            BillingMode="PAY_PER_REQUEST",
        )
        clients = {
            "fastlease, memory": MemoryClient(),
            "fastlease, SQLite": SQLiteClient(os.path.join(directory, "idem.db")),
            "fastlease, Redis": RedisClient(redis_server.url),
            "fastlease, DynamoDB": dynamodb,
        }
        handlers = {name: fastlease_handler(client, "orders") for name, client in clients.items()}
        handlers["powertools, DynamoDB"] = powertools_handler(moto.endpoint_url, "powertools_orders")
        print(f"# idempotency: {args.requests} new keys then {args.requests} replays per contender, Python "
              f"{platform.python_version()}, {platform.machine()}, {time.strftime('%Y-%m-%d')}")
        print(f"{'contender':<24}{'first µs':>10}{'first CPU µs':>14}{'replay µs':>11}{'replay CPU µs':>15}")
        rows = {}
        try:
            for name, handle in handlers.items():
                for key in (f"warm-{uuid.uuid4().hex}" for _ in range(20)):
                    handle(key)
                    handle(key)
                keys = [f"{name.split(',')[0]}-{uuid.uuid4().hex}" for _ in range(args.requests)]
                first = measure(handle, keys)
                replay = measure(handle, keys)
                rows[name] = (first, replay)
                print(f"{name:<24}{first[0]:>10,.0f}{first[1]:>14,.0f}{replay[0]:>11,.0f}{replay[1]:>15,.0f}",
                      flush=True)
        finally:
            for client in clients.values():
                client.close()
        print("requests per call (fastlease): first execution = read record + acquire lease + read record + "
              "finish (record and release in one atomic request); replay = read record")
        print_request_costs(dynamodb.store)
        ours, theirs = rows["fastlease, DynamoDB"], rows["powertools, DynamoDB"]
        print(f"fastlease / powertools on DynamoDB: first execution {ours[0][0] / theirs[0][0]:.2f}x wall, "
              f"{ours[0][1] / theirs[0][1]:.2f}x CPU; replay {ours[1][0] / theirs[1][0]:.2f}x wall, "
              f"{ours[1][1] / theirs[1][1]:.2f}x CPU")
    shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
