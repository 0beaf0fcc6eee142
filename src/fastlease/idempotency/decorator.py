"""``@idempotent``: an :class:`~fastlease.idempotency.IdempotentCall` around each call of a ``def``
or an ``async def``, keyed by a template over its arguments."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Literal, Optional, ParamSpec, TypeVar, Union, cast

from ..client import LeaseClient
from ..lock import DEFAULT_LEASE_DURATION
from .calls import AsyncIdempotentCall, IdempotentCall, RetryOn, _CallSpec
from .records import DEFAULT_TTL
from .serialization import JSON, Serializer, payload_fingerprint

__all__ = ["idempotent"]

_P = ParamSpec("_P")
_R = TypeVar("_R")


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
    if not (payload is None or payload is False or
            (isinstance(payload, tuple) and all(isinstance(name, str) for name in payload))):
        raise TypeError(f"payload must be None, False or a tuple of argument names, got {payload!r}")

    def decorate(fn: Callable[_P, _R]) -> Callable[_P, _R]:
        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn) or not callable(fn):
            raise TypeError(f"idempotent wraps plain functions and coroutine functions, got {fn!r}")
        call_key = _bind_template(core, template, fn)
        signature = inspect.signature(fn)
        if isinstance(payload, tuple):
            missing = [name for name in payload if name not in signature.parameters]
            if missing:
                raise ValueError(f"payload names {missing} are not arguments of {fn.__qualname__}{signature}")

        def start(args: tuple[Any, ...], kwargs: dict[str, Any]) -> IdempotentCall:
            fingerprint = ""
            if payload is not False:
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                values = bound.arguments if payload is None else {name: bound.arguments[name] for name in payload}
                fingerprint = payload_fingerprint(values)
            return IdempotentCall._from_spec(spec, call_key.resolve(args, kwargs), fingerprint)

        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def run_async(*args: _P.args, **kwargs: _P.kwargs) -> Any:
                async with AsyncIdempotentCall._wrap(start(args, kwargs)) as call:
                    if call.replayed:
                        return call.result
                    result = await fn(*args, **kwargs)
                    await call.complete(result)
                    return result

            # An async def's _R is its coroutine; the wrapper returns a coroutine of the same result.
            return cast("Callable[_P, _R]", run_async)

        @functools.wraps(fn)
        def run(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            with start(args, kwargs) as call:
                if call.replayed:
                    # serializer.loads of the stored result: an _R as far as the serializer round-trips
                    # it (JSON gives a tuple back as a list).
                    replayed: _R = call.result
                    return replayed
                result = fn(*args, **kwargs)
                call.complete(result)
                return result

        return run

    return decorate
