"""``@idempotent``: an :class:`~fastlease.idempotency.IdempotentCall` around each call of a ``def``
or an ``async def``, keyed by a template over its arguments."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Awaitable, Callable, Coroutine, Literal, Optional, ParamSpec, TypeVar, Union, cast

from ..client import LeaseClient
from ..lock import DEFAULT_LEASE_DURATION
from .calls import AsyncIdempotentCall, IdempotentCall, RetryOn, _CallSpec
from .records import DEFAULT_TTL
from .serialization import JSON, Serializer, payload_fingerprint

__all__ = ["idempotent"]

_P = ParamSpec("_P")
_R = TypeVar("_R")

# ``payload``: None (every argument), a tuple of argument names, or False (no fingerprint).
_Payload = Union[Literal[False], tuple[str, ...], None]


def idempotent(
    client: LeaseClient,
    *,
    table: str,
    key: str,
    payload: Union[Literal[False], tuple[str, ...], None] = None,
    lock_table: Optional[str] = None,
    lease_duration: float = DEFAULT_LEASE_DURATION,
    wait: float = 0.0,
    ttl: Optional[float] = DEFAULT_TTL,
    serializer: Serializer = JSON,
    retry_on: RetryOn = (Exception,),
) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Run each call once per resolved ``key`` (a template over the arguments, as for locks); a
    duplicate returns the stored result.

    ``payload`` chooses what the fingerprint covers: None (every argument, by name), a tuple of
    argument names, or False (no fingerprint). The other options (durations in seconds) and the
    exceptions of each call are as for :class:`IdempotentCall`. Works on ``def`` and ``async def``
    (which stays a coroutine function); the first call returns its own result, replays return
    ``serializer.loads`` of the stored one (with JSON, a tuple comes back as a list). Bad options, a
    placeholder that names no regular argument, and generator functions raise TypeError or ValueError
    at decoration.
    """
    from ..decorator import _bind_template

    spec = _CallSpec(client, table, lock_table, lease_duration, wait, ttl, serializer, retry_on)
    core = client.engine_module
    template = core.KeyTemplate(key)
    _check_payload(payload)

    def decorate(fn: Callable[_P, _R]) -> Callable[_P, _R]:
        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn) or not callable(fn):
            raise TypeError(f"idempotent wraps plain functions and coroutine functions, got {fn!r}")
        calls = _FunctionSpec(spec, _bind_template(core, template, fn), fn, payload)
        if inspect.iscoroutinefunction(fn):
            # An async def's _R is its coroutine; the wrapper returns a coroutine of the same result.
            return cast("Callable[_P, _R]", _async_wrapper(fn, calls))
        return _sync_wrapper(fn, calls)

    return decorate


def _check_payload(payload: Any) -> None:
    """TypeError unless ``payload`` is one of its three forms (names are checked against each function)."""
    if not (payload is None or payload is False or
            (isinstance(payload, tuple) and all(isinstance(name, str) for name in payload))):
        raise TypeError(f"payload must be None, False or a tuple of argument names, got {payload!r}")


class _FunctionSpec:
    """Everything a decorated function's calls share, validated at decoration; ``start`` builds one
    call's IdempotentCall. Both wrappers start their calls here, so the async one adds no logic."""

    __slots__ = ("spec", "call_key", "signature", "payload")

    def __init__(self, spec: _CallSpec, call_key: Any, fn: Callable[..., Any], payload: _Payload) -> None:
        self.spec = spec
        self.call_key = call_key
        self.signature = inspect.signature(fn)
        self.payload = payload  # of a valid form (_check_payload); its names are checked here, against fn
        if isinstance(payload, tuple):
            missing = [name for name in payload if name not in self.signature.parameters]
            if missing:
                raise ValueError(f"payload names {missing} are not arguments of {fn.__qualname__}{self.signature}")

    def start(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> IdempotentCall:
        fingerprint = self._fingerprint(args, kwargs)
        return IdempotentCall._from_spec(self.spec, self.call_key.resolve(args, kwargs), fingerprint)

    def _fingerprint(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The fingerprint of the arguments that ``payload`` covers, by name ("" for ``payload=False``)."""
        if self.payload is False:
            return ""
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values = bound.arguments if self.payload is None else {name: bound.arguments[name] for name in self.payload}
        return payload_fingerprint(values)


def _sync_wrapper(fn: Callable[_P, _R], calls: _FunctionSpec) -> Callable[_P, _R]:
    @functools.wraps(fn)
    def run(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with calls.start(args, kwargs) as call:
            if call.replayed:
                # serializer.loads of the stored result: an _R as far as the serializer round-trips
                # it (JSON gives a tuple back as a list).
                replayed: _R = call.result
                return replayed
            result = fn(*args, **kwargs)
            call.complete(result)
            return result

    return run


def _async_wrapper(fn: Callable[_P, Awaitable[_R]], calls: _FunctionSpec) -> Callable[_P, Coroutine[Any, Any, _R]]:
    @functools.wraps(fn)
    async def run_async(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        async with AsyncIdempotentCall._wrap(calls.start(args, kwargs)) as call:
            if call.replayed:
                replayed: _R = call.result  # serializer.loads of the stored result, as in _sync_wrapper
                return replayed
            result = await fn(*args, **kwargs)
            await call.complete(result)
            return result

    return run_async
