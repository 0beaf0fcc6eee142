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
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
from typing import Any, Callable, Coroutine, Optional, Sequence

from fastapi import HTTPException, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from ..client import LeaseClient
from ..lock import DEFAULT_LEASE_DURATION
from .calls import AsyncIdempotentCall, IdempotentCall, _CallSpec
from .exceptions import IdempotencyInProgress, IdempotencyKeyMismatch
from .records import DEFAULT_TTL
from .serialization import canonical_json

__all__ = ["idempotent_route"]

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
#: Response headers stored with the response and sent again on replay (others are per-response).
REPLAY_HEADERS = ("content-type", "location", "etag", "cache-control", "content-language")
#: The default start of the problem types: a tag URI (RFC 4151), which RFC 9457 allows for types that
#: are identifiers only. Each type is this followed by the problem's name.
PROBLEM_BASE = "tag:fastlease,2026:"
PROBLEM_JSON = "application/problem+json"
#: The longest key, quoted or bare.
MAX_KEY_CHARS = 255

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
    spec = _CallSpec(client, table, lock_table, lease_duration, wait, ttl, _JSON, (Exception,))
    route = _RouteSpec(spec, header, required, scope, methods, replay_headers, problem_base)

    class IdempotentRoute(APIRoute):
        def get_route_handler(self) -> _Handler:
            handle = super().get_route_handler()

            async def idempotent_handler(request: Request) -> Response:
                return await _answer(route, request, handle)

            return idempotent_handler

    return IdempotentRoute


class _RouteSpec:
    """What every request of one idempotent router shares (validated once)."""

    __slots__ = ("call", "header", "required", "scope", "guarded", "kept", "problem_base")

    def __init__(self, call: _CallSpec, header: str, required: bool, scope: Optional[Callable[[Request], str]],
                 methods: Sequence[str], replay_headers: Sequence[str], problem_base: str) -> None:
        if scope is not None and not callable(scope):
            raise TypeError(f"scope must be a function of the request returning a str, got {scope!r}")
        if not isinstance(problem_base, str):
            raise TypeError(f"problem_base must be a str (a URI prefix), got {type(problem_base).__name__}")
        self.call = call
        self.header = header
        self.required = required
        self.scope = scope
        self.guarded = frozenset(method.upper() for method in methods)
        self.kept = tuple(name.lower() for name in replay_headers)  # the replayed response headers
        self.problem_base = problem_base

    def problem(self, status: int, name: str, title: str, detail: str, headers: Optional[dict[str, str]] = None
                ) -> JSONResponse:
        """An ``application/problem+json`` answer (RFC 9457) whose ``type`` is ``problem_base + name``."""
        return JSONResponse({"type": self.problem_base + name, "title": title, "status": status, "detail": detail},
                            status_code=status, headers=headers, media_type=PROBLEM_JSON)


async def _answer(route: _RouteSpec, request: Request, handle: _Handler) -> Response:
    """The response to one request: unguarded methods and keyless requests (when the key is optional)
    simply run; a missing or malformed key is a 400 problem; a keyed request runs once (_answer_keyed)."""
    header = route.header
    if request.method not in route.guarded:
        return await handle(request)
    fields = request.headers.getlist(header)
    if not fields:
        if route.required:
            return route.problem(400, "idempotency-key-missing", f"{header} is missing",
                                 f"the {header} header is required: send a unique key, such as a "
                                 f'UUID, as {header}: "<key>", and the same key when you retry')
        return await handle(request)
    try:
        if len(fields) > 1:
            raise ValueError(f"it was sent {len(fields)} times: send one {header} field")
        idempotency_key = parse_idempotency_key(fields[0])
    except ValueError as error:
        return route.problem(400, "idempotency-key-malformed", f"{header} is malformed",
                             f"the {header} header must be a structured-field string with its quotes, "
                             f'such as "8e03978e-40d5-43e8-bc93-6894a57f9324", or 1-{MAX_KEY_CHARS} '
                             f"visible ASCII characters without quotes: {error}")
    return await _answer_keyed(route, request, handle, idempotency_key)


async def _answer_keyed(route: _RouteSpec, request: Request, handle: _Handler, idempotency_key: str) -> Response:
    """The response to a request that carries a well-formed key: the route's own (run once, stored
    unless a 5xx), the stored one replayed, or a problem: 409 while a request with the key is in
    flight, 422 when the key was used with a different request."""
    header = route.header
    # scope() first: one that refuses the request (HTTPException) answers before the body is read.
    key = _scoped_key(route, request, idempotency_key)
    fingerprint = request_fingerprint(request.method, request.url.path, request.url.query,
                                      request.headers.get("content-type", ""), await request.body())
    call = AsyncIdempotentCall._wrap(IdempotentCall._from_spec(route.call, key, fingerprint))
    try:
        return await _run_once(call, request, handle, route.kept)
    except IdempotencyInProgress as error:
        return route.problem(409, "idempotency-key-in-progress",
                             f"A request is outstanding for this {header}",
                             f"a request with this {header} is in progress: retry after Retry-After seconds",
                             headers={"Retry-After": str(max(1, math.ceil(error.retry_after)))})
    except IdempotencyKeyMismatch:
        return route.problem(422, "idempotency-key-reused", f"{header} is already used",
                             f"this {header} was used with a different request (method, path, query or "
                             f"body): resend the first request unchanged, or use a new key for a new one")


def _scoped_key(route: _RouteSpec, request: Request, idempotency_key: str) -> str:
    """The record's key: the request's ``Idempotency-Key`` within the scope of its client (one shared
    scope when the router has no ``scope``, or it returns "")."""
    owner_scope = route.scope(request) if route.scope is not None else ""
    if not isinstance(owner_scope, str):
        raise TypeError(f"scope() must return a str, got {type(owner_scope).__name__}")
    # The scope (an identity) is hashed: fixed length, and never readable in the store.
    scoped = hashlib.sha256(owner_scope.encode()).hexdigest()[:32] if owner_scope else "-"
    return f"http:{scoped}:{idempotency_key}"


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
                raise _NotStored(response)  # leaving the block so releases the key for a retry
            await call.complete(_stored(response, kept))
            return response
    except _NotStored as not_stored:
        return not_stored.response


async def _route_response(handle: _Handler, request: Request) -> Response:
    """The route's response, with an ``HTTPException`` below 500 rendered as FastAPI's default handler
    does (a final answer, to be stored); a 5xx one is raised, so that nothing is stored."""
    try:
        return await handle(request)
    except HTTPException as error:
        if error.status_code >= 500:
            raise
        return JSONResponse({"detail": error.detail}, status_code=error.status_code, headers=error.headers)


class _NotStored(Exception):
    """Leaves an idempotent call's block with a response that must not be stored (a 5xx). It is in the
    routes' ``retry_on`` (every Exception), so the key is released and the client may retry."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status_code)
        self.response = response


# ---- the Idempotency-Key field: RFC 8941 (structured fields) --------------------------------------
#: A parameter's key: lcalpha or "*", then lcalpha, DIGIT, "_", "-", "." or "*".
_PARAMETER_KEY = re.compile(r"[a-z*][a-z0-9_.*-]*")
#: A token: ALPHA or "*", then tchar, ":" or "/".
_TOKEN = re.compile(r"[A-Za-z*][A-Za-z0-9!#$%&'*+.^_`|~:/-]*")
#: An integer or a decimal; its limits (15 digits; 12 then 1-3) are checked after the match.
_NUMBER = re.compile(r"-?([0-9]+)(\.([0-9]*))?")
#: A byte sequence: base64 between colons.
_BYTES = re.compile(r":[A-Za-z0-9+/=]*:")


def parse_idempotency_key(field: str) -> str:
    """The key a field value carries: an RFC 8941 Item whose bare item is a String (the draft's
    syntax; parameters are parsed and ignored), or, unquoted, the bare key of 1-255 visible ASCII
    characters that clients send today. ValueError, saying what is wrong, for anything else."""
    value = field.strip(" \t")
    if value.startswith('"'):
        key, end = _parse_string(value, 0)
        end = _skip_parameters(value, end)
        if end != len(value):
            raise ValueError(f"unexpected {value[end:end + 20]!r} after the string")
    else:
        if not all(" " < c <= "~" for c in value):
            raise ValueError(f"{value[:40]!r} has a character that is not visible ASCII")
        key = value
    if not 1 <= len(key) <= MAX_KEY_CHARS:
        raise ValueError(f"the key has {len(key)} characters")
    return key


def _parse_string(value: str, start: int) -> tuple[str, int]:
    """The sf-string at ``value[start]`` (a DQUOTE) and the index after its closing DQUOTE."""
    chars: list[str] = []
    i = start + 1
    while i < len(value):
        c = value[i]
        if c == "\\":
            if value[i + 1:i + 2] not in ('"', "\\"):
                raise ValueError(f"a backslash escapes only \\ or \" in a string, got {value[i:i + 2]!r}")
            chars.append(value[i + 1])
            i += 2
        elif c == '"':
            return "".join(chars), i + 1
        elif not " " <= c <= "~":
            raise ValueError(f"a string holds printable ASCII only, got {c!r}")
        else:
            chars.append(c)
            i += 1
    raise ValueError("the string has no closing quote")


def _skip_parameters(value: str, i: int) -> int:
    """The index after the parameters (``;key`` or ``;key=bare-item``, any number) at ``value[i]``."""
    while value[i:i + 1] == ";":
        i += 1
        while value[i:i + 1] == " ":
            i += 1
        key = _PARAMETER_KEY.match(value, i)
        if key is None:
            raise ValueError(f"a parameter needs a lowercase key, got {value[i:i + 20]!r}")
        i = key.end()
        if value[i:i + 1] == "=":
            i = _skip_bare_item(value, i + 1)
    return i


def _skip_bare_item(value: str, i: int) -> int:
    """The index after the bare item (integer, decimal, string, token, byte sequence, boolean) at ``i``."""
    c = value[i:i + 1]
    if c == '"':
        return _parse_string(value, i)[1]
    if c == "?" and value[i + 1:i + 2] in ("0", "1"):
        return i + 2
    for pattern in (_TOKEN, _BYTES):
        match = pattern.match(value, i)
        if match is not None:
            return match.end()
    number = _NUMBER.match(value, i)
    if number is not None:
        digits, dot, fraction = number.group(1), number.group(2), number.group(3)
        if dot is None and len(digits) <= 15 or dot is not None and len(digits) <= 12 and 1 <= len(fraction) <= 3:
            return number.end()
    raise ValueError(f"a parameter has no valid value at {value[i:i + 20]!r}")


# ---- the request's fingerprint ------------------------------------------------------------------
def request_fingerprint(method: str, path: str, query: str, content_type: str, body: bytes) -> str:
    """What tells a retry from another request under the same key: method, path, query and body. A JSON
    body (``application/json`` or any ``+json`` type, that parses) counts by its canonical form, so
    that spacing, key order and escapes do not matter; any other body counts by its bytes."""
    parts = [method.encode(), path.encode(), query.encode()]
    media_type = content_type.split(";", 1)[0].strip().lower()
    canonical = None
    if media_type == "application/json" or media_type.endswith("+json"):
        try:
            canonical = canonical_json(json.loads(body), allow_nan=True)
        except (ValueError, RecursionError):  # not JSON after all (UnicodeDecodeError is a ValueError)
            canonical = None
    if canonical is None:
        parts.append(body)
    else:
        parts += [b"application/json", canonical]  # marks the canonical form
    return hashlib.sha256(b"\0".join(parts)).hexdigest()


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
