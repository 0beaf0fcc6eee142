"""What every HTTP integration of idempotency keys shares, with no web framework imported: the
``Idempotency-Key`` field's syntax (RFC 8941), the request's fingerprint, the problem answers (RFC 9457)
and their titles and details, the scoping of keys, and the stored form of a response.

``fastlease.idempotency.fastapi`` (FastAPI routes) and ``fastlease.django.idempotency`` (Django views and
Django REST framework) are each a thin layer over :class:`EndpointSpec`: they read the request's
method, path, query, content type, body and key fields, run the endpoint inside the
:class:`~fastlease.idempotency.IdempotentCall` it makes, and render the :class:`Problem` or the stored
response it gives back in their own response class. So a request gets the same answer, byte for byte
in the problem bodies, from either framework, and a response stored by one replays from the other.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
from typing import Any, Callable, Iterable, NamedTuple, Optional, Sequence, Union

from .. import _impl
from ..client import LeaseClient
from .calls import IdempotentCall, _CallSpec
from .exceptions import IdempotencyInProgress, IdempotencyKeyMismatch
from .serialization import canonical_json

__all__ = [
    "HEADER",
    "MAX_KEY_CHARS",
    "PROBLEM_BASE",
    "PROBLEM_JSON",
    "REPLAYED_HEADER",
    "REPLAY_HEADERS",
    "EndpointSpec",
    "NotStored",
    "Problem",
    "ReplayedResponse",
    "parse_idempotency_key",
    "request_fingerprint",
    "stored_response",
    "replayed_response",
]

#: The request header that carries the key (the IETF draft's name).
HEADER = "Idempotency-Key"
#: The response header that marks a replayed response.
REPLAYED_HEADER = "Idempotent-Replayed"
#: Response headers stored with the response and sent again on replay (others are per-response).
REPLAY_HEADERS = ("content-type", "location", "etag", "cache-control", "content-language")
#: The default start of the problem types: a tag URI (RFC 4151), which RFC 9457 allows for types that
#: are identifiers only. Each type is this followed by the problem's name.
PROBLEM_BASE = "tag:fastlease,2026:"
#: The media type of every problem answer (RFC 9457).
PROBLEM_JSON = "application/problem+json"
#: The longest key, quoted or bare.
MAX_KEY_CHARS = 255


class Problem(NamedTuple):
    """One problem answer: its status, its name (the end of its ``type``), title, detail and extra
    response headers. The frameworks render :meth:`body` as ``application/problem+json``."""

    status: int
    name: str
    title: str
    detail: str
    headers: Optional[dict[str, str]] = None

    def body(self, problem_base: str) -> dict[str, Any]:
        """The problem's JSON object (RFC 9457), its ``type`` being ``problem_base`` followed by its name."""
        return {"type": problem_base + self.name, "title": self.title, "status": self.status, "detail": self.detail}


class ReplayedResponse(NamedTuple):
    """A stored response as it is sent again: status, headers (``Idempotent-Replayed: true`` last), body."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes


class NotStored(Exception):
    """Leaves an idempotent call's block with a response that must not be stored (a 5xx). Every
    Exception is in the endpoints' ``retry_on``, so the key is released and the client may retry;
    ``response`` is the framework's response object, answered as it is."""

    def __init__(self, response: Any, status: int) -> None:
        super().__init__(status)
        self.response = response


class _ResponseJSON:
    """Stored responses are JSON dicts (the body in base64)."""

    def dumps(self, value: Any) -> bytes:
        return json.dumps(value, separators=(",", ":")).encode()

    def loads(self, data: bytes) -> Any:
        return json.loads(data)


_RESPONSE_JSON = _ResponseJSON()


class EndpointSpec:
    """What every request of one idempotent endpoint (a router, a view) shares, validated once.

    ``client`` may be None when the framework picks a client per process (Django's settings): the
    options that need no client are still checked now, and :meth:`call` is then given the process's
    client (whose own checks run at its first call). The other options are those of
    ``idempotent_route``. Raises TypeError or ValueError for bad options, including a client whose
    store keeps no idempotency records.
    """

    __slots__ = ("table", "lock_table", "lease_duration", "wait", "ttl", "header", "required", "scope", "guarded",
                 "kept", "problem_base", "_calls")

    def __init__(self, client: Optional[LeaseClient], *, table: str, lock_table: Optional[str], header: str,
                 required: bool, scope: Optional[Callable[[Any], str]], methods: Sequence[str],
                 lease_duration: float, wait: float, ttl: Optional[float], replay_headers: Sequence[str],
                 problem_base: str) -> None:
        if scope is not None and not callable(scope):
            raise TypeError(f"scope must be a function of the request returning a str, got {scope!r}")
        if not isinstance(problem_base, str):
            raise TypeError(f"problem_base must be a str (a URI prefix), got {type(problem_base).__name__}")
        if not isinstance(header, str) or not header:
            raise TypeError(f"header must be the name of a request header (a str), got {header!r}")
        self.table, self.lock_table = table, lock_table
        self.lease_duration, self.wait, self.ttl = lease_duration, wait, ttl
        self.header = header
        self.required = required
        self.scope = scope
        self.guarded = frozenset(method.upper() for method in methods)
        self.kept = tuple(name.lower() for name in replay_headers)  # the replayed response headers
        self.problem_base = problem_base
        #: The one client whose call options are made (and checked), and those options.
        self._calls: Optional[tuple[LeaseClient, _CallSpec]] = None
        if client is not None:
            self._call_spec(client)
        else:  # the options that need no client, checked now rather than at the first request
            _CallSpec.checked(_impl.core, table, lock_table, lease_duration, wait, ttl, _RESPONSE_JSON, (Exception,))

    def _call_spec(self, client: LeaseClient) -> _CallSpec:
        made = self._calls
        if made is not None and made[0] is client:
            return made[1]
        spec = _CallSpec(client, self.table, self.lock_table, self.lease_duration, self.wait, self.ttl,
                         _RESPONSE_JSON, (Exception,))
        self._calls = (client, spec)  # one tuple, replaced whole: threads see the old pair or the new one
        return spec

    def guards(self, method: str) -> bool:
        """Whether requests of ``method`` are guarded (the others simply run)."""
        return method.upper() in self.guarded

    def key_or_problem(self, fields: Sequence[str]) -> Union[str, Problem, None]:
        """The key that the request's ``header`` fields carry; None when there is none and it is not
        required (the request simply runs); else the 400 problem: missing, or malformed (sent more
        than once, or not the field's syntax)."""
        header = self.header
        if not fields:
            if not self.required:
                return None
            return Problem(400, "idempotency-key-missing", f"{header} is missing",
                           f"the {header} header is required: send a unique key, such as a "
                           f'UUID, as {header}: "<key>", and the same key when you retry')
        try:
            if len(fields) > 1:
                raise ValueError(f"it was sent {len(fields)} times: send one {header} field")
            return parse_idempotency_key(fields[0])
        except ValueError as error:
            return Problem(400, "idempotency-key-malformed", f"{header} is malformed",
                           f"the {header} header must be a structured-field string with its quotes, "
                           f'such as "8e03978e-40d5-43e8-bc93-6894a57f9324", or 1-{MAX_KEY_CHARS} '
                           f"visible ASCII characters without quotes: {error}")

    def scoped_key(self, request: Any, idempotency_key: str) -> str:
        """The record's key: the request's ``Idempotency-Key`` within the scope of its client (one shared
        scope when there is no ``scope``, or it returns ""). What ``scope(request)`` raises propagates:
        the framework answers it before anything runs."""
        owner_scope = self.scope(request) if self.scope is not None else ""
        if not isinstance(owner_scope, str):
            raise TypeError(f"scope() must return a str, got {type(owner_scope).__name__}")
        # The scope (an identity) is hashed: fixed length, and never readable in the store.
        scoped = hashlib.sha256(owner_scope.encode()).hexdigest()[:32] if owner_scope else "-"
        return f"http:{scoped}:{idempotency_key}"

    def call(self, client: LeaseClient, key: str, fingerprint: str) -> IdempotentCall:
        """The idempotent call of one request (``key`` from :meth:`scoped_key`) on ``client``."""
        return IdempotentCall._from_spec(self._call_spec(client), key, fingerprint)

    def problem_for(self, error: Union[IdempotencyInProgress, IdempotencyKeyMismatch]) -> Problem:
        """The problem answer to what entering a call raised: 409 with ``Retry-After`` while a request
        with the key is in flight, 422 when the key was used with a different request."""
        header = self.header
        if isinstance(error, IdempotencyInProgress):
            return Problem(409, "idempotency-key-in-progress", f"A request is outstanding for this {header}",
                           f"a request with this {header} is in progress: retry after Retry-After seconds",
                           {"Retry-After": str(max(1, math.ceil(error.retry_after)))})
        return Problem(422, "idempotency-key-reused", f"{header} is already used",
                       f"this {header} was used with a different request (method, path, query or "
                       f"body): resend the first request unchanged, or use a new key for a new one")


# ---- stored responses ---------------------------------------------------------------------------
def stored_response(response: object, status: int, headers: Iterable[tuple[str, str]], body: Any,
                    kept: Sequence[str]) -> dict[str, Any]:
    """The record of ``response``: its status, its headers named in ``kept`` (lowercase) and its body,
    which must be bytes (TypeError naming the response's class otherwise: a streaming response cannot be
    stored)."""
    if not isinstance(body, (bytes, bytearray)):
        raise TypeError(f"{type(response).__name__} has no body to store: idempotent endpoints cannot stream; "
                        "return a response with its whole body")
    stored_headers = [[name, value] for name, value in headers if name.lower() in kept]
    return {"status": status, "headers": stored_headers, "body": base64.b64encode(bytes(body)).decode()}


def replayed_response(stored: dict[str, Any]) -> ReplayedResponse:
    """The response that :func:`stored_response` recorded, as it is sent again."""
    headers = [(str(name), str(value)) for name, value in stored["headers"]]
    headers.append((REPLAYED_HEADER, "true"))
    return ReplayedResponse(int(stored["status"]), headers, base64.b64decode(stored["body"]))


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
