"""DynamoDB store: protocol v1 rows through boto3, wire-compatible with pydynox 1.8.0.

Each of the five ``LockStore`` operations is a single conditional request (docs/protocol.md, "DynamoDB requests"):

=================  ==========================================  ==========================================
operation          request                                     condition
=================  ==========================================  ==========================================
put_if_absent      PutItem (full row)                          ``attribute_not_exists(#key)``
replace_if         PutItem (full row, new lease)               ``#owner = :owner AND #version = :version``
update_version_if  UpdateItem ``SET #version = :new_version``  ``#owner = :owner AND #version = :version``
delete_if_owner    DeleteItem                                  ``#owner = :owner``
read               GetItem ``ConsistentRead=True``             -
=================  ==========================================  ==========================================

With ``fencing=True`` the two acquisition writes are one TransactWriteItems each instead: the PutItem
above, and the raise of the key's fencing counter (``_fenced_put``).

Requests go through a *transport* (plain boto3 here; the fast path lives beside it) that sends one
request with no SDK retries and a per-request timeout, and classifies failures:

* a conditional check failure is a lost race, returned as ``False``;
* throttling and refused connections are ``StoreError(maybe_committed=False)``: nothing was applied;
* timeouts after sending, dropped connections and 5xx are ``StoreError(maybe_committed=True)``: the
  engine reconciles them with a consistent read;
* anything else (missing table, access denied, validation) is ``StoreRequestRejected``: waiting will
  not fix it, so the engine does not retry it.
"""

from __future__ import annotations

import base64
import binascii
import functools
import logging
import time
from typing import Any, Optional

from ...exceptions import MalformedLockRow, StoreError, StoreRequestRejected
from .._digest import constructor
from ..base import DELETED, DELETED_WITH_WAITERS, NO_USAGE, NOT_DELETED, LockRow, Record, UsageMeter, outcome_for_log
from .bodies import Body, Shape, as_params
from .transport import SERVER_ERROR_CODES, THROTTLING_CODES, Boto3Transport, ServiceError

__all__ = ["DynamoDBStore", "Boto3Transport", "condition_check", "record_item"]

_log = logging.getLogger("fastlease.stores.dynamodb")

PROTOCOL_V1 = "1"

#: Acquire: the key is free. pydynox's rows use the same names, so the two libraries exclude each other.
ACQUIRE_CONDITION = "attribute_not_exists(#key)"
#: Takeover and renew: the row still holds exactly the owner and version we observed or hold.
OWNER_AND_VERSION_CONDITION = "#owner = :owner AND #version = :version"
#: Renew changes only the version; lease_ms is the owner's and is never rewritten.
RENEW_UPDATE = "SET #version = :new_version"
#: Release and check_in: the row's owner is this acquisition's unique owner id.
OWNER_CONDITION = "#owner = :owner"
#: A contender's turn-taking hint on the holder's row: set once per hold, nothing else changes. Renewal
#: keeps it (it sets only the version); release returns it (ReturnValues ALL_OLD, no extra request).
WAITING_CONDITION = "#owner = :owner AND #version = :version AND attribute_not_exists(#waiting)"
WAITING_UPDATE = "SET #waiting = :waiting"

#: Fencing (a client made with ``fencing=True``): each key's counter is an item of the lock table under
#: FENCE_KEY_PREFIX + the SHA-256 of the key (user keys cannot begin with NUL: ``check_key``). An
#: acquisition or takeover writes its row and raises the counter in one TransactWriteItems, and only
#: to a higher value, so tokens increase however the value was chosen (docs/protocol.md, "Fencing tokens").
FENCE_KEY_PREFIX = "\x00fence\x00"
FENCE_CONDITION = "attribute_not_exists(#fence) OR #fence < :fence"
FENCE_UPDATE = "SET #fence = :fence"
#: Counters remembered per store (the last value seen of each key's), oldest forgotten first: a
#: forgotten one costs at most one cancelled transaction when the clock's guess falls short.
FENCES_REMEMBERED = 4096

# (Not hashlib: the renewal process imports this module, and hashlib would load OpenSSL there: _digest.)
_sha256 = constructor("sha256")

_KEY_NAME = {"#key": "key"}
_FENCE_NAMES = {"#fence": "fence"}
_OWNER_VERSION_NAMES = {"#owner": "owner", "#version": "version"}
_OWNER_NAMES = {"#owner": "owner"}
_WAITING_NAMES = {"#owner": "owner", "#version": "version", "#waiting": "waiting"}


def rejection(error: ServiceError, operation: str, key: str, tables: list[Any]) -> StoreRequestRejected:
    """The StoreRequestRejected for an error response that waiting cannot fix, naming the table(s);
    for a missing table, how to create it (lock operations never create tables)."""
    named = " or ".join(repr(table) for table in dict.fromkeys(tables) if table)
    if error.code == "ResourceNotFoundException":
        return missing_table(named, f"{operation} on {key!r}: {error}", key)
    return StoreRequestRejected(f"DynamoDB rejected {operation} on {key!r} in table {named}: {error}", key=key)


def missing_table(named: str, detail: str, key: Optional[str] = None) -> StoreRequestRejected:
    """The one message for a DynamoDB table that does not exist (``named``: its quoted name or names),
    for a lock operation and for the operator's reads alike: how to create it."""
    return StoreRequestRejected(
        f"DynamoDB table {named} does not exist ({detail}). Create it once, at deployment: "
        "client.create_lock_table(name) for a lock table, client.create_idempotency_table(name) for "
        "idempotency records (and their lock table); or `fastlease create-table NAME` for a lock table", key=key)




@functools.lru_cache(maxsize=FENCES_REMEMBERED)
def fence_key(key: str) -> str:
    """The key of the item that holds ``key``'s fencing counter, in the same table (remembered: it is
    in every fenced acquisition)."""
    digest: str = _sha256(key.encode("utf-8")).hexdigest()
    return FENCE_KEY_PREFIX + digest


def _row_item(key: str, owner: str, version: str, lease_ms: str) -> dict[str, Any]:
    return {
        "key": {"S": key},
        "owner": {"S": owner},
        "version": {"S": version},
        "lease_ms": {"N": lease_ms},
        "protocol": {"N": PROTOCOL_V1},
    }


# ---- the hot requests' shapes (bodies.py): each built by one function of its string values -----------
def _acquire_put(table: str, key: str, owner: str, version: str, lease_ms: str) -> dict[str, Any]:
    return {
        "TableName": table,
        "Item": _row_item(key, owner, version, lease_ms),
        "ConditionExpression": ACQUIRE_CONDITION,
        "ExpressionAttributeNames": _KEY_NAME,
    }


def _takeover_put(table: str, key: str, owner: str, version: str, lease_ms: str, expected_owner: str,
                  expected_version: str) -> dict[str, Any]:
    return {
        "TableName": table,
        "Item": _row_item(key, owner, version, lease_ms),
        "ConditionExpression": OWNER_AND_VERSION_CONDITION,
        "ExpressionAttributeNames": _OWNER_VERSION_NAMES,
        "ExpressionAttributeValues": {":owner": {"S": expected_owner}, ":version": {"S": expected_version}},
    }


def _alone(put: dict[str, Any]) -> dict[str, Any]:
    """A PutItem's parameters, sent alone."""
    put["ReturnConsumedCapacity"] = "TOTAL"
    return put


def _fenced(put: dict[str, Any], token: str, counter_key: str) -> dict[str, Any]:
    """``put`` with the fencing token in its row, and the raise of the key's counter (item
    ``counter_key``) to it, only if lower: one TransactWriteItems."""
    put["Item"]["fence"] = {"N": token}
    counter = {
        "TableName": put["TableName"],
        "Key": {"key": {"S": counter_key}},
        "UpdateExpression": FENCE_UPDATE,
        "ConditionExpression": FENCE_CONDITION,
        "ExpressionAttributeNames": _FENCE_NAMES,
        "ExpressionAttributeValues": {":fence": {"N": token}},
        "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
    }
    return {"TransactItems": [{"Put": put}, {"Update": counter}], "ReturnConsumedCapacity": "TOTAL"}


def _renewal(table: str, key: str, owner: str, version: str, new_version: str) -> dict[str, Any]:
    return {
        "TableName": table,
        "Key": {"key": {"S": key}},
        "UpdateExpression": RENEW_UPDATE,
        "ConditionExpression": OWNER_AND_VERSION_CONDITION,
        "ExpressionAttributeNames": _OWNER_VERSION_NAMES,
        "ExpressionAttributeValues": {":owner": {"S": owner}, ":version": {"S": version},
                                      ":new_version": {"S": new_version}},
        "ReturnConsumedCapacity": "TOTAL",
    }


def _release(table: str, key: str, owner: str) -> dict[str, Any]:
    return {
        "TableName": table,
        "Key": {"key": {"S": key}},
        "ConditionExpression": OWNER_CONDITION,
        "ExpressionAttributeNames": _OWNER_NAMES,
        "ExpressionAttributeValues": {":owner": {"S": owner}},
        "ReturnValues": "ALL_OLD",  # the deleted row's waiting hint, at no extra cost
        "ReturnConsumedCapacity": "TOTAL",
    }


def _consistent_read(table: str, key: str) -> dict[str, Any]:
    return {"TableName": table, "Key": {"key": {"S": key}}, "ConsistentRead": True, "ReturnConsumedCapacity": "TOTAL"}


def _acquire(table: str, key: str, owner: str, version: str, lease_ms: str) -> dict[str, Any]:
    return _alone(_acquire_put(table, key, owner, version, lease_ms))


def _fenced_acquire(table: str, key: str, owner: str, version: str, lease_ms: str, token: str,
                    counter_key: str) -> dict[str, Any]:
    return _fenced(_acquire_put(table, key, owner, version, lease_ms), token, counter_key)


def _takeover(table: str, key: str, owner: str, version: str, lease_ms: str, expected_owner: str,
              expected_version: str) -> dict[str, Any]:
    return _alone(_takeover_put(table, key, owner, version, lease_ms, expected_owner, expected_version))


def _fenced_takeover(table: str, key: str, owner: str, version: str, lease_ms: str, expected_owner: str,
                     expected_version: str, token: str, counter_key: str) -> dict[str, Any]:
    return _fenced(_takeover_put(table, key, owner, version, lease_ms, expected_owner, expected_version), token,
                   counter_key)


ACQUIRE = Shape(_acquire)
FENCED_ACQUIRE = Shape(_fenced_acquire)
TAKEOVER = Shape(_takeover)
FENCED_TAKEOVER = Shape(_fenced_takeover)
RENEWAL = Shape(_renewal)
RELEASE = Shape(_release)
READ = Shape(_consistent_read)


def _number(item: dict[str, Any], name: str, key: str) -> int:
    value = item.get(name)
    text = value.get("N") if isinstance(value, dict) and len(value) == 1 else None
    if not isinstance(text, str) or not text.isascii() or not text.lstrip("-").isdigit():
        raise MalformedLockRow(f"lock row for {key!r}: {name} must be an integer N attribute, got {value!r}", key=key)
    return int(text)


def _string(item: dict[str, Any], name: str, key: str) -> str:
    value = item.get(name)
    text = value.get("S") if isinstance(value, dict) and len(value) == 1 else None
    if not isinstance(text, str) or not text:
        raise MalformedLockRow(f"lock row for {key!r}: {name} must be a non-empty S attribute, got {value!r}", key=key)
    return text


def _waiting(item: dict[str, Any], key: str) -> bool:
    value = item.get("waiting")
    if value is None:
        return False
    flag = value.get("BOOL") if isinstance(value, dict) and len(value) == 1 else None
    if not isinstance(flag, bool):
        raise MalformedLockRow(f"lock row for {key!r}: waiting must be a BOOL attribute, got {value!r}", key=key)
    return flag


def _int_or_raw(text: Any) -> Any:
    """An N attribute as an int for display; anything else (a malformed row) as stored."""
    return int(text) if isinstance(text, str) and text.lstrip("-").isdigit() else text


def parse_row(item: dict[str, Any], key: str) -> LockRow:
    """Strict parsing of a stored item into a LockRow: missing or mistyped attributes fail closed.
    (Range and protocol checks are the engine's: ``check_row``.)"""
    return LockRow(
        _string(item, "owner", key),
        _string(item, "version", key),
        _number(item, "lease_ms", key),
        _number(item, "protocol", key),
        _waiting(item, key),
        _number(item, "fence", key) if "fence" in item else None,
    )


class DynamoDBStore:
    """The LockStore adapter for DynamoDB; one conditional request per operation, no protocol logic."""

    kind = "dynamodb"  # in stores.registry
    blocking = True  # every request goes over the network

    def __init__(self, transport: Any, fencing: bool = False) -> None:
        self.transport = transport
        #: Acquisitions also raise the key's fencing counter (TransactWriteItems; see FENCE_KEY_PREFIX).
        self.fencing = fencing
        self._fences: dict[tuple[str, str], int] = {}  # (table, key) -> its counter's last value seen

    # ---- the renewal process (fastlease._renewal_link) -------------------------------------------------
    def renewal_config(self) -> Any:
        """The fast path's endpoint, Region and TLS settings for another process, or why not."""
        config = getattr(self.transport, "renewal_config", None)
        if config is None:
            return "plain boto3 lock clients (fast_path=False, or settings the fast path does not take)"
        return (self.kind, *config())

    @classmethod
    def from_renewal_config(cls, config: Any, credentials: Any) -> DynamoDBStore:
        """The store on the fast path that ``renewal_config()`` described, signing with ``credentials``
        (in the renewal process: no boto3)."""
        from .fastpath import FastTransport

        return cls(FastTransport.for_renewal(config, credentials))

    def renewal_credentials(self) -> Any:
        """What the fast path signs with now (re-sent to the renewal process when it changes), or None."""
        credentials = getattr(self.transport, "renewal_credentials", None)
        return credentials() if credentials is not None else None

    def renewal_delegable(self) -> bool:
        """False while another process could not send these requests as this one would (no fast path,
        or a handler such as moto's ``mock_aws`` answers them here)."""
        delegable = getattr(self.transport, "renewal_delegable", None)
        return bool(delegable()) if delegable is not None else False

    def update_credentials(self, credentials: Any) -> None:
        """The holder's refreshed credentials (in the renewal process)."""
        self.transport.update_credentials(credentials)

    def _send(self, operation: str, params: dict[str, Any] | Body, timeout_s: float, usage: UsageMeter,
              key: str) -> Any:
        """Send one request. Returns the response, or None for a failed condition."""
        if type(params) is dict:
            params["ReturnConsumedCapacity"] = "TOTAL"  # (a Body's shape has it)
        try:
            response = self.transport.call(operation, params, timeout_s)
        except ServiceError as error:
            _log.debug("%s %r -> %s", operation, key, error.code)
            if error.code == "ConditionalCheckFailedException":
                return None
            raise self._failure(operation, error, key, [as_params(params).get("TableName")]) from error
        except StoreError as error:
            _log.debug("%s %r -> %s", operation, key, error)
            error.key = key
            raise
        capacity = response.get("ConsumedCapacity")
        if capacity:
            units = float(capacity.get("CapacityUnits", 0.0))
            if operation == "GetItem":
                usage.add_capacity(units, 0.0)
            else:
                usage.add_capacity(0.0, units)
        _log.debug("%s %r -> ok", operation, key)
        return response

    @staticmethod
    def _failure(operation: str, error: ServiceError, key: str, tables: list[Any]) -> Exception:
        """The error for a failed request other than a failed condition: StoreError when waiting can fix
        it (throttling: not applied; server errors: maybe applied), else StoreRequestRejected."""
        if error.code in THROTTLING_CODES:
            return StoreError(f"DynamoDB {operation} throttled: {error}", key=key, maybe_committed=False)
        if error.code in SERVER_ERROR_CODES or error.status >= 500:
            return StoreError(f"DynamoDB {operation} failed: {error}", key=key, maybe_committed=True)
        return rejection(error, operation, key, tables)

    def put_if_absent(
        self, table: str, key: str, owner: str, version: str, lease_ms: int, timeout_s: float, usage: UsageMeter
    ) -> Optional[int]:
        """PutItem of a fresh row on ``attribute_not_exists(#key)``: 0 if written (protocol v1 rows keep
        no fencing token), else None. With fencing, the fencing token if written (``_fenced_put``)."""
        if self.fencing:
            token = self._next_token(table, key)
            body = Body(FENCED_ACQUIRE, table, key, owner, version, str(lease_ms), str(token), fence_key(key))
            return self._fenced_put(table, key, token, body, timeout_s, usage)
        body = Body(ACQUIRE, table, key, owner, version, str(lease_ms))
        return None if self._send("PutItem", body, timeout_s, usage, key) is None else 0

    def replace_if(
        self,
        table: str,
        key: str,
        expected_owner: str,
        expected_version: str,
        owner: str,
        version: str,
        lease_ms: int,
        timeout_s: float,
        usage: UsageMeter,
    ) -> Optional[int]:
        """PutItem of a fresh row on the observed (expected_owner, expected_version): 0 if written (no
        fencing token), else None. With fencing, the fencing token if written (``_fenced_put``)."""
        row = (table, key, owner, version, str(lease_ms), expected_owner, expected_version)
        if self.fencing:
            token = self._next_token(table, key)
            body = Body(FENCED_TAKEOVER, *row, str(token), fence_key(key))
            return self._fenced_put(table, key, token, body, timeout_s, usage)
        return None if self._send("PutItem", Body(TAKEOVER, *row), timeout_s, usage, key) is None else 0

    def _next_token(self, table: str, key: str) -> int:
        """The fencing token to try: the counter's last value seen here plus one, or the wall clock in
        microseconds if higher (a guess, so that a client that never saw this key needs no read first;
        the condition, not the clock, keeps tokens increasing)."""
        return max(self._fences.get((table, key), 0) + 1, time.time_ns() // 1000)

    def _fenced_put(self, table: str, key: str, token: int, body: Body, timeout_s: float,
                    usage: UsageMeter) -> Optional[int]:
        """Send ``body``, one TransactWriteItems (``_fenced``): the row, on its condition, with ``token``
        in it, and the key's counter raised to ``token``, only if it is lower. The token if written;
        None if the row's condition failed, or the counter was already at or above the token: then its
        value, sent back with the cancellation, is remembered, and the engine's next put (after it reads
        the row) uses a higher one."""
        try:
            response = self.transport.call("TransactWriteItems", body, timeout_s)
        except ServiceError as error:
            _log.debug("TransactWriteItems %r -> %s", key, error.code)
            if error.code == "TransactionCanceledException":
                if self._cancelled_by_condition(table, key, error):
                    return None
                raise StoreError(f"DynamoDB TransactWriteItems on {key!r}: {error}", key=key) from error
            raise self._failure("TransactWriteItems", error, key, [table]) from error
        except StoreError as error:
            _log.debug("TransactWriteItems %r -> %s", key, outcome_for_log(error))
            error.key = key
            raise
        for capacity in response.get("ConsumedCapacity") or ():
            usage.add_capacity(0.0, float(capacity.get("CapacityUnits", 0.0)))
        self._remember(table, key, token)
        _log.debug("TransactWriteItems %r -> ok (fence %d)", key, token)
        return token

    def _cancelled_by_condition(self, table: str, key: str, error: ServiceError) -> bool:
        """Whether a cancelled fenced put failed a condition (the row's, or the counter's: its value is
        remembered), rather than on a conflict with another transaction (not applied: try again).
        Without reasons in the response, the message lists the codes in the same order."""
        reasons = error.reasons if isinstance(error.reasons, list) and len(error.reasons) == 2 else None
        if reasons is None:
            return "ConditionalCheckFailed" in error.message
        counter = reasons[1] if isinstance(reasons[1], dict) else {}
        if counter.get("Code") == "ConditionalCheckFailed":
            try:
                self._remember(table, key, int(counter["Item"]["fence"]["N"]))
            except (KeyError, TypeError, ValueError):
                pass  # no value sent back: the next guess is the clock's, later
        return any(isinstance(reason, dict) and reason.get("Code") == "ConditionalCheckFailed" for reason in reasons)

    def _remember(self, table: str, key: str, fence: int) -> None:
        fences = self._fences
        if fence > fences.get((table, key), 0):
            fences[(table, key)] = fence
            if len(fences) > FENCES_REMEMBERED:
                del fences[next(iter(fences))]

    def _update_if_held(
        self, table: str, key: str, owner: str, version: str, update: str, condition: str,
        names: dict[str, str], values: dict[str, Any], timeout_s: float, usage: UsageMeter,
    ) -> bool:
        """One UpdateItem conditioned on the row holding (owner, version) (and ``condition``'s rest)."""
        params = {
            "TableName": table,
            "Key": {"key": {"S": key}},
            "UpdateExpression": update,
            "ConditionExpression": condition,
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": {":owner": {"S": owner}, ":version": {"S": version}, **values},
        }
        return self._send("UpdateItem", params, timeout_s, usage, key) is not None

    def update_version_if(
        self, table: str, key: str, owner: str, version: str, new_version: str, timeout_s: float, usage: UsageMeter,
        lease_ms: int = 0,
    ) -> bool:
        """UpdateItem of the version alone, on (owner, version): True if applied."""
        body = Body(RENEWAL, table, key, owner, version, new_version)
        return self._send("UpdateItem", body, timeout_s, usage, key) is not None

    def mark_waiting(
        self, table: str, key: str, owner: str, version: str, timeout_s: float, usage: UsageMeter
    ) -> bool:
        """UpdateItem setting ``waiting`` once per hold, on (owner, version): True if applied."""
        return self._update_if_held(table, key, owner, version, WAITING_UPDATE, WAITING_CONDITION,
                                    _WAITING_NAMES, {":waiting": {"BOOL": True}}, timeout_s, usage)

    def delete_if_owner(
        self, table: str, key: str, owner: str, timeout_s: float, usage: UsageMeter
    ) -> int:
        """DeleteItem on the owner, returning the old item for its ``waiting`` hint: ``DELETED`` or
        ``DELETED_WITH_WAITERS``, else ``NOT_DELETED``."""
        response = self._send("DeleteItem", Body(RELEASE, table, key, owner), timeout_s, usage, key)
        if response is None:
            return NOT_DELETED
        # The row is deleted either way, so a garbled echo of it only loses the hint.
        old = response.get("Attributes") or {}
        return DELETED_WITH_WAITERS if old.get("waiting") == {"BOOL": True} else DELETED

    def read(self, table: str, key: str, timeout_s: float, usage: UsageMeter) -> Optional[LockRow]:
        """Consistent GetItem: the parsed row, or None. A missing or mistyped attribute raises
        MalformedLockRow."""
        response = self._send("GetItem", Body(READ, table, key), timeout_s, usage, key)
        item = response.get("Item")
        if item is None:
            return None
        row = parse_row(item, key)
        if row.fence is not None and row.fence > 0:
            self._remember(table, key, row.fence)  # (the engine refuses a row whose fence is not >= 1)
        return row

    # ---- idempotency records ------------------------------------------------------------------
    #: DynamoDB items are at most 400 KB, attribute names and the key included. The result is kept as
    #: base64 text (an S attribute reads the same through boto3 and the fast path), 4/3 of its size.
    max_result_bytes = 290_000

    def read_record(self, table: str, key: str, timeout_s: float) -> Optional[Record]:
        """Consistent GetItem of the record of ``key`` in table ``table``: the Record, or None;
        MalformedLockRow if the item is not a record."""
        params = {"TableName": table, "Key": {"key": {"S": key}}, "ConsistentRead": True}
        item = self._send("GetItem", params, timeout_s, NO_USAGE, key).get("Item")
        if item is None:
            return None
        try:
            return Record(item["state"]["S"], item["fingerprint"]["S"],
                          base64.b64decode(item["result"]["S"], validate=True), int(item["expires_at_ms"]["N"]),
                          item["owner"]["S"])
        except (KeyError, TypeError, ValueError, binascii.Error) as error:
            raise MalformedLockRow(f"idempotency record of {key!r} in {table!r} is malformed", key=key) from error

    def finish_if_owner(
        self, lock_table: str, key: str, table: str, record: Record, now_ms: int, timeout_s: float
    ) -> bool:
        """One TransactWriteItems: delete the lease row on ``record.owner`` and put the record. False if
        that owner does not hold the lease; StoreError for conflicts and throttling (not applied) and
        server errors (maybe committed)."""
        item = {name: ({"N": str(value)} if isinstance(value, int) else {"S": value})
                for name, value in record_item(key, record).items()}
        params = {"TransactItems": [
            {"Delete": {"TableName": lock_table, "Key": {"key": {"S": key}},
                        "ConditionExpression": OWNER_CONDITION, "ExpressionAttributeNames": dict(_OWNER_NAMES),
                        "ExpressionAttributeValues": {":owner": {"S": record.owner}}}},
            {"Put": {"TableName": table, "Item": item}},
        ]}
        if self.fencing:  # nothing reads an idempotent call's token: its counter goes with the row
            params["TransactItems"].append({"Delete": {"TableName": lock_table, "Key": {"key": {"S": fence_key(key)}}}})
        try:
            self.transport.call("TransactWriteItems", params, timeout_s)
        except ServiceError as error:
            _log.debug("TransactWriteItems %r -> %s", key, error.code)
            if error.code == "TransactionCanceledException" and "ConditionalCheckFailed" in error.message:
                return False
            if error.code in ("TransactionCanceledException", "TransactionConflictException",
                              "TransactionInProgressException", *THROTTLING_CODES):
                raise StoreError(f"DynamoDB TransactWriteItems on {key!r}: {error}", key=key) from error
            if error.code in SERVER_ERROR_CODES or error.status >= 500:
                raise StoreError(f"DynamoDB TransactWriteItems on {key!r} failed: {error}", key=key,
                                 maybe_committed=True) from error
            tables = [next(iter(item.values())).get("TableName") for item in params.get("TransactItems", [])]
            raise rejection(error, "TransactWriteItems", key, tables) from error
        except StoreError as error:  # from the transport: not sent, or no answer
            _log.debug("TransactWriteItems %r -> %s", key, outcome_for_log(error))
            raise
        _log.debug("TransactWriteItems %r -> ok", key)
        return True


def record_item(key: str, record: Record) -> dict[str, Any]:
    """An idempotency record as the item stored (plain values: str and int), for ``finish_if_owner``
    and for a caller's own transaction (``IdempotentCall.complete_in``)."""
    item: dict[str, Any] = {
        "key": key,
        "state": record.state,
        "fingerprint": record.fingerprint,
        "result": base64.b64encode(record.result).decode(),
        "expires_at_ms": record.expires_at_ms,
        "owner": record.owner,
    }
    if record.expires_at_ms:
        item["expires_at"] = record.expires_at_ms // 1000 + 1  # the table's TTL attribute, in seconds
    return item


def condition_check(table: str, key: str, owner: str) -> dict[str, Any]:
    """The raw TransactWriteItems entry that holds only while ``owner`` still owns the row of ``key``."""
    return {
        "ConditionCheck": {
            "TableName": table,
            "Key": {"key": {"S": key}},
            "ConditionExpression": OWNER_CONDITION,
            "ExpressionAttributeNames": dict(_OWNER_NAMES),
            "ExpressionAttributeValues": {":owner": {"S": owner}},
        }
    }
