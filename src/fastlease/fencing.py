"""Fencing at the destination: writes that refuse a holder older than the newest one seen.

A lease cannot stop a holder that was paused past its lease from writing when it resumes, after its
successor (docs/failure-model.md, "A paused process"). Only the destination of the write can refuse it,
by keeping the highest fencing token it has seen and refusing a lower one. These helpers do that for the
destinations users have, each in one atomic step of that destination:

* ``sql_fence(connection, resource, lease)``: inside your own transaction on a SQLite (``sqlite3``) or
  PostgreSQL (psycopg 3) connection, records the lease's token for ``resource`` in a fence table, or
  refuses; your writes in the same transaction then commit only for a holder that is not stale. Create
  the table once with ``create_sql_fence_table``.
* ``redis_fenced_write(redis, key, fields, lease)``: one script that sets the fields of the hash ``key``
  and its ``fence`` field only if the lease's token is not lower than the one stored there.
* ``dynamodb_fenced_put(dynamodb, table, item, lease)``: a PutItem of your item, its ``fence`` attribute
  set to the token, conditioned on the stored item having no fence or one not newer;
  ``dynamodb_fence_condition(lease)`` is that condition, for your own UpdateItem or transaction.

The destination need not be the lease's store: a lease on Redis can fence writes to DynamoDB.

Each refuses with :class:`~fastlease.exceptions.LockLost`, cause ``stolen`` (a newer holder has written),
and checks ``lease.raise_if_lost()`` first, so a lease known to be lost writes nothing. A token equal to
the newest is accepted: one holder writes as often as it needs. Tokens exist on SQLite, Redis, Redis
Cluster, PostgreSQL and the in-memory store; a lease without one (DynamoDB, protocol v1 rows) gets a
ValueError, never an unfenced write.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Union

from .exceptions import LockLost

__all__ = ["DEFAULT_FENCE_TABLE", "create_sql_fence_table", "dynamodb_fence_condition", "dynamodb_fenced_put",
           "redis_fenced_write", "sql_fence"]

#: The fence table ``sql_fence`` uses unless told otherwise: one row per resource, its newest token.
DEFAULT_FENCE_TABLE = "fastlease_fences"

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")

#: Redis: set the fields and the fence only for a token not lower than the stored one. KEYS: the hash.
#: ARGV: token, then field, value pairs. Returns 1, or 0 (refused: the stored fence is newer).
REDIS_FENCED_WRITE = """
local newest = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
if tonumber(ARGV[1]) < newest then return 0 end
redis.call('HSET', KEYS[1], 'fence', ARGV[1], unpack(ARGV, 2))
return 1
"""


def _token(lease: Any) -> int:
    """The lease's fencing token, after ``raise_if_lost()``; ValueError where the store keeps none."""
    lease.raise_if_lost()
    token = lease.fencing_token
    if type(token) is not int or token < 1:
        raise ValueError(f"lease on {lease.key!r} has no fencing token ({token!r}): its store keeps none "
                         "(DynamoDB without fencing): make the client with DynamoDBClient(fencing=True), or use "
                         "check_in in a transaction of that store instead")
    return token


def _fence_table(table: object) -> str:
    if type(table) is not str or not _IDENTIFIER.fullmatch(table):
        raise ValueError(f"fence table must be a plain SQL identifier (letters, digits, _; 1-63), got {table!r:.80}")
    return table


def _placeholder(connection: Any) -> str:
    """The driver's parameter style: ``?`` for sqlite3, ``%s`` for psycopg."""
    module = type(connection).__module__
    if module.startswith("sqlite3"):
        return "?"
    if module.startswith("psycopg"):
        return "%s"
    raise TypeError(f"sql_fence takes a sqlite3 or psycopg connection, got {type(connection).__module__}."
                    f"{type(connection).__qualname__}")


def create_sql_fence_table(connection: Any, table: str = DEFAULT_FENCE_TABLE) -> None:
    """Create the fence table if it does not exist (run it once, like a migration; it is not committed
    here: commit it with your transaction, or use an autocommit connection)."""
    _placeholder(connection)
    connection.execute(f"CREATE TABLE IF NOT EXISTS {_fence_table(table)} "
                       "(resource TEXT PRIMARY KEY, token BIGINT NOT NULL)")


def sql_fence(connection: Any, resource: str, lease: Any, *, table: str = DEFAULT_FENCE_TABLE) -> None:
    """Record ``lease``'s fencing token for ``resource`` in your open transaction on ``connection``, or
    raise LockLost (cause ``stolen``) if a newer token is recorded; roll the transaction back then. One
    upsert whose update applies only to a token not lower than the stored one: the row it locks also
    orders concurrent writers, so the newer one's commit always wins."""
    if type(resource) is not str or not resource:
        raise ValueError(f"resource must be a non-empty str naming what the lease protects, got {resource!r:.80}")
    mark = _placeholder(connection)
    token = _token(lease)
    name = _fence_table(table)
    cursor = connection.execute(
        f"INSERT INTO {name} (resource, token) VALUES ({mark}, {mark}) ON CONFLICT (resource) "
        f"DO UPDATE SET token = excluded.token WHERE {name}.token <= excluded.token",
        (resource, token),
    )
    if cursor.rowcount != 1:
        raise LockLost(f"write to {resource!r} refused: a holder with a newer fencing token than {token} "
                       f"has written (the lease on {lease.key!r} was taken over)", key=lease.key, cause="stolen")


def redis_fenced_write(redis: Any, key: str, fields: Mapping[str, Union[str, bytes, int, float]], lease: Any) -> None:
    """Set ``fields`` of the Redis hash ``key`` (and its ``fence`` field) in one script, only if
    ``lease``'s fencing token is not lower than the hash's; else raise LockLost (cause ``stolen``) and
    write nothing. ``redis`` is a redis-py client (``redis.Redis`` or ``redis.RedisCluster``)."""
    if not fields or "fence" in fields:
        raise ValueError(f"fields must be a non-empty mapping without 'fence' (the helper's own), got "
                         f"{sorted(fields)!r:.80}")
    token = _token(lease)
    pairs = [item for field_value in fields.items() for item in field_value]
    if not redis.eval(REDIS_FENCED_WRITE, 1, key, token, *pairs):
        raise LockLost(f"write to Redis key {key!r} refused: a holder with a newer fencing token than {token} "
                       f"has written (the lease on {lease.key!r} was taken over)", key=lease.key, cause="stolen")


def dynamodb_fence_condition(lease: Any, attribute: str = "fence") -> dict[str, Any]:
    """The ``ConditionExpression`` (with its names and values, as boto3's client takes them) that lets a
    write through only if the item has no ``attribute`` or one not newer than ``lease``'s token; set the
    attribute to ``:fence`` in the same write (``SET #fence = :fence``). A refused write raises boto3's
    ``ConditionalCheckFailedException``: the lease was taken over."""
    if type(attribute) is not str or not attribute:
        raise ValueError(f"attribute must be a non-empty str, got {attribute!r:.80}")
    return {
        "ConditionExpression": "attribute_not_exists(#fence) OR #fence <= :fence",
        "ExpressionAttributeNames": {"#fence": attribute},
        "ExpressionAttributeValues": {":fence": {"N": str(_token(lease))}},
    }


def dynamodb_fenced_put(dynamodb: Any, table: str, item: Mapping[str, Any], lease: Any, *,
                        attribute: str = "fence") -> None:
    """PutItem of ``item`` (typed, as boto3's client takes it: ``{"id": {"S": "r"}}``) into ``table``, with
    ``attribute`` set to ``lease``'s fencing token, only if the stored item has none or one not newer;
    else raise LockLost (cause ``stolen``) and write nothing. ``dynamodb`` is a boto3 DynamoDB client."""
    if attribute in item:
        raise ValueError(f"item must not carry {attribute!r}: the helper sets it to the lease's fencing token")
    condition = dynamodb_fence_condition(lease, attribute)
    token_value = condition["ExpressionAttributeValues"][":fence"]
    try:
        dynamodb.put_item(TableName=table, Item={**item, attribute: token_value}, **condition)
    except Exception as error:
        code = getattr(error, "response", {}).get("Error", {}).get("Code")
        if code != "ConditionalCheckFailedException":
            raise
        raise LockLost(f"write to DynamoDB table {table!r} refused: a holder with a newer fencing token than "
                       f"{token_value['N']} has written (the lease on {lease.key!r} was taken over)",
                       key=lease.key, cause="stolen") from error
