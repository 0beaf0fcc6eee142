"""``run``: ``asyncio.run`` for tests, failing on anything the event loop would only have logged."""

from __future__ import annotations

import asyncio
import gc
from typing import Any, Coroutine, TypeVar

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """asyncio.run with an exception handler that records what the loop would have logged ("Task
    exception was never retrieved", a callback that raised): the test fails if there was any."""
    reported: list[dict[str, Any]] = []

    async def main() -> T:
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: reported.append(context))
        return await coro

    result = asyncio.run(main())
    gc.collect()
    assert reported == [], reported
    return result
