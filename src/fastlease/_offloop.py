"""Blocking steps of the async API, run off the event loop on a client's own worker threads.

Every ``async`` form in fastlease (the async guard, ``AsyncIdempotentCall``, the DynamoDB helpers and
``Transaction``) is a sync step handed to :func:`run` and awaited through :func:`shielded`; the
wrappers add no logic of their own. The steps run on the client's bounded executors (not the loop's
default one, which a few lock waits would starve), each in a copy of the caller's ``contextvars``
context, so that what a step reports (``fastlease.otel``'s spans) belongs to the task's current span.

A step that was started is never torn off half-done: cancelling the awaiting task cancels only its
wait, and an outcome nobody awaits any more is retrieved (:func:`consume`), so that nothing is
reported as "exception was never retrieved".
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Callable, TypeVar

if TYPE_CHECKING:
    from .client import LeaseClient

__all__ = ["consume", "run", "run_to_completion", "shielded"]

# Under the async guard's name: docs/operations.md lists these messages under the logger fastlease.aio.
_log = logging.getLogger("fastlease.aio")

_T = TypeVar("_T")


def run(client: LeaseClient, fn: Callable[..., _T], *args: Any, short: bool = False) -> Future[_T]:
    """Start ``fn(*args)`` on the client's executor (``short``: the pool for steps that never wait for
    contention, such as releases). The caller awaits it through :func:`shielded`; follow-ups hang on
    the concurrent future itself, so they run even if the event loop is gone."""
    return client._async_executor(short).submit(contextvars.copy_context().run, fn, *args)


def consume(future: Future[Any]) -> None:
    """Retrieve a background outcome so that nothing is reported as never retrieved."""
    if not future.cancelled() and future.exception() is not None:
        _log.debug("background lease step failed: %r", future.exception())


async def shielded(future: Future[_T]) -> _T:
    """Await a step that must not be interrupted: cancelling the caller leaves it running.

    The awaited object is a plain loop future that the worker thread completes; cancelling the task
    cancels only that notification, never the step itself (which is why no ``asyncio.shield`` and no
    ``wrap_future`` chain is needed: one future and one thread-safe callback per step)."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[_T] = loop.create_future()

    def deliver(step: Future[_T]) -> None:  # on the loop thread
        if waiter.cancelled():
            consume(step)  # the caller is gone: retrieve the outcome so nothing is left unretrieved
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
            consume(step)

    future.add_done_callback(on_done)
    return await waiter


async def run_to_completion(client: LeaseClient, fn: Callable[..., _T], *args: Any, short: bool = False) -> _T:
    """``fn(*args)`` off the loop, awaited; a cancelled caller leaves it running to its end. For steps
    whose caller has nothing to undo if cancelled (an acquisition, which does, uses :func:`run`)."""
    return await shielded(run(client, fn, *args, short=short))
