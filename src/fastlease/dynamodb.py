"""DynamoDB: ``DynamoDBClient``, the lease client on the production store.

::

    with SyncDistributedLock(client, table="locks", key="import:daily") as lease:
        with SyncTransaction(client) as tx:
            lease.check_in(tx)                       # ConditionCheck: the row's owner is still ours
            tx.put("import_results", {"job_id": "daily", "summary": "..."})
    # the transaction commits when its block exits without an exception

``SyncTransaction`` and ``Transaction`` (its async form) and the client's pydynox-style table and item
helpers live in ``fastlease.pydynox_compat``, with everything else that ports pydynox code; import the
transactions from here, as always. Commits and helpers use your own boto3 client and its configuration.
"""

from __future__ import annotations

import logging
import platform
from typing import TYPE_CHECKING, Any, Callable, Optional

from . import pydynox_compat
from .client import LeaseClient, idempotency_lock_table
from .exceptions import StoreConfigurationError, StoreRequestRejected, TransactionCanceled
from .pydynox_compat import MAX_TRANSACTION_ITEMS as MAX_TRANSACTION_ITEMS  # re-exported, as before
from .pydynox_compat import SyncTransaction, Transaction
from .stores.base import check_table
from .stores.dynamodb.store import (
    FENCE_KEY_PREFIX,
    DynamoDBStore,
    _int_or_raw,
    condition_check,
    missing_table,
    record_item,
)
from .stores.dynamodb.transport import Boto3Transport, import_boto3

if TYPE_CHECKING:
    from ._engine import Clock

__all__ = ["DynamoDBClient", "SyncTransaction", "Transaction", "TransactionCanceled", "condition_check_item"]

_log = logging.getLogger("fastlease.dynamodb")


def _user_agent() -> str:
    from ._version import __version__

    return f"fastlease/{__version__} Python/{platform.python_version()}"


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

    ``fencing=True`` gives every lease a fencing token (``lease.fencing_token``), as the other stores
    do: an acquisition writes its row and raises the key's counter (an item of the lock table) in one
    TransactWriteItems, the same one round trip, but 4 write units instead of 1, and the counter item
    stays after the release. Tokens only increase among the clients that use it; pydynox's acquisitions,
    and those of clients without it, get none. Off by default (protocol v1's plain requests, as
    pydynox sends them): see docs/protocol.md, "Fencing tokens".
    """

    def __init__(
        self,
        boto3_client: Any = None,
        *,
        session: Any = None,
        endpoint_url: Optional[str] = None,
        region_name: Optional[str] = None,
        fast_path: bool = True,
        fencing: bool = False,
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
        pydynox_compat.refuse_pydynox_only(engine)
        if region is not None:
            if region_name is not None and region_name != region:
                raise ValueError(f"region={region!r} and region_name={region_name!r} disagree: pass one of them")
            region_name = region  # pydynox's name for it
        ported = {"access_key": access_key, "secret_key": secret_key, "session_token": session_token,
                  "profile": profile}
        config = pydynox_compat.botocore_config(connect_timeout, read_timeout, max_retries)
        if boto3_client is not None and (session is not None or endpoint_url is not None or region_name is not None
                                         or any(value is not None for value in ported.values()) or config):
            raise ValueError("pass either a boto3 client or the settings to build one (session, endpoint_url, "
                             "region_name, credentials, timeouts), not both")
        if session is not None and any(value is not None for value in ported.values()):
            raise ValueError("pass either session= or credentials (access_key, secret_key, session_token, profile), "
                             "not both: the session has its own")
        if boto3_client is None:
            if session is None:
                session = boto3.session.Session(aws_access_key_id=access_key, aws_secret_access_key=secret_key,
                                                aws_session_token=session_token, profile_name=profile)
            boto3_client = _dynamodb_client(session, endpoint_url, region_name, config)
        elif getattr(getattr(boto3_client, "meta", None), "service_model", None) is None or (
            boto3_client.meta.service_model.service_name != "dynamodb"
        ):
            raise TypeError(f"boto3_client must be a boto3 DynamoDB client, got {type(boto3_client).__name__}")
        if type(fast_path) is not bool:
            raise TypeError(f"fast_path must be True or False, got {fast_path!r}")
        if type(fencing) is not bool:
            raise TypeError(f"fencing must be True or False, got {fencing!r}")
        _check_credentials(boto3_client)
        self.boto3_client = boto3_client
        super().__init__(DynamoDBStore(self._lock_transport(fast_path), fencing), clock=clock, **engine)

    def _lock_transport(self, fast_path: bool) -> Any:
        """How the lock's own requests reach DynamoDB: fastlease's request path when ``fast_path`` asks for
        it and it can serve this client (else the reason is logged at DEBUG), otherwise plain boto3 lock
        clients from :meth:`_lock_client_factory`."""
        if fast_path:
            from .stores.dynamodb.fastpath import FastPathUnavailable, FastTransport

            try:
                return FastTransport(self.boto3_client, _user_agent())
            except FastPathUnavailable as reason:
                _log.debug("lock requests use plain boto3: %s", reason)
        return Boto3Transport(self._lock_client_factory())

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
            if str(plain.get("key", "")).startswith(FENCE_KEY_PREFIX):
                continue  # a fencing counter, not a lease
            rows.append({
                "key": plain.get("key"), "owner": plain.get("owner"), "version": plain.get("version"),
                "lease_ms": _int_or_raw(plain.get("lease_ms")), "protocol": _int_or_raw(plain.get("protocol")),
                "waiting": plain.get("waiting", False), "fence": _int_or_raw(plain.get("fence")),
            })
        return sorted(rows, key=lambda row: str(row["key"]))

    # ---- pydynox-style helpers, so the reference's examples run with only their imports changed ----
    # Defined in fastlease.pydynox_compat (client first), taken here as methods: one definition each.
    sync_table_exists = pydynox_compat.sync_table_exists
    sync_create_table = pydynox_compat.sync_create_table
    sync_delete_table = pydynox_compat.sync_delete_table
    sync_get_item = pydynox_compat.sync_get_item
    sync_put_item = pydynox_compat.sync_put_item
    sync_delete_item = pydynox_compat.sync_delete_item
    get_item = pydynox_compat.get_item
    put_item = pydynox_compat.put_item
    delete_item = pydynox_compat.delete_item

    # ---- a lease's part in a transaction: check_in, condition_check_item, complete_in ----------
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


def _dynamodb_client(session: Any, endpoint_url: Optional[str], region_name: Optional[str], config: Any) -> Any:
    """A boto3 DynamoDB client from ``session``; StoreConfigurationError, saying where to set one, when no
    Region is given or configured."""
    from botocore.exceptions import NoRegionError

    try:
        return session.client("dynamodb", endpoint_url=endpoint_url, region_name=region_name, config=config)
    except NoRegionError:
        raise StoreConfigurationError(
            "DynamoDBClient needs an AWS Region and none is configured: set AWS_DEFAULT_REGION, "
            "`region` in ~/.aws/config for your profile, or pass region_name=... (region=... as in pydynox)"
        ) from None


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

