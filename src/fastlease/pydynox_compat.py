"""pydynox 1.8.0 compatibility: what lets code written for pydynox run on fastlease with only its
imports changed.

* ``SyncTransaction`` and ``Transaction`` (async): TransactWriteItems builders for writes that must
  commit only under a lease (``lease.check_in(tx)``), whose operations take pydynox's arguments as
  well as fastlease's shorter ones.
* The table and item helpers of ``DynamoDBClient``: ``sync_table_exists``, ``sync_create_table``,
  ``sync_delete_table``, ``sync_get_item``, ``sync_put_item``, ``sync_delete_item`` and the async
  ``get_item``, ``put_item`` and ``delete_item``. They are defined here, each taking the client first,
  and ``DynamoDBClient`` takes them as its methods: call them on the client. Each sends one request
  through your boto3 client (its retries and timeouts), with pydynox's argument names and order;
  they are a convenience for porting, not a general DynamoDB client.
* pydynox's constructor arguments that ``DynamoDBClient`` maps onto boto3 (timeouts and retries), or
  refuses with what to do instead.

Users import the transactions from ``fastlease.dynamodb``, which re-exports them. Values are plain
Python (str, int, Decimal, bytes, bool, None, lists, dicts, sets), serialised with boto3's
``TypeSerializer``; boto3 and asyncio load on first use, not with this module.
"""

from __future__ import annotations

import math
from types import TracebackType
from typing import TYPE_CHECKING, Any, Mapping, Optional, Self, Type

from .client import LeaseClient
from .exceptions import StoreRequestRejected, TransactionCanceled
from .stores.base import check_table
from .stores.dynamodb.store import DynamoDBStore

if TYPE_CHECKING:
    from .dynamodb import DynamoDBClient

__all__ = ["SyncTransaction", "Transaction"]

#: DynamoDB's limit on the items of one TransactWriteItems request.
MAX_TRANSACTION_ITEMS = 100
_KEY_TYPES = ("S", "N", "B")  # the attribute types a table's key may have
_Names = Optional[Mapping[str, str]]  # ExpressionAttributeNames: {"#s": "status"}
_Values = Optional[Mapping[str, Any]]  # ExpressionAttributeValues, plain Python: {":s": "paid"}


# ---- the constructor's pydynox arguments ----------------------------------------------------------
#: pydynox 1.8.0 constructor arguments with no counterpart here, and what to do instead.
_PYDYNOX_ONLY = {
    "role_arn": "assume the role with boto3 (sts.assume_role, or a profile with role_arn in ~/.aws/config and "
                "profile=...) and pass session=",
    "role_session_name": "see role_arn",
    "external_id": "see role_arn",
    "proxy_url": "pass a boto3 client made with botocore.config.Config(proxies=...)",
    "rate_limit": "lock requests are two writes per hold and need no client-side rate limit",
    "diagnostics": "see fastlease.otel for metrics and traces",
}


def refuse_pydynox_only(engine: Mapping[str, Any]) -> None:
    """TypeError for a pydynox constructor argument that ``DynamoDBClient`` does not take, saying what
    to do instead (rather than the engine's complaint about an unknown keyword)."""
    for name in engine:
        if name in _PYDYNOX_ONLY:
            raise TypeError(f"DynamoDBClient has no {name}= (a pydynox argument): {_PYDYNOX_ONLY[name]}")


def botocore_config(connect_timeout: Optional[float], read_timeout: Optional[float],
                    max_retries: Optional[int]) -> Any:
    """pydynox's timeouts and retries as a botocore Config for your boto3 client (the helpers and
    transactions): lock requests keep their own bounds, min(lease/3, 5 s), and never retry. None if
    none is given."""
    if connect_timeout is None and read_timeout is None and max_retries is None:
        return None
    from botocore.config import Config

    settings: dict[str, Any] = {}
    for name, value in (("connect_timeout", connect_timeout), ("read_timeout", read_timeout)):
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
            settings[name] = value
    if max_retries is not None:
        if type(max_retries) is not int or max_retries < 0:
            raise ValueError(f"max_retries must be an int of at least 0, got {max_retries!r}")
        settings["retries"] = {"max_attempts": max_retries, "mode": "standard"}
    return Config(**settings)


# ---- tables: DynamoDBClient's sync_table_exists, sync_create_table, sync_delete_table ------------
def sync_table_exists(client: DynamoDBClient, name: str) -> bool:
    """Any table (not only lock tables): True if it exists."""
    return client.lock_table_exists(name)


def sync_create_table(client: DynamoDBClient, name: str, partition_key: tuple[str, str],
                      sort_key: Optional[tuple[str, str]] = None, *, wait: bool = True,
                      timeout_seconds: Optional[float] = None) -> None:
    """Create an on-demand table keyed by ``partition_key`` and, if given, ``sort_key``: each a (name,
    type) pair, type ``"S"``, ``"N"`` or ``"B"``, e.g. ``sync_create_table("orders", ("pk", "S"), ("sk",
    "N"))``. ``wait`` (True by default, unlike pydynox) returns once the table is active, polling each
    second for at most ``timeout_seconds`` (25 s by default). A table that exists already with this key
    schema is fine; one with another raises StoreRequestRejected, naming both schemas."""
    check_table(name)
    partition = _key_attribute("partition_key", partition_key)
    keys = [(partition, "HASH")]
    if sort_key is not None:
        sort = _key_attribute("sort_key", sort_key)
        if sort[0] == partition[0]:
            raise ValueError(f"sort_key must name another attribute than partition_key, both are {sort[0]!r}")
        keys.append((sort, "RANGE"))
    _check_wait(wait, timeout_seconds)
    boto3_client = client.boto3_client
    try:
        boto3_client.create_table(
            TableName=name,
            AttributeDefinitions=[{"AttributeName": attribute, "AttributeType": kind}
                                  for (attribute, kind), _ in keys],
            KeySchema=[{"AttributeName": attribute, "KeyType": role} for (attribute, _), role in keys],
            BillingMode="PAY_PER_REQUEST",
        )
    except boto3_client.exceptions.ResourceInUseException:
        # It exists already (a second run of a deployment script): fine if it has this key schema.
        existing = _key_schema(boto3_client.describe_table(TableName=name)["Table"])
        wanted = [(attribute, kind, role) for (attribute, kind), role in keys]
        if existing != wanted:
            raise StoreRequestRejected(
                f"DynamoDB table {name!r} already exists with key schema {_schema_text(existing)}, not "
                f"{_schema_text(wanted)}: use another table name, or delete that table first"
            ) from None
    if wait:
        _wait_for(client, "table_exists", name, timeout_seconds)


def sync_delete_table(client: DynamoDBClient, name: str, *, wait: bool = True,
                      timeout_seconds: Optional[float] = None) -> None:
    """Delete a table, whatever it holds (a lock table's leases too). ``wait`` (True by default, unlike
    pydynox) returns once it is gone, polling each second for at most ``timeout_seconds`` (25 s by
    default). A missing table raises boto3's ``ResourceNotFoundException``."""
    check_table(name)
    _check_wait(wait, timeout_seconds)
    client.boto3_client.delete_table(TableName=name)
    if wait:
        _wait_for(client, "table_not_exists", name, timeout_seconds)


def _wait_for(client: DynamoDBClient, waiter: str, name: str, timeout_seconds: Optional[float]) -> None:
    """Poll DescribeTable each second until botocore's ``waiter`` is satisfied."""
    config = {"Delay": 1, "MaxAttempts": 25 if timeout_seconds is None else max(1, math.ceil(timeout_seconds))}
    client.boto3_client.get_waiter(waiter).wait(TableName=name, WaiterConfig=config)


def _key_attribute(argument: str, pair: Any) -> tuple[str, str]:
    """A table key's ``(name, type)`` pair, checked, as pydynox's ``partition_key``/``sort_key`` take it."""
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        raise TypeError(f"{argument} must be a (name, type) pair such as ('id', 'S'), got {pair!r:.80}")
    attribute, kind = pair
    if type(attribute) is not str or not attribute:
        raise TypeError(f"{argument} name must be a non-empty str, got {attribute!r:.80}")
    if type(kind) is not str or kind not in _KEY_TYPES:
        label = argument.replace("_", " ")
        raise ValueError(f"{label} type must be 'S', 'N' or 'B' (string, number, binary), got {kind!r:.80}")
    return attribute, kind


def _key_schema(description: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(attribute, type, HASH or RANGE) of a DescribeTable result's key, partition key first."""
    types = {item["AttributeName"]: item["AttributeType"] for item in description.get("AttributeDefinitions", [])}
    schema = sorted(description.get("KeySchema", []), key=lambda item: item["KeyType"] != "HASH")
    return [(item["AttributeName"], types.get(item["AttributeName"], "?"), item["KeyType"]) for item in schema]


def _schema_text(schema: list[tuple[str, str, str]]) -> str:
    return " + ".join(f"{attribute} ({kind}, {'partition' if role == 'HASH' else 'sort'} key)"
                      for attribute, kind, role in schema)


def _check_wait(wait: bool, timeout_seconds: Optional[float]) -> None:
    """The table helpers check these before their request, so that bad input sends nothing."""
    if type(wait) is not bool:
        raise TypeError(f"wait must be True or False, got {wait!r:.80}")
    if timeout_seconds is None:
        return
    if isinstance(timeout_seconds, bool) or not isinstance(timeout_seconds, (int, float)):
        raise TypeError(f"timeout_seconds must be a number of seconds or None, got {timeout_seconds!r:.80}")
    if not 0 < timeout_seconds < math.inf:
        raise ValueError(f"timeout_seconds must be positive and finite, got {timeout_seconds!r:.80}")


# ---- items: DynamoDBClient's sync_get_item, sync_put_item, sync_delete_item and their async forms --
def sync_get_item(client: DynamoDBClient, table: str, key: Mapping[str, Any],
                  consistent_read: bool = True) -> Optional[dict[str, Any]]:
    """One item as plain Python values (numbers as ``Decimal``), or None if absent. The read is
    strongly consistent unless ``consistent_read=False`` (pydynox reads eventually consistent by default)."""
    check_table(table)
    if type(consistent_read) is not bool:
        raise TypeError(f"consistent_read must be True or False, got {consistent_read!r:.80}")
    response = client.boto3_client.get_item(TableName=table, Key=_to_wire("key", key), ConsistentRead=consistent_read)
    item = response.get("Item")
    return None if item is None else _from_wire(item)


def sync_put_item(client: DynamoDBClient, table: str, item: Mapping[str, Any],
                  condition_expression: Optional[str] = None, expression_attribute_names: _Names = None,
                  expression_attribute_values: _Values = None) -> None:
    """Write a whole item (plain Python values), replacing any item with its key. If the condition is
    false, boto3's ``ConditionalCheckFailedException`` (``client.boto3_client.exceptions``) is raised
    and nothing is written. Returns None (pydynox returns its request metrics)."""
    check_table(table)
    client.boto3_client.put_item(**_expressions(
        {"TableName": table, "Item": _to_wire("item", item)},
        condition_expression, expression_attribute_names, expression_attribute_values))


def sync_delete_item(client: DynamoDBClient, table: str, key: Mapping[str, Any],
                     condition_expression: Optional[str] = None, expression_attribute_names: _Names = None,
                     expression_attribute_values: _Values = None) -> None:
    """Delete the item with this key (a missing item is no error). If the condition is false, boto3's
    ``ConditionalCheckFailedException`` is raised and nothing is deleted. Returns None."""
    check_table(table)
    client.boto3_client.delete_item(**_expressions(
        {"TableName": table, "Key": _to_wire("key", key)},
        condition_expression, expression_attribute_names, expression_attribute_values))


# The async forms call the sync ones through the client, not directly, so that a subclass's override
# of a sync helper is what its async form runs too. They import the off-loop runner when first called:
# it brings asyncio, which `import fastlease.dynamodb` does not load.
async def get_item(client: DynamoDBClient, table: str, key: Mapping[str, Any],
                   consistent_read: bool = True) -> Optional[dict[str, Any]]:
    """The async form of :meth:`sync_get_item`, run on the client's worker threads."""
    from ._offloop import run_to_completion

    return await run_to_completion(client, client.sync_get_item, table, key, consistent_read)


async def put_item(client: DynamoDBClient, table: str, item: Mapping[str, Any],
                   condition_expression: Optional[str] = None, expression_attribute_names: _Names = None,
                   expression_attribute_values: _Values = None) -> None:
    """The async form of :meth:`sync_put_item`; cancelling the caller does not stop a request once sent."""
    from ._offloop import run_to_completion

    await run_to_completion(client, client.sync_put_item, table, item, condition_expression,
                            expression_attribute_names, expression_attribute_values)


async def delete_item(client: DynamoDBClient, table: str, key: Mapping[str, Any],
                      condition_expression: Optional[str] = None, expression_attribute_names: _Names = None,
                      expression_attribute_values: _Values = None) -> None:
    """The async form of :meth:`sync_delete_item`; cancelling the caller does not stop a request once sent."""
    from ._offloop import run_to_completion

    await run_to_completion(client, client.sync_delete_item, table, key, condition_expression,
                            expression_attribute_names, expression_attribute_values)


# ---- plain values and expressions on the wire, for the item helpers and the transactions ----------
def _to_wire(what: str, values: Any) -> dict[str, Any]:
    """Plain Python values as DynamoDB's typed ones (boto3's ``TypeSerializer``)."""
    from boto3.dynamodb.types import TypeSerializer

    if not isinstance(values, Mapping):
        raise TypeError(f"{what} must be a mapping of attribute names to values, got {type(values).__name__}: "
                        f"{values!r:.80}")
    serialize = TypeSerializer().serialize
    return {name: serialize(value) for name, value in values.items()}


def _from_wire(item: Mapping[str, Any]) -> dict[str, Any]:
    from boto3.dynamodb.types import TypeDeserializer

    deserialize = TypeDeserializer().deserialize
    return {name: deserialize(value) for name, value in item.items()}


def _expressions(params: dict[str, Any], condition: Optional[str], names: _Names, values: _Values) -> dict[str, Any]:
    """Add a condition expression and its placeholders to a request's (or transaction item's) parameters."""
    if condition is not None:
        if type(condition) is not str:
            raise TypeError(f"the condition expression must be a str, got {type(condition).__name__}: "
                            f"{condition!r:.80}")
        params["ConditionExpression"] = condition
    if names:
        if not isinstance(names, Mapping):
            raise TypeError(f"expression attribute names must be a mapping such as {{'#s': 'status'}}, got "
                            f"{type(names).__name__}: {names!r:.80}")
        params["ExpressionAttributeNames"] = dict(names)
    if values:
        params["ExpressionAttributeValues"] = _to_wire("expression attribute values", values)
    return params


def _either(ours: str, value: Any, theirs: str, alias: Any) -> Any:
    """One argument, under fastlease's keyword or pydynox's, not both."""
    if alias is None:
        return value
    if value is not None:
        raise TypeError(f"pass {ours} or {theirs}, not both")
    return alias


def _targets_lock_item(table: str, plain_key: Any, lock_table: str, lock_key: str) -> bool:
    """Does an operation on ``table`` with this key (or item, as plain values) address the lock row?"""
    return table == lock_table and isinstance(plain_key, dict) and plain_key.get("key") == lock_key


# ---- transactions ----------------------------------------------------------------------------------
class SyncTransaction:
    """Collects TransactWriteItems entries and commits them when the ``with`` block exits cleanly."""

    def __init__(self, client: DynamoDBClient) -> None:
        # A DynamoDBClient is the lease client on the DynamoDB store. It is recognised by that store, not
        # by its class: fastlease.dynamodb imports this module, so this module cannot import it back.
        if not (isinstance(client, LeaseClient) and isinstance(client.store, DynamoDBStore)):
            raise TypeError(f"SyncTransaction needs a DynamoDBClient, got {type(client).__name__}")
        self.client = client
        self._items: list[dict[str, Any]] = []
        self._targets: list[tuple[str, str, Any]] = []  # (operation, table, plain key) per item
        self._lock_checks: dict[tuple[str, str], tuple[int, Any]] = {}  # (table, key) -> (item index, lease)
        self._committed = False

    # ---- building ------------------------------------------------------------------------------
    def _add(self, operation: str, table: str, plain_key: Any, body: dict[str, Any]) -> None:
        if self._committed:
            raise RuntimeError("this transaction was already committed")
        if len(self._items) >= MAX_TRANSACTION_ITEMS:
            raise ValueError(f"a transaction holds at most {MAX_TRANSACTION_ITEMS} items")
        self._refuse_lock_item(table, plain_key)
        self._items.append({operation: body})
        self._targets.append((operation, table, plain_key))

    def _refuse_lock_item(self, table: str, plain_key: Any) -> None:
        for lock_table, lock_key in self._lock_checks:
            if _targets_lock_item(table, plain_key, lock_table, lock_key):
                raise ValueError(
                    f"the transaction already checks the lease on {lock_key!r} in {lock_table!r}: "
                    "it must not contain another operation on the lock item"
                )

    # Each operation takes its condition, names and values positionally, in pydynox's order, or by
    # keyword: fastlease's (condition=, names=, values=) or pydynox's (condition_expression=, ...).
    def put(self, table: str, item: Mapping[str, Any], condition: Optional[str] = None, names: _Names = None,
            values: _Values = None, *, condition_expression: Optional[str] = None,
            expression_attribute_names: _Names = None, expression_attribute_values: _Values = None) -> None:
        """Put a whole item (plain Python values)."""
        self._operation("Put", table, item, {"Item": _to_wire("item", item)}, condition, names, values,
                        condition_expression, expression_attribute_names, expression_attribute_values)

    def update(self, table: str, key: Mapping[str, Any], update: Optional[str] = None,
               condition: Optional[str] = None, names: _Names = None, values: _Values = None, *,
               update_expression: Optional[str] = None, condition_expression: Optional[str] = None,
               expression_attribute_names: _Names = None, expression_attribute_values: _Values = None) -> None:
        """Apply an UpdateExpression (``update``, or pydynox's ``update_expression``) to the item with this key."""
        update = _either("update", update, "update_expression", update_expression)
        if type(update) is not str:
            raise TypeError(f"update() needs the update expression as a str, such as 'SET #n = :n', got {update!r:.80}")
        self._operation("Update", table, key, {"Key": _to_wire("key", key), "UpdateExpression": update},
                        condition, names, values,
                        condition_expression, expression_attribute_names, expression_attribute_values)

    def delete(self, table: str, key: Mapping[str, Any], condition: Optional[str] = None, names: _Names = None,
               values: _Values = None, *, condition_expression: Optional[str] = None,
               expression_attribute_names: _Names = None, expression_attribute_values: _Values = None) -> None:
        """Delete the item with this key."""
        self._operation("Delete", table, key, {"Key": _to_wire("key", key)}, condition, names, values,
                        condition_expression, expression_attribute_names, expression_attribute_values)

    def condition_check(self, table: str, key: Mapping[str, Any], condition: Optional[str] = None,
                        names: _Names = None, values: _Values = None, *, condition_expression: Optional[str] = None,
                        expression_attribute_names: _Names = None, expression_attribute_values: _Values = None) -> None:
        """Require a condition (``condition``, or pydynox's ``condition_expression``) on an item without writing it."""
        if condition is None and condition_expression is None:
            raise TypeError("condition_check() needs the condition expression, such as 'attribute_exists(#k)'")
        self._operation("ConditionCheck", table, key, {"Key": _to_wire("key", key)}, condition, names, values,
                        condition_expression, expression_attribute_names, expression_attribute_values)

    def _operation(self, operation: str, table: str, plain_key: Mapping[str, Any], body: dict[str, Any],
                   condition: Optional[str], names: _Names, values: _Values, condition_expression: Optional[str],
                   expression_attribute_names: _Names, expression_attribute_values: _Values) -> None:
        """Add one item: its condition, names and values under fastlease's keywords or pydynox's."""
        body = _expressions({"TableName": table, **body},
                            _either("condition", condition, "condition_expression", condition_expression),
                            _either("names", names, "expression_attribute_names", expression_attribute_names),
                            _either("values", values, "expression_attribute_values", expression_attribute_values))
        self._add(operation, table, dict(plain_key), body)

    def _add_lock_check(self, lease: Any, check: dict[str, Any]) -> None:
        """Called by ``lease.check_in``: one ConditionCheck per lease, and no other op on its item."""
        table, key = lease.table, lease.key
        if (table, key) in self._lock_checks:
            raise ValueError(f"the lease on {key!r} is already checked in to this transaction")
        for operation, target_table, plain_key in self._targets:
            if _targets_lock_item(target_table, plain_key, table, key):
                raise ValueError(f"the transaction already has a {operation} on the lock item {key!r}: it must not")
        self._add("ConditionCheck", table, {"key": key}, check)
        self._lock_checks[(table, key)] = (len(self._items) - 1, lease)

    # ---- committing ----------------------------------------------------------------------------
    @property
    def committed(self) -> bool:
        """True once ``commit()`` has run (its request sent, or nothing to send)."""
        return self._committed

    def commit(self) -> None:
        """Send TransactWriteItems (nothing is sent for an empty transaction)."""
        if self._committed:
            raise RuntimeError("this transaction was already committed")
        self._committed = True
        if not self._items:
            return
        boto3_client = self.client.boto3_client
        try:
            boto3_client.transact_write_items(TransactItems=self._items)
        except boto3_client.exceptions.TransactionCanceledException as error:
            failure = self._canceled(error)  # chained as failure <- ... <- botocore's error
        else:
            return
        raise failure

    def _canceled(self, error: Any) -> BaseException:
        reasons = error.response.get("CancellationReasons") or []
        failed = []
        for index, reason in enumerate(reasons):
            code = str(reason.get("Code", "None"))
            if code != "None" and index < len(self._targets):
                operation, table, key = self._targets[index]
                failed.append((index, operation, table, key, code))
        detail = "; ".join(f"item {i} ({op} on {table} {key!r}): {code}" for i, op, table, key, code in failed)
        canceled = TransactionCanceled(f"transaction canceled: {detail or error}", failed_items=failed)
        canceled.__cause__ = error
        checks_by_index = {index: lease for index, lease in self._lock_checks.values()}
        lost = [checks_by_index[i] for i, _, _, _, code in failed
                if code == "ConditionalCheckFailed" and i in checks_by_index]
        # Every lease the store just proved lost learns it; the first one's LockLost is raised.
        lock_lost: list[BaseException] = [lease.lost_to_store(f"no longer held at commit: {detail}") for lease in lost]
        if lock_lost:
            lock_lost[0].__cause__ = canceled  # LockLost <- TransactionCanceled <- botocore's error
            return lock_lost[0]
        return canceled

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 traceback: Optional[TracebackType]) -> None:
        if exc is None:
            self.commit()


class Transaction(SyncTransaction):
    """The async form: ``async with Transaction(client) as tx:``; commits in a worker thread."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                        traceback: Optional[TracebackType]) -> None:
        if exc is None:
            from ._offloop import run_to_completion

            await run_to_completion(self.client, self.commit)
