"""DynamoDB: the client (the production store) and TransactWriteItems builders for writes that must
commit only under a lease.

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

import logging
import math
import platform
from types import TracebackType
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Self, Type, TypeVar

from .client import LeaseClient, idempotency_lock_table
from .exceptions import StoreConfigurationError, StoreRequestRejected, TransactionCanceled
from .stores.base import check_table
from .stores.dynamodb.store import DynamoDBStore, _int_or_raw, condition_check, missing_table, record_item
from .stores.dynamodb.transport import Boto3Transport, import_boto3

if TYPE_CHECKING:
    from ._engine import Clock

__all__ = ["DynamoDBClient", "SyncTransaction", "Transaction", "TransactionCanceled", "condition_check_item"]

_log = logging.getLogger("fastlease.dynamodb")

MAX_TRANSACTION_ITEMS = 100  # DynamoDB's limit for TransactWriteItems
_KEY_TYPES = ("S", "N", "B")  # the attribute types a table's key may have
_Names = Optional[Mapping[str, str]]  # ExpressionAttributeNames: {"#s": "status"}
_Values = Optional[Mapping[str, Any]]  # ExpressionAttributeValues, plain Python: {":s": "paid"}
_T = TypeVar("_T")


def _user_agent() -> str:
    from ._version import __version__

    return f"fastlease/{__version__} Python/{platform.python_version()}"


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


def _refuse_pydynox_only(engine: dict[str, Any]) -> None:
    for name in engine:
        if name in _PYDYNOX_ONLY:
            raise TypeError(f"DynamoDBClient has no {name}= (a pydynox argument): {_PYDYNOX_ONLY[name]}")


def _pydynox_config(connect_timeout: Optional[float], read_timeout: Optional[float],
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


class DynamoDBClient(LeaseClient):
    """A lease client on DynamoDB (the production store).

    ``DynamoDBClient()`` uses boto3's default session and the normal AWS configuration chain
    (``AWS_ENDPOINT_URL`` included); ``DynamoDBClient(boto3_client)`` uses an existing client's
    Region, endpoint and credentials; ``DynamoDBClient(session=..., endpoint_url=..., region_name=...)``
    builds from a session. Lock requests never use SDK retries and have per-request timeouts of at
    most min(lease/3, 5 s); your own client's configuration is untouched.

    pydynox's constructor arguments work too, so that ported code runs unchanged: ``region`` (for
    ``region_name``), ``access_key``, ``secret_key``, ``session_token`` and ``profile`` (the session's
    credentials), and ``connect_timeout``, ``read_timeout`` and ``max_retries`` (for the boto3 client
    that the helpers and transactions use; not for lock requests). ``role_arn``, ``proxy_url``,
    ``rate_limit`` and ``diagnostics`` raise TypeError saying what to do instead.

    ``fast_path=True`` (the default) sends the lock's own requests through fastlease's request path
    (cached-key SigV4, keep-alive sockets, moto's ``mock_aws`` still honoured). ``fast_path=False``
    uses plain boto3 lock clients: choose it with botocore's Stubber, tracing wrappers around
    botocore, or anything else that must see every request; proxies, client certificates and FIPS or
    dual-stack endpoints select it automatically. Lock operations never create tables: see
    :meth:`create_lock_table`.
    """

    def __init__(
        self,
        boto3_client: Any = None,
        *,
        session: Any = None,
        endpoint_url: Optional[str] = None,
        region_name: Optional[str] = None,
        fast_path: bool = True,
        clock: Optional[Clock] = None,
        region: Optional[str] = None,
        access_key: Optional[str] = None,
        secret_key: Optional[str] = None,
        session_token: Optional[str] = None,
        profile: Optional[str] = None,
        connect_timeout: Optional[float] = None,
        read_timeout: Optional[float] = None,
        max_retries: Optional[int] = None,
        **engine: Any,
    ) -> None:
        boto3 = import_boto3()
        _refuse_pydynox_only(engine)
        if region is not None:
            if region_name is not None and region_name != region:
                raise ValueError(f"region={region!r} and region_name={region_name!r} disagree: pass one of them")
            region_name = region  # pydynox's name for it
        ported = {"access_key": access_key, "secret_key": secret_key, "session_token": session_token,
                  "profile": profile}
        config = _pydynox_config(connect_timeout, read_timeout, max_retries)
        if boto3_client is not None and (session is not None or endpoint_url is not None or region_name is not None
                                         or any(value is not None for value in ported.values()) or config):
            raise ValueError("pass either a boto3 client or the settings to build one (session, endpoint_url, "
                             "region_name, credentials, timeouts), not both")
        if session is not None and any(value is not None for value in ported.values()):
            raise ValueError("pass either session= or credentials (access_key, secret_key, session_token, profile), "
                             "not both: the session has its own")
        if boto3_client is None:
            from botocore.exceptions import NoRegionError

            if session is None:
                session = boto3.session.Session(aws_access_key_id=access_key, aws_secret_access_key=secret_key,
                                                aws_session_token=session_token, profile_name=profile)
            try:
                boto3_client = session.client("dynamodb", endpoint_url=endpoint_url, region_name=region_name,
                                              config=config)
            except NoRegionError:
                raise StoreConfigurationError(
                    "DynamoDBClient needs an AWS Region and none is configured: set AWS_DEFAULT_REGION, "
                    "`region` in ~/.aws/config for your profile, or pass region_name=... (region=... as in pydynox)"
                ) from None
        elif getattr(getattr(boto3_client, "meta", None), "service_model", None) is None or (
            boto3_client.meta.service_model.service_name != "dynamodb"
        ):
            raise TypeError(f"boto3_client must be a boto3 DynamoDB client, got {type(boto3_client).__name__}")
        if type(fast_path) is not bool:
            raise TypeError(f"fast_path must be True or False, got {fast_path!r}")
        _check_credentials(boto3_client)
        self.boto3_client = boto3_client
        transport: Any = None
        if fast_path:
            from .stores.dynamodb.fastpath import FastPathUnavailable, FastTransport

            try:
                transport = FastTransport(boto3_client, _user_agent())
            except FastPathUnavailable as reason:
                _log.debug("lock requests use plain boto3: %s", reason)
        if transport is None:
            transport = Boto3Transport(self._lock_client_factory())
        super().__init__(DynamoDBStore(transport), clock=clock, **engine)

    @property
    def transport(self) -> str:
        """``"fast"`` for fastlease's own request path, ``"boto3"`` for plain boto3 lock clients."""
        return str(self.store.transport.name)

    def close(self) -> None:
        super().close()
        close = getattr(self.store.transport, "close", None)
        if close is not None:
            close()

    def _observation_scope(self) -> str:
        # The same table name in another Region or endpoint is another table.
        return f"dynamodb:{self.region_name}:{self.endpoint_url}"

    @property
    def region_name(self) -> str:
        """The Region of your boto3 client, where the lock requests go too."""
        return str(self.boto3_client.meta.region_name)

    @property
    def endpoint_url(self) -> str:
        """The endpoint URL of your boto3 client, which the lock requests use too."""
        return str(self.boto3_client.meta.endpoint_url)

    def _lock_client_factory(self) -> Callable[[float], Any]:
        """Lock clients share the user client's Region, endpoint and (refreshing) credentials, but
        have retries off and timeouts bounded by their bucket."""
        import botocore.session
        from botocore.config import Config

        user = self.boto3_client
        credentials = user._request_signer._credentials  # the same provider object: refreshes are shared

        def make(timeout_s: float) -> Any:
            config = user.meta.config.merge(
                Config(
                    retries={"total_max_attempts": 1, "mode": "standard"},
                    connect_timeout=timeout_s,
                    read_timeout=timeout_s,
                    tcp_keepalive=True,
                )
            )
            client = botocore.session.get_session().create_client(
                "dynamodb",
                region_name=user.meta.region_name,
                endpoint_url=user.meta.endpoint_url,
                aws_access_key_id="placeholder",  # replaced below by the shared provider
                aws_secret_access_key="placeholder",
                config=config,
            )
            client._request_signer._credentials = credentials
            return client

        return make

    # ---- tables (deployment-time helpers; lock operations never call these) ----------------------
    def create_lock_table(self, name: str, *, wait: bool = True) -> None:
        """Create a lock table: string partition key ``key``, no sort key, on-demand, TTL disabled. An
        existing table with that key schema is fine (a rerun); another schema raises StoreRequestRejected."""
        self.sync_create_table(name, partition_key=("key", "S"), wait=wait)

    def create_idempotency_table(self, name: str, *, lock_table: Optional[str] = None, wait: bool = True) -> None:
        """Create what ``@idempotent(client, table=name)`` needs: the record table, partition key ``key``,
        on-demand, with DynamoDB's TTL on ``expires_at`` (Unix seconds) so expired records are deleted
        for free; and the lock table of its in-flight leases, ``lock_table`` (default ``<name>_locks``),
        as :meth:`create_lock_table` makes it. Both names are checked before either is created, and the
        lock table is made only once the record table is right. Existing
        tables with those schemas are fine (a rerun); anything else raises StoreRequestRejected."""
        locks = idempotency_lock_table(self.engine_module, name, lock_table)
        self._create_record_table(name, wait)
        self.create_lock_table(locks, wait=wait)  # (after the record table, whose TTL check may refuse it)

    def _create_record_table(self, name: str, wait: bool) -> None:
        self.sync_create_table(name, partition_key=("key", "S"), wait=wait)
        ttl = self.boto3_client.describe_time_to_live(TableName=name).get("TimeToLiveDescription", {})
        if ttl.get("TimeToLiveStatus") in ("ENABLED", "ENABLING"):
            if ttl.get("AttributeName") != "expires_at":  # (a rerun finds it enabled already: fine)
                raise StoreRequestRejected(
                    f"DynamoDB table {name!r} has TTL on {ttl.get('AttributeName')!r}; idempotency records "
                    "expire on 'expires_at': use another table, or change its TTL attribute"
                )
            return
        self.boto3_client.update_time_to_live(
            TableName=name, TimeToLiveSpecification={"Enabled": True, "AttributeName": "expires_at"}
        )

    def lock_table_exists(self, name: str) -> bool:
        """True if the table exists (in any status)."""
        check_table(name)
        try:
            self.boto3_client.describe_table(TableName=name)
        except self.boto3_client.exceptions.ResourceNotFoundException:
            return False
        return True

    def inspect(self, table: str, key: Optional[str] = None) -> list[dict[str, Any]]:
        """Held rows, through your boto3 client: a consistent GetItem for one key, else a consistent
        Scan (paginated; an operator's tool, not for hot paths)."""
        check_table(table)
        try:
            if key is not None:
                response = self.boto3_client.get_item(TableName=table, Key={"key": {"S": key}}, ConsistentRead=True)
                items = [response["Item"]] if "Item" in response else []
            else:
                items = []
                for page in self.boto3_client.get_paginator("scan").paginate(TableName=table, ConsistentRead=True):
                    items.extend(page["Items"])
        except self.boto3_client.exceptions.ResourceNotFoundException as error:
            raise missing_table(repr(table), f"reading it: {error}", key) from error
        rows = []
        for item in items:
            plain = {name: next(iter(value.values())) for name, value in item.items()}
            rows.append({
                "key": plain.get("key"), "owner": plain.get("owner"), "version": plain.get("version"),
                "lease_ms": _int_or_raw(plain.get("lease_ms")), "protocol": _int_or_raw(plain.get("protocol")),
                "waiting": plain.get("waiting", False), "fence": None,
            })
        return sorted(rows, key=lambda row: str(row["key"]))

    # ---- pydynox-style helpers, so the reference's examples run with only their imports changed ----
    # Convenience for porting pydynox code, not a general DynamoDB client: each sends one request through
    # your boto3 client (its retries and timeouts), with pydynox 1.8.0's argument names and order.
    def sync_table_exists(self, name: str) -> bool:
        """Any table (not only lock tables): True if it exists."""
        return self.lock_table_exists(name)

    def sync_create_table(self, name: str, partition_key: tuple[str, str], sort_key: Optional[tuple[str, str]] = None,
                          *, wait: bool = True, timeout_seconds: Optional[float] = None) -> None:
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
        client = self.boto3_client
        try:
            client.create_table(
                TableName=name,
                AttributeDefinitions=[{"AttributeName": attribute, "AttributeType": kind}
                                      for (attribute, kind), _ in keys],
                KeySchema=[{"AttributeName": attribute, "KeyType": role} for (attribute, _), role in keys],
                BillingMode="PAY_PER_REQUEST",
            )
        except client.exceptions.ResourceInUseException:
            # It exists already (a second run of a deployment script): fine if it has this key schema.
            existing = _key_schema(client.describe_table(TableName=name)["Table"])
            wanted = [(attribute, kind, role) for (attribute, kind), role in keys]
            if existing != wanted:
                raise StoreRequestRejected(
                    f"DynamoDB table {name!r} already exists with key schema {_schema_text(existing)}, not "
                    f"{_schema_text(wanted)}: use another table name, or delete that table first"
                ) from None
        if wait:
            self._wait_for("table_exists", name, timeout_seconds)

    def sync_delete_table(self, name: str, *, wait: bool = True, timeout_seconds: Optional[float] = None) -> None:
        """Delete a table, whatever it holds (a lock table's leases too). ``wait`` (True by default, unlike
        pydynox) returns once it is gone, polling each second for at most ``timeout_seconds`` (25 s by
        default). A missing table raises boto3's ``ResourceNotFoundException``."""
        check_table(name)
        _check_wait(wait, timeout_seconds)
        self.boto3_client.delete_table(TableName=name)
        if wait:
            self._wait_for("table_not_exists", name, timeout_seconds)

    def _wait_for(self, waiter: str, name: str, timeout_seconds: Optional[float]) -> None:
        """Poll DescribeTable each second until botocore's ``waiter`` is satisfied."""
        config = {"Delay": 1, "MaxAttempts": 25 if timeout_seconds is None else max(1, math.ceil(timeout_seconds))}
        self.boto3_client.get_waiter(waiter).wait(TableName=name, WaiterConfig=config)

    def sync_get_item(self, table: str, key: Mapping[str, Any],
                      consistent_read: bool = True) -> Optional[dict[str, Any]]:
        """One item as plain Python values (numbers as ``Decimal``), or None if absent. The read is
        strongly consistent unless ``consistent_read=False`` (pydynox reads eventually consistent by default)."""
        check_table(table)
        if type(consistent_read) is not bool:
            raise TypeError(f"consistent_read must be True or False, got {consistent_read!r:.80}")
        response = self.boto3_client.get_item(TableName=table, Key=_to_wire("key", key), ConsistentRead=consistent_read)
        item = response.get("Item")
        return None if item is None else _from_wire(item)

    def sync_put_item(self, table: str, item: Mapping[str, Any], condition_expression: Optional[str] = None,
                      expression_attribute_names: _Names = None, expression_attribute_values: _Values = None) -> None:
        """Write a whole item (plain Python values), replacing any item with its key. If the condition is
        false, boto3's ``ConditionalCheckFailedException`` (``client.boto3_client.exceptions``) is raised
        and nothing is written. Returns None (pydynox returns its request metrics)."""
        check_table(table)
        self.boto3_client.put_item(**_expressions(
            {"TableName": table, "Item": _to_wire("item", item)},
            condition_expression, expression_attribute_names, expression_attribute_values))

    def sync_delete_item(self, table: str, key: Mapping[str, Any], condition_expression: Optional[str] = None,
                         expression_attribute_names: _Names = None,
                         expression_attribute_values: _Values = None) -> None:
        """Delete the item with this key (a missing item is no error). If the condition is false, boto3's
        ``ConditionalCheckFailedException`` is raised and nothing is deleted. Returns None."""
        check_table(table)
        self.boto3_client.delete_item(**_expressions(
            {"TableName": table, "Key": _to_wire("key", key)},
            condition_expression, expression_attribute_names, expression_attribute_values))

    async def get_item(self, table: str, key: Mapping[str, Any],
                       consistent_read: bool = True) -> Optional[dict[str, Any]]:
        """The async form of :meth:`sync_get_item`, run on the client's worker threads."""
        return await _off_loop(self, self.sync_get_item, table, key, consistent_read)

    async def put_item(self, table: str, item: Mapping[str, Any], condition_expression: Optional[str] = None,
                       expression_attribute_names: _Names = None, expression_attribute_values: _Values = None) -> None:
        """The async form of :meth:`sync_put_item`; cancelling the caller does not stop a request once sent."""
        await _off_loop(self, self.sync_put_item, table, item, condition_expression, expression_attribute_names,
                        expression_attribute_values)

    async def delete_item(self, table: str, key: Mapping[str, Any], condition_expression: Optional[str] = None,
                          expression_attribute_names: _Names = None,
                          expression_attribute_values: _Values = None) -> None:
        """The async form of :meth:`sync_delete_item`; cancelling the caller does not stop a request once sent."""
        await _off_loop(self, self.sync_delete_item, table, key, condition_expression, expression_attribute_names,
                        expression_attribute_values)

    # ---- transactions ------------------------------------------------------------------------
    def _check_in(self, lease: Any, transaction: Any) -> None:
        if not isinstance(transaction, SyncTransaction):  # Transaction (async) is a subclass
            raise TypeError(
                f"check_in takes a fastlease.dynamodb Transaction or SyncTransaction, got {type(transaction).__name__}"
            )
        if transaction.client is not self:
            raise ValueError("check_in: the transaction belongs to another client; create it with this lease's client")
        transaction._add_lock_check(lease, condition_check_item(lease)["ConditionCheck"])

    def _condition_check_item(self, lease: Any) -> dict[str, Any]:
        return condition_check_item(lease)

    def _record_in(self, transaction: Any, table: str, key: str, record: Any) -> None:
        if not isinstance(transaction, SyncTransaction):  # Transaction (async) is a subclass
            kind = type(transaction).__name__
            raise TypeError(f"complete_in takes a fastlease.dynamodb Transaction or SyncTransaction, got {kind}")
        transaction.put(table, record_item(key, record))


def condition_check_item(lease: Any) -> dict[str, Any]:
    """The raw TransactWriteItems entry that holds only while ``lease``'s owner still owns the row."""
    return condition_check(lease.table, lease.key, lease.owner)



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


def _check_credentials(boto3_client: Any) -> None:
    """StoreConfigurationError if the client resolved no credentials. botocore resolves them when it
    makes the client, so this reads what it found and sends nothing (unsigned clients need none)."""
    from botocore import UNSIGNED

    if getattr(boto3_client.meta.config, "signature_version", None) is UNSIGNED:
        return
    signer = getattr(boto3_client, "_request_signer", None)
    if signer is not None and getattr(signer, "_credentials", False) is None:
        raise StoreConfigurationError(
            "DynamoDBClient found no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or "
            "AWS_PROFILE for a profile in ~/.aws/credentials, or run where a role provides them (an ECS task "
            "role, Lambda, an EC2 instance profile). A local endpoint (moto, DynamoDB Local) takes any values"
        )


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


async def _off_loop(client: DynamoDBClient, step: Callable[..., _T], *args: Any) -> _T:
    """Run a blocking step on the client's worker threads, like every blocking step of the async API
    (not torn off half-sent if the awaiting task is cancelled: the step completes, its outcome consumed)."""
    from .aio import _run, _shielded

    return await _shielded(_run(client, step, *args))


def _targets_lock_item(table: str, plain_key: Any, lock_table: str, lock_key: str) -> bool:
    """Does an operation on ``table`` with this key (or item, as plain values) address the lock row?"""
    return table == lock_table and isinstance(plain_key, dict) and plain_key.get("key") == lock_key


class SyncTransaction:
    """Collects TransactWriteItems entries and commits them when the ``with`` block exits cleanly."""

    def __init__(self, client: DynamoDBClient) -> None:
        if not isinstance(client, DynamoDBClient):
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
            await _off_loop(self.client, self.commit)
