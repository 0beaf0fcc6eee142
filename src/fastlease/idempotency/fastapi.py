"""FastAPI routes whose requests are idempotent by their ``Idempotency-Key`` header
(``pip install 'fastlease[fastapi]'``)::

    from fastapi import APIRouter, FastAPI
    from fastlease.idempotency.fastapi import idempotent_route

    payments = APIRouter(route_class=idempotent_route(client, table="payments"))

    @payments.post("/payments", status_code=201)
    async def create_payment(payment: Payment) -> dict:
        ...                                   # runs once per Idempotency-Key

    app = FastAPI()
    app.include_router(payments)

Every route of the router (for the methods in ``methods``, POST and PATCH by default) then answers:

* 400 when the header is missing (``required=True``, the default) or is not 1-255 visible ASCII
  characters;
* 409 with ``Retry-After`` while a request with the same key is in flight (or, with ``wait=``, waits
  for it and replays its response);
* 422 when the key was used with a different request (method, path, query and body are fingerprinted);
* on a repeat: the first response's status, body and ``replay_headers``, plus ``Idempotent-Replayed: true``.

The stored response is the one the route produced, after FastAPI's own processing (``status_code``,
``response_model``). An ``HTTPException`` below 500 is a final answer and is stored too, as FastAPI's
default handler renders it; any other exception (and a 5xx) stores nothing, so the client may retry.
Streaming responses cannot be stored and are refused. Keys are scoped per client when ``scope``
is given (a function of the request, say the authenticated user id), as the IETF draft advises:
without it, two clients sending the same key share one record.
"""

from __future__ import annotations

import base64
import hashlib
import math
from typing import Any, Callable, Coroutine, Optional, Sequence

from fastapi import HTTPException, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from ..client import LeaseClient
from ..lock import DEFAULT_LEASE_DURATION
from .calls import AsyncIdempotentCall, IdempotentCall, _CallSpec
from .exceptions import IdempotencyInProgress, IdempotencyKeyMismatch
from .records import DEFAULT_TTL

__all__ = ["idempotent_route"]

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
#: Response headers stored with the response and sent again on replay (others are per-response).
REPLAY_HEADERS = ("content-type", "location", "etag", "cache-control", "content-language")


def idempotent_route(
    client: LeaseClient,
    *,
    table: str,
    lock_table: Optional[str] = None,
    header: str = HEADER,
    required: bool = True,
    scope: Optional[Callable[[Request], str]] = None,
    methods: Sequence[str] = ("POST", "PATCH"),
    lease_duration: float = DEFAULT_LEASE_DURATION,
    wait: float = 0.0,
    ttl: Optional[float] = DEFAULT_TTL,
    replay_headers: Sequence[str] = REPLAY_HEADERS,
) -> type[APIRoute]:
    """An ``APIRoute`` class for ``APIRouter(route_class=...)``: see the module documentation.

    ``table`` keeps the stored responses (``lock_table``, default ``<table>_locks``, the in-flight
    leases); ``header`` names the key's header and ``required`` whether a request without it is
    refused (400) or simply runs; ``scope(request)`` returns the client's identity (a str) that keys
    are scoped to; only requests whose method is in ``methods`` are guarded; ``lease_duration``,
    ``wait`` and ``ttl`` are seconds, as for :class:`~fastlease.idempotency.IdempotentCall`;
    ``replay_headers`` are the response headers stored and replayed. Raises TypeError or ValueError
    for bad options, including a client whose store keeps no idempotency records.
    """
    spec = _CallSpec(client, table, lock_table, lease_duration, wait, ttl, _JSON, (Exception,))
    if scope is not None and not callable(scope):
        raise TypeError(f"scope must be a function of the request returning a str, got {scope!r}")
    guarded = frozenset(method.upper() for method in methods)
    kept = tuple(name.lower() for name in replay_headers)

    class IdempotentRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handle = super().get_route_handler()

            async def idempotent_handler(request: Request) -> Response:
                if request.method not in guarded:
                    return await handle(request)
                idempotency_key = request.headers.get(header)
                if idempotency_key is None:
                    if required:
                        return JSONResponse({"detail": f"the {header} header is required"}, status_code=400)
                    return await handle(request)
                if not 1 <= len(idempotency_key) <= 255 or not all(" " < c <= "~" for c in idempotency_key):
                    return JSONResponse({"detail": f"the {header} header must be 1-255 visible ASCII characters"},
                                        status_code=400)
                owner_scope = scope(request) if scope is not None else ""
                if not isinstance(owner_scope, str):
                    raise TypeError(f"scope() must return a str, got {type(owner_scope).__name__}")
                body = await request.body()
                fingerprint = hashlib.sha256(b"\0".join(
                    (request.method.encode(), request.url.path.encode(), request.url.query.encode(), body)
                )).hexdigest()
                # The scope (an identity) is hashed: fixed length, and never readable in the store.
                scoped = hashlib.sha256(owner_scope.encode()).hexdigest()[:32] if owner_scope else "-"
                key = f"http:{scoped}:{idempotency_key}"
                call = AsyncIdempotentCall._wrap(IdempotentCall._from_spec(spec, key, fingerprint))
                try:
                    async with call:
                        if call.replayed:
                            return _replay(call.result)
                        try:
                            response = await handle(request)
                        except HTTPException as error:
                            if error.status_code >= 500:
                                raise
                            response = JSONResponse({"detail": error.detail}, status_code=error.status_code,
                                                    headers=error.headers)
                        if response.status_code >= 500:
                            raise _NotStored(response)  # leaving the block so releases the key for a retry
                        await call.complete(_stored(response, kept))
                        return response
                except _NotStored as not_stored:
                    return not_stored.response
                except IdempotencyInProgress as error:
                    return JSONResponse(
                        {"detail": f"a request with this {header} is in progress"}, status_code=409,
                        headers={"Retry-After": str(max(1, math.ceil(error.retry_after)))},
                    )
                except IdempotencyKeyMismatch:
                    return JSONResponse(
                        {"detail": f"this {header} was used with a different request"}, status_code=422
                    )

            return idempotent_handler

    return IdempotentRoute


class _NotStored(Exception):
    """Leaves an idempotent call's block with a response that must not be stored (a 5xx). It is in the
    routes' ``retry_on`` (every Exception), so the key is released and the client may retry."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status_code)
        self.response = response


class _ResponseJSON:
    """Stored responses are JSON dicts (the body in base64)."""

    def dumps(self, value: Any) -> bytes:
        import json

        return json.dumps(value, separators=(",", ":")).encode()

    def loads(self, data: bytes) -> Any:
        import json

        return json.loads(data)


_JSON = _ResponseJSON()


def _stored(response: Response, kept: tuple[str, ...]) -> dict[str, Any]:
    body = getattr(response, "body", None)
    if not isinstance(body, (bytes, bytearray)):
        raise TypeError(f"{type(response).__name__} has no body to store: idempotent routes cannot stream")
    headers = [[name, value] for name, value in response.headers.items() if name.lower() in kept]
    return {"status": response.status_code, "headers": headers, "body": base64.b64encode(bytes(body)).decode()}


def _replay(stored: dict[str, Any]) -> Response:
    response = Response(content=base64.b64decode(stored["body"]), status_code=stored["status"])
    for name, value in stored["headers"]:
        response.headers[name] = value
    response.headers[REPLAYED_HEADER] = "true"
    return response
