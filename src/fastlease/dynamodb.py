"""DynamoDB: the client and TransactWriteItems builders for writes that must commit only under a lease.

::

    with SyncDistributedLock(client, table="locks", key="import:daily") as lease:
        with SyncTransaction(client) as tx:
            lease.check_in(tx)                       # ConditionCheck: the row's owner is still ours
            tx.put("import_results", {"job_id": "daily", "summary": "..."})
    # the transaction commits when its block exits without an exception

Values are plain Python (str, int, Decimal, bytes, bool, None, lists, dicts, sets), serialised with
boto3's ``TypeSerializer``. Commits use your own boto3 client and its configuration.
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Any, Mapping, Optional, Type

from .exceptions import LockLost, TransactionCanceled
from .stores.dynamodb import DynamoDBClient, condition_check_item

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["DynamoDBClient", "SyncTransaction", "Transaction", "TransactionCanceled", "condition_check_item"]

MAX_TRANSACTION_ITEMS = 100  # DynamoDB's limit for TransactWriteItems


def _targets_lock_item(table: str, plain_key: Any, lock_table: str, lock_key: str) -> bool:
    """Does an operation on ``table`` with this key (or item, as plain values) address the lock row?"""
    return table == lock_table and isinstance(plain_key, dict) and plain_key.get("key") == lock_key


class SyncTransaction:
    """Collects TransactWriteItems entries and commits them when the ``with`` block exits cleanly."""

    def __init__(self, client: DynamoDBClient) -> None:
        if not isinstance(client, DynamoDBClient):
            raise TypeError(f"SyncTransaction needs a DynamoDBClient, got {type(client).__name__}")
        from boto3.dynamodb.types import TypeSerializer

        self.client = client
        self._serializer = TypeSerializer()
        self._items: list[dict[str, Any]] = []
        self._targets: list[tuple[str, str, Any]] = []  # (operation, table, plain key) per item
        self._lock_checks: dict[tuple[str, str], tuple[int, Any]] = {}  # (table, key) -> (item index, lease)
        self._committed = False

    # ---- building ------------------------------------------------------------------------------
    def _serialize(self, values: Optional[Mapping[str, Any]]) -> dict[str, Any]:
        return {name: self._serializer.serialize(value) for name, value in (values or {}).items()}

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

    def _expressions(self, body: dict[str, Any], condition: Optional[str], names: Optional[Mapping[str, str]],
                     values: Optional[Mapping[str, Any]]) -> dict[str, Any]:
        if condition is not None:
            body["ConditionExpression"] = condition
        if names:
            body["ExpressionAttributeNames"] = dict(names)
        if values:
            body["ExpressionAttributeValues"] = self._serialize(values)
        return body

    def put(self, table: str, item: Mapping[str, Any], *, condition: Optional[str] = None,
            names: Optional[Mapping[str, str]] = None, values: Optional[Mapping[str, Any]] = None) -> None:
        """Put a whole item (plain Python values)."""
        body = {"TableName": table, "Item": self._serialize(item)}
        self._add("Put", table, dict(item), self._expressions(body, condition, names, values))

    def update(self, table: str, key: Mapping[str, Any], update: str, *, condition: Optional[str] = None,
               names: Optional[Mapping[str, str]] = None, values: Optional[Mapping[str, Any]] = None) -> None:
        """Apply an UpdateExpression to the item with this key."""
        body = {"TableName": table, "Key": self._serialize(key), "UpdateExpression": update}
        self._add("Update", table, dict(key), self._expressions(body, condition, names, values))

    def delete(self, table: str, key: Mapping[str, Any], *, condition: Optional[str] = None,
               names: Optional[Mapping[str, str]] = None, values: Optional[Mapping[str, Any]] = None) -> None:
        """Delete the item with this key."""
        body = {"TableName": table, "Key": self._serialize(key)}
        self._add("Delete", table, dict(key), self._expressions(body, condition, names, values))

    def condition_check(self, table: str, key: Mapping[str, Any], condition: str, *,
                        names: Optional[Mapping[str, str]] = None,
                        values: Optional[Mapping[str, Any]] = None) -> None:
        """Require a condition on an item without writing it."""
        body = {"TableName": table, "Key": self._serialize(key)}
        self._add("ConditionCheck", table, dict(key), self._expressions(body, condition, names, values))

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
        for lease in lost:
            lease.note_stolen()  # the lease object learns what the store just proved
        if lost:
            lease = lost[0]
            lock_lost = LockLost(f"lease on {lease.key!r} in {lease.table!r} no longer held at commit: {detail}",
                                 key=lease.key, cause="stolen")
            lock_lost.__cause__ = canceled  # LockLost <- TransactionCanceled <- botocore's error
            return lock_lost
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
            from .aio import _run, _shielded

            # Like every blocking step of the async API: on the client's pool, and not torn off
            # half-sent if the task is cancelled (the commit completes; its outcome is consumed).
            await _shielded(_run(self.client, self.commit))
