"""``DistributedLock``: the async guard. It wraps the sync engine; it adds no protocol logic.

Each blocking step runs in a worker thread of the client's own bounded executor (not the event
loop's default one: a few waits of up to ``wait_timeout`` would otherwise starve every other
``asyncio.to_thread`` user of the loop), through ``fastlease._offloop``, which the other async forms
share. What this module adds is only cancellation handling:

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
from concurrent.futures import Future
from types import TracebackType
from typing import Callable, Optional, Self, Type

from ._offloop import consume, run, run_to_completion, shielded
from .client import LeaseClient
from .exceptions import LockLost
from .lock import DEFAULT_LEASE_DURATION, DEFAULT_WAIT_TIMEOUT, LeaseOptions, LeaseView, SyncDistributedLock

__all__ = ["DistributedLock"]


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
        acquiring = run(self._guard.client, self._guard.acquire)
        try:
            await shielded(acquiring)
        except asyncio.CancelledError:
            self._guard.cancel()
            acquiring.add_done_callback(self._release_if_acquired)
            raise
        return self

    async def release(self) -> None:
        """Release the lease, with the outcomes of ``SyncDistributedLock.release``. Cancelled while
        releasing: the release goes on to completion."""
        await run_to_completion(self._guard.client, self._guard.release, short=True)

    async def release_by_write(self, write: Callable[[float], bool], landed: Callable[[float], bool]) -> None:
        """``SyncDistributedLock.release_by_write``, on a worker thread (``write`` and ``landed`` run there)."""
        await run_to_completion(self._guard.client, self._guard.release_by_write, write, landed, short=True)

    async def __aenter__(self) -> Self:
        return await self.acquire()

    def _release_if_acquired(self, acquiring: Future[SyncDistributedLock]) -> None:
        """After a cancelled acquisition finishes: release what it may have acquired, off the loop."""
        if acquiring.cancelled() or acquiring.exception() is not None:
            return  # not acquired (the engine already cleaned up)
        run(self._guard.client, self._guard.__exit__, None, None, None, short=True).add_done_callback(consume)

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        # Cancelling here leaves the release running; its outcome is retrieved all the same.
        await run_to_completion(self._guard.client, self._guard.__exit__, exc_type, exc, traceback, short=True)
