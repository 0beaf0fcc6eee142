"""Django views and Django REST framework views whose requests are idempotent by their
``Idempotency-Key`` header::

    from fastlease.django.idempotency import idempotent_view

    @require_POST
    @idempotent_view(table="payments")
    def create_payment(request):
        ...                                   # runs once per Idempotency-Key
        return JsonResponse(receipt, status=201)

The answers are those of the FastAPI integration (``fastlease.idempotency.fastapi``), from the same
code (``fastlease.idempotency.http``): 400 ``idempotency-key-missing`` or ``-malformed``, 409
``idempotency-key-in-progress`` with ``Retry-After``, 422 ``idempotency-key-reused``, each an
``application/problem+json`` body; a repeat gets the first response's status, body and
``replay_headers``, plus ``Idempotent-Replayed: true``. The key is a structured-field string
(``Idempotency-Key: "8e03978e-..."``) or its bare form; ``scope(request)`` scopes keys per client.

What is stored is the view's response once rendered (a ``TemplateResponse`` or a DRF ``Response`` is
rendered first). The exceptions Django answers with a 4xx (``Http404``, ``PermissionDenied``,
``BadRequest``, ``SuspiciousOperation``; in a DRF view, every exception its handler answers, such as
``ValidationError``) are final answers, stored as Django or DRF renders them; any other exception,
and a 5xx response, stores nothing, so the client may retry. Streaming responses are refused
(TypeError).

Where it goes: on a function view; on a method of a class-based view, directly or through
``method_decorator(idempotent_view(...), name="post")``; on a method of a DRF ``APIView`` or viewset
(``post``, ``create``...), where the request is DRF's, so ``scope`` sees ``request.user`` as DRF's
authentication set it. The client is the settings' (``fastlease.django.get_client()``, made in each
process) unless ``client=`` gives one. Views run synchronously (under ASGI, Django runs them on a
thread); ``async def`` views are refused.
"""

from __future__ import annotations

import functools
import inspect
import sys
from typing import Any, Callable, Optional, Sequence, TypeVar

from django.core.exceptions import BadRequest, PermissionDenied, SuspiciousOperation
from django.core.handlers.exception import response_for_exception
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.http.request import RawPostDataException

from ..client import LeaseClient
from ..idempotency.calls import IdempotentCall
from ..idempotency.exceptions import IdempotencyInProgress, IdempotencyKeyMismatch
from ..idempotency.http import (
    HEADER,
    PROBLEM_BASE,
    PROBLEM_JSON,
    REPLAY_HEADERS,
    EndpointSpec,
    NotStored,
    Problem,
    replayed_response,
    request_fingerprint,
    stored_response,
)
from ..idempotency.records import DEFAULT_TTL
from ..lock import DEFAULT_LEASE_DURATION
from . import get_client

__all__ = ["idempotent_view"]

View = TypeVar("View", bound=Callable[..., Any])

#: The exceptions Django's request handler answers with a 4xx: final answers, stored as it renders them.
CLIENT_ERRORS = (Http404, PermissionDenied, BadRequest, SuspiciousOperation)


def idempotent_view(
    *,
    table: str,
    client: Optional[LeaseClient] = None,
    lock_table: Optional[str] = None,
    header: str = HEADER,
    required: bool = True,
    scope: Optional[Callable[[Any], str]] = None,
    methods: Sequence[str] = ("POST", "PATCH"),
    lease_duration: float = DEFAULT_LEASE_DURATION,
    wait: float = 0.0,
    ttl: Optional[float] = DEFAULT_TTL,
    replay_headers: Sequence[str] = REPLAY_HEADERS,
    problem_base: str = PROBLEM_BASE,
) -> Callable[[View], View]:
    """A decorator that makes a view idempotent by its requests' ``Idempotency-Key``: see the module
    documentation.

    ``table`` keeps the stored responses (``lock_table``, default ``<table>_locks``, the in-flight
    leases); ``client`` is the lease client (default: the settings', per process); ``header`` names the
    key's header and ``required`` whether a request without it is refused (400) or simply runs;
    ``scope(request)`` returns the client's identity (a str) that keys are scoped to; only requests
    whose method is in ``methods`` are guarded; ``lease_duration``, ``wait`` and ``ttl`` are seconds,
    as for :class:`~fastlease.idempotency.IdempotentCall`; ``replay_headers`` are the response headers
    stored and replayed; ``problem_base`` starts the ``type`` of every problem answer. Raises
    TypeError or ValueError for bad options (an ``async def`` view among them).
    """
    spec = EndpointSpec(client, table=table, lock_table=lock_table, header=header, required=required, scope=scope,
                        methods=methods, lease_duration=lease_duration, wait=wait, ttl=ttl,
                        replay_headers=replay_headers, problem_base=problem_base)

    def decorate(view: View) -> View:
        if inspect.iscoroutinefunction(view):
            raise TypeError(f"idempotent_view decorates sync views, and {view.__qualname__} is async def: make it a "
                            "def (Django runs sync views on a thread under ASGI)")

        @functools.wraps(view)
        def idempotent(*args: Any, **kwargs: Any) -> Any:
            return _answer(spec, client, _request_of(view, args), view, args, kwargs)

        return idempotent  # type: ignore[return-value]  # (functools.wraps keeps the view's signature)

    return decorate


def _request_of(view: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """The request among a view's arguments: the first (a function view, or a method through
    ``method_decorator``) or the second (a method decorated directly: ``self`` comes first)."""
    for candidate in args[:2]:
        if _is_request(candidate):
            return candidate
    raise TypeError(f"idempotent_view decorates views, whose first argument (a method's second) is the request; "
                    f"{view.__qualname__} got {', '.join(type(arg).__name__ for arg in args[:2]) or 'no arguments'}")


def _is_request(candidate: Any) -> bool:
    if isinstance(candidate, HttpRequest):
        return True
    drf = sys.modules.get("rest_framework.request")  # loaded already if the request is DRF's
    return drf is not None and isinstance(candidate, drf.Request)


def _drf_view(request: Any) -> Any:
    """The DRF view that handles ``request``, or None for a Django request."""
    return None if isinstance(request, HttpRequest) else request.parser_context["view"]


def _answer(spec: EndpointSpec, client: Optional[LeaseClient], request: Any, view: Callable[..., Any],
            args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The response to one request: the view's own, run once (or simply run, unguarded or keyless),
    the stored one replayed, or a problem."""
    if not spec.guards(request.method):
        return view(*args, **kwargs)
    value = request.headers.get(spec.header)
    # One field: a WSGI server joins repeated fields with commas, which makes them malformed.
    found = spec.key_or_problem([] if value is None else [value])
    if found is None:
        return view(*args, **kwargs)
    if isinstance(found, Problem):
        return _problem(spec, found)
    # scope() first: one that refuses the request (PermissionDenied) answers before the body is read.
    key = spec.scoped_key(request, found)
    fingerprint = request_fingerprint(request.method, request.path, request.META.get("QUERY_STRING", ""),
                                      request.META.get("CONTENT_TYPE", ""), _body(request))
    call = spec.call(client if client is not None else get_client(), key, fingerprint)
    try:
        return _run_once(call, lambda: _final_response(request, view, args, kwargs), spec.kept)
    except (IdempotencyInProgress, IdempotencyKeyMismatch) as error:
        return _problem(spec, spec.problem_for(error))


def _body(request: Any) -> bytes:
    try:
        body: bytes = request.body
    except RawPostDataException:
        raise TypeError(
            "the request's body was read as a stream before the idempotent view (a multipart upload read by "
            "CsrfViewMiddleware or DRF's SessionAuthentication), so it cannot be fingerprinted: exempt the view "
            "from CSRF checks, or use a JSON body") from None
    return body


def _run_once(call: IdempotentCall, final: Callable[[], Any], kept: tuple[str, ...]) -> Any:
    """The stored response replayed, or the view's own (final) response, stored with the ``kept``
    headers unless it is a 5xx. What entering ``call`` raises propagates, and so does the view's own
    exception, which stores nothing (every Exception is in ``retry_on``)."""
    try:
        with call:
            if call.replayed:
                return _replay(call.result)
            response = final()
            if response.status_code >= 500:
                raise NotStored(response, response.status_code)  # leaving the block releases the key for a retry
            body = None if getattr(response, "streaming", False) else response.content
            call.complete(stored_response(response, response.status_code, response.headers.items(), body, kept))
            return response
    except NotStored as not_stored:
        return not_stored.response


def _final_response(request: Any, view: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The view's response as the client will get it, rendered: a 4xx exception turned into the response
    Django (or, in a DRF view, DRF) would answer; other exceptions propagate."""
    drf_view = _drf_view(request)
    if drf_view is not None:
        try:
            response = view(*args, **kwargs)
        except Exception as error:
            response = drf_view.handle_exception(error)  # DRF's answer; raises what DRF leaves to Django
        # What DRF's dispatch does next, done now so that the stored bytes are those sent.
        response = drf_view.finalize_response(request, response, *drf_view.args, **drf_view.kwargs)
    else:
        try:
            response = view(*args, **kwargs)
        except CLIENT_ERRORS as error:
            response = response_for_exception(request, error)
    render = getattr(response, "render", None)
    if callable(render) and not getattr(response, "is_rendered", True):
        render()
    return response


def _problem(spec: EndpointSpec, problem: Problem) -> JsonResponse:
    """An ``application/problem+json`` answer (RFC 9457), a plain Django response (DRF passes it on)."""
    response = JsonResponse(problem.body(spec.problem_base), status=problem.status, content_type=PROBLEM_JSON)
    for name, value in (problem.headers or {}).items():
        response[name] = value
    return response


def _replay(stored: dict[str, Any]) -> HttpResponse:
    replayed = replayed_response(stored)
    response = HttpResponse(content=replayed.body, status=replayed.status)
    del response["Content-Type"]  # Django's default: the stored response's own is among its headers, if it had one
    for name, value in replayed.headers:
        response[name] = value
    return response
