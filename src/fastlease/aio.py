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
* ``cancel_on_lost=True``: at the loss, the task running the ``async with`` body is cancelled, and the
  block ends with the release's ``LockLost`` (its cause) instead of the ``CancelledError``. The engine
  only calls ``on_lost``; ``_BodyCanceller`` turns that call, from whichever thread found the loss,
  into ``Task.cancel`` on the loop, and takes the cancellation back (``Task.uncancel``) at the block's
  end. A cancellation from elsewhere during the same block still ends it with ``CancelledError``.

As with ``asyncio.to_thread``, each step runs in a copy of the task's context (its ``contextvars``),
so that what it reports (``fastlease.otel``'s spans) belongs to the task's current span.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from types import TracebackType
from typing import Any, Callable, Optional, Self, Type

from ._offloop import consume, run, run_to_completion, shielded
from ._typing import cast
from .client import LeaseClient
from .exceptions import LockLost
from .lock import (
    DEFAULT_LEASE_DURATION,
    DEFAULT_WAIT_TIMEOUT,
    LeaseOptions,
    LeaseView,
    SyncDistributedLock,
    check_cancel_on_lost,
    check_client,
    guard_options,
)
from .semaphores import Semaphore, SlotMembers

__all__ = ["AsyncSemaphore", "DistributedLock"]


class DistributedLock(LeaseView):
    """``async with DistributedLock(client, table="locks", key="k") as lease:`` — the async form of
    :class:`~fastlease.SyncDistributedLock`, with the same arguments (seconds), semantics, exceptions
    and members. ``lease`` is this guard: its properties, checks and ``metrics`` never block, before,
    during and after the block. Without ``async with``: ``await guard.acquire()`` and ``await
    guard.release()``. Waiting runs on the client's worker threads; cancelled while waiting, nothing is
    left held. ``on_lost`` runs in a worker thread: use ``loop.call_soon_threadsafe`` to reach the loop.

    ``cancel_on_lost=True`` cancels the task running the ``async with`` body when the lease is lost, so
    that it stops at its next ``await``; the block then ends with ``LockLost`` (``cause`` says why),
    not ``CancelledError``. Only ``async with`` arms it (``acquire()`` and ``release()`` do not)."""

    __slots__ = ("_guard", "_canceller")

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
        cancel_on_lost: bool = False,
    ) -> None:
        options = guard_options(lease_duration, wait_timeout, max_hold, on_lost)  # as the sync guard's
        self._build(check_client(client), table, key, options, cancel_on_lost)

    @classmethod
    def with_options(cls, client: LeaseClient, *, table: str, key: str, options: LeaseOptions,
                     cancel_on_lost: bool = False) -> Self:
        """A guard from options validated once for many guards (as ``SyncDistributedLock.with_options``)."""
        lock = cls.__new__(cls)
        lock._build(client, table, key, options, cancel_on_lost)
        return lock

    def _build(self, client: LeaseClient, table: str, key: str, options: LeaseOptions, cancel_on_lost: bool) -> None:
        self._build_on(SyncDistributedLock.with_options, client, table, key, options, cancel_on_lost)

    def _build_on(self, make_guard: Callable[..., SyncDistributedLock], client: LeaseClient, table: str, key: str,
                  options: LeaseOptions, cancel_on_lost: bool, **more: Any) -> None:
        """The sync guard whose steps run on worker threads, made by ``make_guard`` (a lock's, or a
        semaphore's with its ``more`` arguments); with ``cancel_on_lost``, its ``on_lost`` is the
        canceller's, which calls the caller's first."""
        canceller = _BodyCanceller(options.on_lost) if check_cancel_on_lost(cancel_on_lost) else None
        if canceller is not None:
            options = options._replace(on_lost=canceller.on_lost)
        self._guard = make_guard(client, table=table, key=key, options=options, **more)
        self._lease = self._guard._lease  # what the shared members (LeaseView) read
        self._canceller = canceller  # cancel_on_lost's, else None

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
        if self._canceller is None:
            return await self.acquire()
        self._canceller.arm()
        await self.acquire()
        self._canceller.enter_body()
        return self

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
        if self._canceller is not None and self._canceller.leave_body() and isinstance(exc, asyncio.CancelledError):
            # Our own cancellation at the loss, and no other: the block ends with the release's LockLost.
            await run_to_completion(self._guard.client, self._guard.release, short=True)
            raise cast(LockLost, self._canceller.lost)  # (the release of a lost lease raises before this)
        # Cancelling here leaves the release running; its outcome is retrieved all the same.
        await run_to_completion(self._guard.client, self._guard.__exit__, exc_type, exc, traceback, short=True)


class AsyncSemaphore(SlotMembers, DistributedLock):
    """``async with AsyncSemaphore(client, table="locks", key="reports", limit=4) as lease:``: the async
    form of :class:`Semaphore`, with the same arguments, plus ``cancel_on_lost`` as
    :class:`~fastlease.DistributedLock` has it."""

    __slots__ = ()

    def __init__(
        self,
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
    ) -> None:
        options = guard_options(lease_duration, wait_timeout, max_hold, on_lost)
        self._build_on(Semaphore.for_slots, check_client(client), table, key, options, cancel_on_lost,
                       limit=limit, identity=identity)

    @classmethod
    def for_slots(cls, client: LeaseClient, *, table: str, key: str, limit: int, options: LeaseOptions,
                  cancel_on_lost: bool = False, identity: Optional[str] = None) -> Self:
        """A guard from options validated once for many guards (the decorator's path)."""
        guard = cls.__new__(cls)
        guard._build_on(Semaphore.for_slots, client, table, key, options, cancel_on_lost,
                        limit=limit, identity=identity)
        return guard



class _BodyCanceller:
    """``cancel_on_lost``: cancels the task that runs a guard's ``async with`` body at the loss. Every
    method but ``on_lost`` runs on the event loop's thread, so its fields need no lock."""

    __slots__ = ("_user_on_lost", "_loop", "_task", "_in_body", "lost", "_cancelled")

    def __init__(self, on_lost: Optional[Callable[[LockLost], object]]) -> None:
        self._user_on_lost = on_lost
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._task: Optional[asyncio.Task[object]] = None
        self._in_body = False
        self.lost: Optional[LockLost] = None  # the loss, once the loop has heard of it
        self._cancelled = False

    def arm(self) -> None:
        """Entering ``async with`` (before the acquisition, so before any loss): the task to cancel."""
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()

    def on_lost(self, error: LockLost) -> None:
        """The engine's ``on_lost``, once, in the thread that found the loss: the user's callback, then
        the loop is told."""
        try:
            if self._user_on_lost is not None:
                self._user_on_lost(error)
        finally:
            loop = self._loop
            if loop is not None:
                try:
                    loop.call_soon_threadsafe(self._heard, error)
                except RuntimeError:
                    pass  # the loop is closed: no body runs any more

    def _heard(self, error: LockLost) -> None:
        self.lost = error
        if self._in_body:
            self._cancel()

    def enter_body(self) -> None:
        """Acquired: the body runs from now on. A loss the loop heard of meanwhile cancels it at once."""
        self._in_body = True
        if self.lost is not None:
            self._cancel()

    def _cancel(self) -> None:
        if not self._cancelled and self._task is not None:
            self._cancelled = True
            self._task.cancel(f"fastlease: the lease on {cast(LockLost, self.lost).key!r} was lost")

    def leave_body(self) -> bool:
        """The body ended: no cancellation from now on. True if it was cancelled by the loss alone
        (the cancellation is taken back); False if not cancelled, or also cancelled from elsewhere."""
        self._in_body = False
        if not self._cancelled:
            return False
        return cast("asyncio.Task[object]", self._task).uncancel() == 0
