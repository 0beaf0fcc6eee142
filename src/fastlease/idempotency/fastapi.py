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

Every route of the router (for the methods in ``methods``, POST and PATCH by default) then answers,
as the IETF draft on the header (draft-ietf-httpapi-idempotency-key-header-07) describes, each error
with an ``application/problem+json`` body (RFC 9457) whose ``type`` names the problem:

* 400 ``idempotency-key-missing`` when the header is missing (``required=True``, the default), and
  400 ``idempotency-key-malformed`` when it is sent more than once, or is neither one structured-field
  string (RFC 8941 sf-string, ``Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"``, parameters
  ignored) nor the bare form of 1-255 visible ASCII characters that clients send today (the two forms
  name the same key; a quoted key holds 1-255 characters too);
* 409 ``idempotency-key-in-progress`` with ``Retry-After`` while a request with the same key is in
  flight (or, with ``wait=``, waits for it and replays its response);
* 422 ``idempotency-key-reused`` when the key was used with a different request: the method, path,
  query and body are fingerprinted, a JSON body (``application/json`` or any ``+json`` type) by its
  canonical form (the same JSON with other spacing, key order or escapes is the same request), any
  other body by its bytes;
* on a repeat: the first response's status, body and ``replay_headers``, plus ``Idempotent-Replayed: true``.

The problem types are ``problem_base`` followed by the names above; the default base makes them tag
URIs (RFC 4151), identifiers that link nowhere: pass your documentation's URL to make them links.

The stored response is the one the route produced, after FastAPI's own processing (``status_code``,
``response_model``). An ``HTTPException`` below 500 is a final answer and is stored too, as FastAPI's
default handler renders it; any other exception (and a 5xx) stores nothing, so the client may retry.
Streaming responses cannot be stored and are refused. Keys are scoped per client when ``scope``
is given (a function of the request, say the authenticated user id), as the IETF draft advises:
without it, two clients sending the same key share one record. A ``scope`` that cannot identify the
request raises ``HTTPException`` (say 400 or 401), which FastAPI answers before anything runs.

The parsing of the key, the fingerprint, the problems and the stored form of responses live in
``fastlease.idempotency.http``, which the Django integration shares; their names stay importable here.
"""

from __future__ import annotations

from typing import Any, Callable, Coroutine, Optional, Sequence, cast

from fastapi import HTTPException, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from ..client import LeaseClient
from ..lock import DEFAULT_LEASE_DURATION
from .calls import AsyncIdempotentCall
from .exceptions import IdempotencyInProgress, IdempotencyKeyMismatch
from .http import HEADER as HEADER
from .http import MAX_KEY_CHARS as MAX_KEY_CHARS
from .http import PROBLEM_BASE as PROBLEM_BASE
from .http import PROBLEM_JSON as PROBLEM_JSON
from .http import REPLAY_HEADERS as REPLAY_HEADERS
from .http import REPLAYED_HEADER as REPLAYED_HEADER
from .http import EndpointSpec, NotStored, Problem, replayed_response, stored_response
from .http import parse_idempotency_key as parse_idempotency_key
from .http import request_fingerprint as request_fingerprint
from .records import DEFAULT_TTL

__all__ = ["idempotent_route"]
# The names imported ``as`` themselves are not in __all__ but stay importable from here, as they were
# before fastlease.idempotency.http held them.

# A route's own handler: FastAPI's, which runs the endpoint and renders its response.
_Handler = Callable[[Request], Coroutine[Any, Any, Response]]


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
    problem_base: str = PROBLEM_BASE,
) -> type[APIRoute]:
    """An ``APIRoute`` class for ``APIRouter(route_class=...)``: see the module documentation.

    ``table`` keeps the stored responses (``lock_table``, default ``<table>_locks``, the in-flight
    leases); ``header`` names the key's header and ``required`` whether a request without it is
    refused (400) or simply runs; ``scope(request)`` returns the client's identity (a str) that keys
    are scoped to; only requests whose method is in ``methods`` are guarded; ``lease_duration``,
    ``wait`` and ``ttl`` are seconds, as for :class:`~fastlease.idempotency.IdempotentCall`;
    ``replay_headers`` are the response headers stored and replayed; ``problem_base`` starts the
    ``type`` of every problem answer. Raises TypeError or ValueError for bad options, including a
    client whose store keeps no idempotency records.
    """
    spec = EndpointSpec(client, table=table, lock_table=lock_table, header=header, required=required, scope=scope,
                        methods=methods, lease_duration=lease_duration, wait=wait, ttl=ttl,
                        replay_headers=replay_headers, problem_base=problem_base)

    class IdempotentRoute(APIRoute):
        def get_route_handler(self) -> _Handler:
            handle = super().get_route_handler()

            async def idempotent_handler(request: Request) -> Response:
                return await _answer(spec, client, request, handle)

            return idempotent_handler

    return IdempotentRoute


def _problem(spec: EndpointSpec, problem: Problem) -> JSONResponse:
    """An ``application/problem+json`` answer (RFC 9457) whose ``type`` is ``problem_base + name``."""
    return JSONResponse(problem.body(spec.problem_base), status_code=problem.status, headers=problem.headers,
                        media_type=PROBLEM_JSON)


async def _answer(spec: EndpointSpec, client: LeaseClient, request: Request, handle: _Handler) -> Response:
    """The response to one request: unguarded methods and keyless requests (when the key is optional)
    simply run; a missing or malformed key is a 400 problem; a keyed request runs once (_answer_keyed)."""
    if not spec.guards(request.method):
        return await handle(request)
    found = spec.key_or_problem(request.headers.getlist(spec.header))
    if found is None:
        return await handle(request)
    if isinstance(found, Problem):
        return _problem(spec, found)
    return await _answer_keyed(spec, client, request, handle, found)


async def _answer_keyed(spec: EndpointSpec, client: LeaseClient, request: Request, handle: _Handler,
                        idempotency_key: str) -> Response:
    """The response to a request that carries a well-formed key: the route's own (run once, stored
    unless a 5xx), the stored one replayed, or a problem: 409 while a request with the key is in
    flight, 422 when the key was used with a different request."""
    # scope() first: one that refuses the request (HTTPException) answers before the body is read.
    key = spec.scoped_key(request, idempotency_key)
    fingerprint = request_fingerprint(request.method, request.url.path, request.url.query,
                                      request.headers.get("content-type", ""), await request.body())
    call = AsyncIdempotentCall._wrap(spec.call(client, key, fingerprint))
    try:
        return await _run_once(call, request, handle, spec.kept)
    except (IdempotencyInProgress, IdempotencyKeyMismatch) as error:
        return _problem(spec, spec.problem_for(error))


async def _run_once(call: AsyncIdempotentCall, request: Request, handle: _Handler, kept: tuple[str, ...]
                    ) -> Response:
    """The stored response replayed, or the route's own response, stored with the ``kept`` headers
    unless it is a 5xx. What entering ``call`` raises (IdempotencyInProgress, IdempotencyKeyMismatch)
    propagates, and so does the route's own exception, which stores nothing (``retry_on`` is every
    Exception)."""
    try:
        async with call:
            if call.replayed:
                return _replay(call.result)
            response = await _route_response(handle, request)
            if response.status_code >= 500:
                raise NotStored(response, response.status_code)  # leaving the block releases the key for a retry
            await call.complete(stored_response(response, response.status_code, response.headers.items(),
                                                getattr(response, "body", None), kept))
            return response
    except NotStored as not_stored:
        return cast(Response, not_stored.response)  # the one raised above


async def _route_response(handle: _Handler, request: Request) -> Response:
    """The route's response, with an ``HTTPException`` below 500 rendered as FastAPI's default handler
    does (a final answer, to be stored); a 5xx one is raised, so that nothing is stored."""
    try:
        return await handle(request)
    except HTTPException as error:
        if error.status_code >= 500:
            raise
        return JSONResponse({"detail": error.detail}, status_code=error.status_code, headers=error.headers)


def _replay(stored: dict[str, Any]) -> Response:
    replayed = replayed_response(stored)
    response = Response(content=replayed.body, status_code=replayed.status)
    for name, value in replayed.headers:
        response.headers[name] = value
    return response
