"""``DistributedLock``: the async guard. It wraps the sync engine; it adds no protocol logic.

Each blocking step runs in a worker thread of the client's own bounded executor (not the event
loop's default one: a few waits of up to ``wait_timeout`` would otherwise starve every other
``asyncio.to_thread`` user of the loop). What this module adds is only cancellation handling:

* cancelled while acquiring: the engine is told (``Lease.cancel``) so the thread stops waiting and a
  write confirmed afterwards is deleted instead of held; if the thread had already acquired, the
  lease is released in the background within its cleanup budget. No live guard is ever left.
* cancelled while releasing: the release goes on to completion; the cancellation is re-raised.
  (A store whose requests cannot block releases inline on the loop, which nothing can interrupt.)
* nothing leaves a "Task exception was never retrieved" warning: background outcomes are consumed.

As with ``asyncio.to_thread``, each step runs in a copy of the task's context (its ``contextvars``),
so that what it reports (``fastlease.otel``'s spans) belongs to the task's current span.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from concurrent.futures import Future
from types import TracebackType
from typing import Any, Callable, Optional, Self, Type, TypeVar

from .client import LeaseClient
from .exceptions import LockLost
from .lock import DEFAULT_LEASE_DURATION, DEFAULT_WAIT_TIMEOUT, LeaseOptions, LeaseView, SyncDistributedLock

__all__ = ["DistributedLock"]

_log = logging.getLogger("fastlease.aio")

_T = TypeVar("_T")


def _run(client: LeaseClient, fn: Callable[..., _T], *args: Any, short: bool = False) -> Future[_T]:
    """Start ``fn(*args)`` on the client's executor (``short``: the pool for steps that never wait for
    contention, such as releases). The caller awaits it through ``_shielded``; follow-ups hang on
    the concurrent future itself, so they run even if the event loop is gone."""
    return client._async_executor(short).submit(contextvars.copy_context().run, fn, *args)


def _consume(future: "Future[Any]") -> None:
    """Retrieve a background outcome so that nothing is reported as never retrieved."""
    if not future.cancelled() and future.exception() is not None:
        _log.debug("background lease step failed: %r", future.exception())


async def _shielded(future: Future[_T]) -> _T:
    """Await a step that must not be interrupted: cancelling the caller leaves it running.

    The awaited object is a plain loop future that the worker thread completes; cancelling the task
    cancels only that notification, never the step itself (which is why no ``asyncio.shield`` and no
    ``wrap_future`` chain is needed: one future and one thread-safe callback per step)."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[_T] = loop.create_future()

    def deliver(step: Future[_T]) -> None:  # on the loop thread
        if waiter.cancelled():
            _consume(step)  # the caller is gone: retrieve the outcome so nothing is left unretrieved
            return
        error = step.exception()
        if error is not None:
            waiter.set_exception(error)
        else:
            waiter.set_result(step.result())

    def on_done(step: Future[_T]) -> None:  # on the worker thread (or at once, if already done)
        try:
            loop.call_soon_threadsafe(deliver, step)
        except RuntimeError:  # the loop is closed: nobody awaits any more
            _consume(step)

    future.add_done_callback(on_done)
    return await waiter


class DistributedLock(LeaseView):
    """``async with DistributedLock(client, table="locks", key="k") as lease:`` — the async form of
    :class:`~fastlease.SyncDistributedLock`, with the same arguments (seconds), semantics, exceptions
    and members. ``lease`` is this guard: its properties, checks and ``metrics`` never block, before,
    during and after the block. Without ``async with``: ``await guard.acquire()`` and ``await
    guard.release()``. Waiting runs on the client's worker threads; cancelled while waiting, nothing is
    left held. ``on_lost`` runs in a worker thread: use ``loop.call_soon_threadsafe`` to reach the loop."""

    __slots__ = ("_guard",)

    def __init__(
        self,
        client: LeaseClient,
        *,
        table: str,
        key: str,
        lease_duration: float = DEFAULT_LEASE_DURATION,
        wait_timeout: float = DEFAULT_WAIT_TIMEOUT,
        max_hold: Optional[float] = None,
        on_lost: Optional[Callable[[LockLost], object]] = None,
    ) -> None:
        self._adopt(SyncDistributedLock(
            client, table=table, key=key, lease_duration=lease_duration, wait_timeout=wait_timeout,
            max_hold=max_hold, on_lost=on_lost,
        ))

    @classmethod
    def with_options(cls, client: LeaseClient, *, table: str, key: str, options: LeaseOptions) -> Self:
        """A guard from options validated once for many guards (as ``SyncDistributedLock.with_options``)."""
        return cls._from_guard(SyncDistributedLock.with_options(client, table=table, key=key, options=options))

    @classmethod
    def _from_guard(cls, guard: SyncDistributedLock) -> Self:
        lock = cls.__new__(cls)
        lock._adopt(guard)
        return lock

    def _adopt(self, guard: SyncDistributedLock) -> None:
        self._guard = guard  # the sync guard whose steps run on worker threads
        self._lease = guard._lease  # what the shared members (LeaseView) read

    async def acquire(self) -> Self:
        """Acquire the lease, as entering ``async with`` does, and return this guard, held. Cancelled
        while waiting: the engine stops waiting, and a lease acquired meanwhile is released."""
        acquiring = _run(self._guard.client, self._guard.acquire)
        try:
            await _shielded(acquiring)
        except asyncio.CancelledError:
            self._guard.cancel()
            acquiring.add_done_callback(self._release_if_acquired)
            raise
        return self

    async def release(self) -> None:
        """Release the lease, with the outcomes of ``SyncDistributedLock.release``. Cancelled while
        releasing: the release goes on to completion."""
        await _shielded(_run(self._guard.client, self._guard.release, short=True))

    async def release_by_write(self, write: Callable[[float], bool], landed: Callable[[float], bool]) -> None:
        """``SyncDistributedLock.release_by_write``, on a worker thread (``write`` and ``landed`` run there)."""
        await _shielded(_run(self._guard.client, self._guard.release_by_write, write, landed, short=True))

    async def __aenter__(self) -> Self:
        return await self.acquire()

    def _release_if_acquired(self, acquiring: Future[SyncDistributedLock]) -> None:
        """After a cancelled acquisition finishes: release what it may have acquired, off the loop."""
        if acquiring.cancelled() or acquiring.exception() is not None:
            return  # not acquired (the engine already cleaned up)
        _run(self._guard.client, self._guard.__exit__, None, None, None, short=True).add_done_callback(
            _consume)

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        # Cancelling here leaves the release running; _shielded retrieves its outcome.
        await _shielded(_run(self._guard.client, self._guard.__exit__, exc_type, exc, traceback, short=True))
