"""``distributed_lock``: wrap a function so that each call holds a lease on its resolved key.

Everything is decided once, at decoration: the template is parsed, bound to the signature, and the
single branch between ``def`` and ``async def`` picks the wrapper. Both wrappers use the same
``_LockSpec.guard``, so the async branch adds no copy of the logic.
"""

from __future__ import annotations

import functools

from ._typing import cast
from .client import LeaseClient
from .exceptions import LockLost
from .lock import (
    DEFAULT_LEASE_DURATION,
    DEFAULT_WAIT_TIMEOUT,
    LeaseOptions,
    SyncDistributedLock,
    check_cancel_on_lost,
    check_client,
)
from .stores.base import check_table

TYPE_CHECKING = False  # typing is not imported at run time: see _typing.py
if TYPE_CHECKING:
    from typing import Any, Awaitable, Callable, Coroutine, Optional, ParamSpec, TypeVar

    from .aio import DistributedLock

    _P = ParamSpec("_P")
    _R = TypeVar("_R")

__all__ = ["distributed_lock", "semaphore"]



class _LockSpec:
    """Everything a decorated function's calls share; ``guard`` builds one call's lease."""

    __slots__ = ("client", "table", "call_key", "options", "cancel_on_lost", "slots")

    def __init__(
        self,
        client: LeaseClient,
        table: str,
        call_key: Any,
        options: LeaseOptions,
        cancel_on_lost: bool,
        slots: Optional[dict[str, Any]] = None,
    ) -> None:
        self.client = client
        self.table = table
        self.call_key = call_key
        self.options = options  # validated once, at decoration
        self.cancel_on_lost = cancel_on_lost
        self.slots = slots  # a semaphore's limit and identity; None for a lock

    def guard(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> SyncDistributedLock:
        key = self.call_key.resolve(args, kwargs)
        if self.slots is not None:
            from .semaphores import Semaphore

            return Semaphore.for_slots(self.client, table=self.table, key=key, options=self.options, **self.slots)
        return SyncDistributedLock.with_options(self.client, table=self.table, key=key, options=self.options)

    def async_guard(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> DistributedLock:
        from .aio import AsyncSemaphore, DistributedLock

        key = self.call_key.resolve(args, kwargs)
        if self.slots is not None:
            return AsyncSemaphore.for_slots(self.client, table=self.table, key=key, options=self.options,
                                            cancel_on_lost=self.cancel_on_lost, **self.slots)
        return DistributedLock.with_options(self.client, table=self.table, key=key, options=self.options,
                                            cancel_on_lost=self.cancel_on_lost)


def _bind_template(core: Any, template: Any, fn: Callable[..., Any]) -> Any:
    """The template bound to ``fn``'s signature: a ``CallKey`` whose binder takes a call's arguments
    exactly as Python binds them for ``fn`` (see ``_call_binder``)."""
    import inspect  # here, at decoration: inspect costs 4 ms of every `import fastlease` otherwise

    signature = inspect.signature(fn)
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    for name in template.names:
        parameter = signature.parameters.get(name)
        if parameter is None or parameter.kind in variadic:
            raise ValueError(
                f"key placeholder {{{name}}} must name a regular argument of {fn.__qualname__}"
                f"{signature} (not *args or **kwargs)"
            )
    return core.CallKey(template, _call_binder(fn, signature, template.names))


def _call_binder(fn: Callable[..., Any], signature: Any, names: tuple[str, ...]) -> Callable[..., tuple[Any, ...]]:
    """A function with ``fn``'s parameters (names, kinds and defaults) that returns the values of
    ``names``. Calling it with a call's arguments binds them with CPython's own rules, so a
    positional-only parameter never takes a keyword of its name (that goes to ``**kwargs``), and a
    call that ``fn`` would reject raises ``fn``'s own TypeError before any request is sent."""
    import inspect

    empty = inspect.Parameter.empty
    # The stub's source carries no annotation and no default value (a default's repr need not be
    # valid source): `None` stands in for each default, and the real ones are installed below.
    stub = signature.replace(
        parameters=[parameter.replace(annotation=empty, default=empty if parameter.default is empty else None)
                    for parameter in signature.parameters.values()],
        return_annotation=empty,
    )
    namespace: dict[str, Any] = {}
    body = "".join(f"{name}, " for name in names)
    exec(f"def binder{stub}:\n    return ({body})\n", {}, namespace)  # noqa: S102 - source made above
    binder: Callable[..., tuple[Any, ...]] = namespace["binder"]
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    binder.__defaults__ = tuple(parameter.default for parameter in signature.parameters.values()
                                if parameter.kind in positional and parameter.default is not empty) or None
    binder.__kwdefaults__ = {parameter.name: parameter.default for parameter in signature.parameters.values()
                             if parameter.kind is inspect.Parameter.KEYWORD_ONLY
                             and parameter.default is not empty} or None
    # Python's binding errors name the function ("work() takes 1 positional argument but 2 were given").
    binder.__name__ = getattr(fn, "__name__", binder.__name__)
    binder.__qualname__ = getattr(fn, "__qualname__", binder.__qualname__)
    return binder


def distributed_lock(
    client: LeaseClient,
    *,
    table: str,
    key: str,
    lease_duration: float = DEFAULT_LEASE_DURATION,
    wait_timeout: float = DEFAULT_WAIT_TIMEOUT,
    max_hold: Optional[float] = None,
    on_lost: Optional[Callable[[LockLost], object]] = None,
    cancel_on_lost: bool = False,
) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Hold a lease on ``key`` (a template over the function's arguments) during each call.

    ``key="customer-sync:{customer_id}"`` resolves from the ``customer_id`` argument, which must be a
    str. The body is never retried: contention beyond ``wait_timeout`` raises ``LockNotAcquired``
    before the function runs. Signature, return value and exceptions are preserved; an ``async def``
    stays a coroutine function (it waits on worker threads, as :class:`~fastlease.DistributedLock`).
    ``lease_duration``, ``wait_timeout`` and ``max_hold`` (seconds) and ``on_lost`` are as for
    :class:`~fastlease.SyncDistributedLock`, and so are the exceptions of each call's release.
    ``cancel_on_lost=True`` (``async def`` only, as :class:`~fastlease.DistributedLock`'s): a call whose
    lease is lost is cancelled at its next ``await`` and raises ``LockLost``. A thread cannot be stopped
    safely, so a ``def`` gets a TypeError at decoration: check ``lease.raise_if_lost()`` between steps.

    Raises TypeError or ValueError at decoration for bad arguments, for a placeholder that names no
    regular argument of the function, and for generator functions; at a call, TypeError or ValueError
    when a key argument is not a str or the key is not 1-2,048 UTF-8 bytes.
    """
    options = LeaseOptions.from_seconds(lease_duration, wait_timeout, max_hold, on_lost)
    return _lease_decorator("distributed_lock", client, table, key, options, cancel_on_lost, None)


def semaphore(
    client: LeaseClient,
    *,
    table: str,
    key: str,
    limit: int,
    lease_duration: float = DEFAULT_LEASE_DURATION,
    wait_timeout: float = DEFAULT_WAIT_TIMEOUT,
    max_hold: Optional[float] = None,
    on_lost: Optional[Callable[[LockLost], object]] = None,
    cancel_on_lost: bool = False,
    identity: Optional[str] = None,
) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Hold one of ``limit`` slots of the semaphore ``key`` (a template, as ``distributed_lock``'s)
    during each call: at most ``limit`` calls run at once across every process. The arguments, the
    checks at decoration and the exceptions are ``distributed_lock``'s, plus ``limit`` (1-256) and
    ``identity`` as :class:`~fastlease.Semaphore` takes them."""
    from .semaphores import check_identity

    options = LeaseOptions.from_seconds(lease_duration, wait_timeout, max_hold, on_lost)
    check_client(client).engine_module.check_limit(limit)
    slots = {"limit": limit, "identity": check_identity(identity)}
    return _lease_decorator("semaphore", client, table, key, options, cancel_on_lost, slots)


def _lease_decorator(
    name: str, client: LeaseClient, table: str, key: str, options: LeaseOptions, cancel_on_lost: bool,
    slots: Optional[dict[str, Any]],
) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """The decorator both ``distributed_lock`` and ``semaphore`` return (``name`` is the caller's, for errors)."""
    check_client(client)
    core = client.engine_module
    check_cancel_on_lost(cancel_on_lost)
    check_table(table)
    template = core.KeyTemplate(key)

    def decorate(fn: Callable[_P, _R]) -> Callable[_P, _R]:
        import inspect  # at decoration, not at `import fastlease` (see _bind_template)

        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
            raise TypeError(
                f"{name} cannot wrap generator {fn.__qualname__}: the lease would end "
                "before the generator is consumed; lock inside the generator instead"
            )
        if not callable(fn):
            raise TypeError(f"{name} wraps functions, got {type(fn).__name__}")
        spec = _LockSpec(client, table, _bind_template(core, template, fn), options, cancel_on_lost, slots)
        if inspect.iscoroutinefunction(fn):
            # An async def's _R is its coroutine; the wrapper returns a coroutine of the same result.
            return cast("Callable[_P, _R]", _async_wrapper(fn, spec))
        if cancel_on_lost:
            raise TypeError(
                f"cancel_on_lost=True needs an async def, and {fn.__qualname__} is a def: a thread cannot be "
                "stopped safely; call lease.raise_if_lost() between its steps instead (docs/failure-model.md)"
            )
        return _sync_wrapper(fn, spec)

    return decorate


def _sync_wrapper(fn: Callable[_P, _R], spec: _LockSpec) -> Callable[_P, _R]:
    @functools.wraps(fn)
    def locked(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with spec.guard(args, kwargs):
            return fn(*args, **kwargs)

    return locked


def _async_wrapper(fn: Callable[_P, Awaitable[_R]], spec: _LockSpec) -> Callable[_P, Coroutine[Any, Any, _R]]:
    @functools.wraps(fn)
    async def locked(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        async with spec.async_guard(args, kwargs):
            return await fn(*args, **kwargs)

    return locked
