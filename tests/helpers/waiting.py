"""``wait_until``: the one way a test waits for a condition that another thread, process or server brings
about. Every wait is bounded, and one that runs out fails naming what it waited for."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Callable, Iterator, TypeVar, Union

T = TypeVar("T")
#: What a wait is for, said as "the waiter's mark"; or a function that says it when the wait fails (so that
#: the message can show the state it gave up on).
What = Union[str, Callable[[], str]]

#: How long to pause between two looks at the condition, unless the caller says otherwise.
INTERVAL_S = 0.005
_PAUSE = threading.Event()  # never set: waited on for the pauses (untouched by a patched time.sleep)


def _pauses(timeout: float, what: What, interval: float) -> Iterator[float]:
    """The pauses between looks, until ``timeout`` seconds from now: the last one ends at the deadline,
    and the next one asked for raises the AssertionError that names ``what``."""
    deadline = time.monotonic() + timeout
    remaining = timeout
    while remaining > 0:
        yield min(interval, remaining)
        remaining = deadline - time.monotonic()
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what() if callable(what) else what}")


def wait_until(predicate: Callable[[], T], timeout: float, what: What, *, interval: float = INTERVAL_S) -> T:
    """Call ``predicate`` until it returns a true value, and return that value; after ``timeout`` seconds
    without one, fail with an AssertionError naming ``what`` (say what is awaited: "the waiter's mark").
    The predicate is called at once, and a last time at the deadline."""
    pauses = _pauses(timeout, what, interval)
    value = predicate()
    while not value:
        _PAUSE.wait(next(pauses))
        value = predicate()
    return value


async def wait_until_async(predicate: Callable[[], T], timeout: float, what: What, *,
                           interval: float = INTERVAL_S) -> T:
    """``wait_until`` in a coroutine: the event loop runs during the pauses (its tasks may be what makes
    the condition hold)."""
    pauses = _pauses(timeout, what, interval)
    value = predicate()
    while not value:
        await asyncio.sleep(next(pauses))
        value = predicate()
    return value
