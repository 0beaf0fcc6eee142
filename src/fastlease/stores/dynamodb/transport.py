"""DynamoDB: how a request reaches the service and how its failures are told apart. ``Boto3Transport``
sends through boto3; ``fastpath.FastTransport`` (HTTP and SigV4 of our own) has the same interface, and
both report an error response as ``ServiceError``.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from ...exceptions import StoreError, StoreRequestRejected
from .bodies import Body, as_params

#: Errors that mean "not applied, try again later".
THROTTLING_CODES = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "RequestLimitExceeded",
        "LimitExceededException",
        "TransactionConflictException",
    }
)
#: Errors that mean "the service failed; the write may or may not have been applied".
SERVER_ERROR_CODES = frozenset({"InternalServerError", "ServiceUnavailable", "InternalFailure"})

#: Per-request timeouts are quantised *down* to these buckets, one lock client per bucket, so a
#: request never waits longer than min(lease/3, 5 s, the time left) by more than the smallest bucket.
TIMEOUT_BUCKETS_S = (0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0)


class ServiceError(Exception):
    """A transport's report of an error response from DynamoDB: its code, message and HTTP status, and
    for a cancelled transaction its ``CancellationReasons`` (one per item, in order), else None."""

    def __init__(self, code: str, message: str, status: int, reasons: Optional[list[Any]] = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status
        self.reasons = reasons


def import_boto3() -> Any:
    """boto3 (an optional dependency), or ImportError naming the extra to install."""
    try:
        import boto3
    except ImportError as error:
        raise ImportError(
            "DynamoDBClient needs boto3: pip install 'fastlease[dynamodb]'"
        ) from error
    return boto3


def timeout_bucket(timeout_s: float) -> float:
    """The largest of TIMEOUT_BUCKETS_S at most ``timeout_s`` (the smallest if none is)."""
    chosen = TIMEOUT_BUCKETS_S[0]
    for bucket in TIMEOUT_BUCKETS_S:
        if bucket <= timeout_s:
            chosen = bucket
    return chosen


class Boto3Transport:
    """Lock requests through boto3, on lock-only clients with retries off and bounded timeouts.

    The user's own client is never reconfigured: lock clients are separate botocore clients built from
    the same session (or sharing the user client's credentials), one per timeout bucket, made lazily.
    """

    name = "boto3"

    def __init__(self, make_client: Callable[[float], Any]) -> None:
        self._make_client = make_client
        self._clients: dict[float, Any] = {}

    def _client(self, timeout_s: float) -> Any:
        bucket = timeout_bucket(timeout_s)
        client = self._clients.get(bucket)
        if client is None:
            client = self._clients.setdefault(bucket, self._make_client(bucket))
        return client

    def call(self, operation: str, params: dict[str, Any] | Body, timeout_s: float) -> dict[str, Any]:
        """Send one request (``operation`` is the API name, such as ``PutItem``; ``params`` its parameters,
        or a ``Body`` that builds them) on the lock client of ``timeout_s``'s bucket and return the
        response. An error response raises ServiceError; botocore's own failures raise
        StoreRequestRejected, or StoreError (``maybe_committed`` once sent)."""
        from botocore.exceptions import BotoCoreError, ClientError

        arguments = as_params(params)
        client = self._client(timeout_s)
        try:
            response: dict[str, Any] = getattr(client, METHODS[operation])(**arguments)
            return response
        except ClientError as error:
            info = error.response.get("Error", {})
            status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            raise ServiceError(str(info.get("Code", "")), str(info.get("Message", "")), int(status),
                               error.response.get("CancellationReasons")) from error
        except BotoCoreError as error:
            unsent = classify_unsent(operation, error)
            if unsent is not None:
                raise unsent from error
            # A read timeout or a dropped connection after sending: the write may have landed.
            raise StoreError(f"DynamoDB {operation} failed after sending: {error}", maybe_committed=True) from error



def classify_unsent(operation: str, error: Exception) -> Optional[Exception]:
    """The fastlease error for a botocore error raised before the request was sent (so it cannot have
    been applied), or None if ``error`` is not one of those. Shared by both transports."""
    from botocore.exceptions import (
        ConnectTimeoutError,
        CredentialRetrievalError,
        EndpointConnectionError,
        NoCredentialsError,
        ParamValidationError,
        PartialCredentialsError,
    )

    if isinstance(error, (NoCredentialsError, PartialCredentialsError, ParamValidationError)):
        return StoreRequestRejected(f"DynamoDB {operation}: {error}")  # waiting cannot fix these
    if isinstance(error, (CredentialRetrievalError, ConnectTimeoutError, EndpointConnectionError)):
        return StoreError(f"DynamoDB {operation} not sent: {error}", maybe_committed=False)
    return None


METHODS = {
    "PutItem": "put_item",
    "UpdateItem": "update_item",
    "DeleteItem": "delete_item",
    "GetItem": "get_item",
    "TransactWriteItems": "transact_write_items",
}
