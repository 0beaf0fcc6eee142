"""``FaultInjector``: faults for the requests of a :class:`~fastlease.stores.memory.MemoryStore`."""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional

from ..exceptions import StoreError

__all__ = ["FAULTS", "OPERATIONS", "FaultInjector"]

#: Injectable faults. ``delay``: the request takes ``delay_s``; past its timeout it still commits but
#: reports a timeout (a late commit). ``lost_response``: applied, then reported as a timeout.
#: ``timeout``: not applied, reported as a timeout (could have committed, did not).
#: ``unavailable``: not applied, reported as a definite failure (throttled, refused).
#: ``block``: waits until the injector's ``unblock()`` (bounded by 60 s), then applies.
FAULTS = ("delay", "lost_response", "timeout", "unavailable", "block")
#: The MemoryStore operations a fault can be added to.
OPERATIONS = ("put_if_absent", "replace_if", "update_version_if", "mark_waiting", "delete_if_owner", "read")


class FaultInjector:
    """Faults for a :class:`~fastlease.stores.memory.MemoryStore`: ``store.faults = FaultInjector()``.

    ``add("update_version_if", "unavailable", times=3)`` fails the next three renewals. Rules of one
    operation are consumed in the order they were added; ``times=-1`` repeats forever.
    ``calls[operation]`` counts requests seen, faulted or not.
    """

    def __init__(self, clock: Optional[Any] = None) -> None:
        self._clock = clock
        self._rules: dict[str, list[list[Any]]] = {operation: [] for operation in OPERATIONS}
        self._lock = threading.Lock()
        self._unblocked = threading.Event()
        self.calls: dict[str, int] = {operation: 0 for operation in OPERATIONS}
        #: Set when a request starts waiting on a ``block`` fault; lets a test wait for that moment.
        self.blocked = threading.Event()

    def add(self, operation: str, fault: str, *, times: int = 1, delay_s: float = 0.0) -> None:
        """Inject ``fault`` (one of :data:`FAULTS`) into the next ``times`` requests of ``operation`` (one of
        ``put_if_absent``, ``replace_if``, ``update_version_if``, ``mark_waiting``, ``delete_if_owner``,
        ``read``); ``times=-1`` forever. ``delay_s`` is the ``delay`` fault's length. Raises ValueError for
        an unknown operation or fault, or a bad ``times``."""
        if operation not in OPERATIONS:
            raise ValueError(f"unknown operation {operation!r}; expected one of {OPERATIONS}")
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; expected one of {FAULTS}")
        if type(times) is not int or times == 0 or times < -1:
            raise ValueError(f"times must be a positive int or -1, got {times!r}")
        with self._lock:
            self._rules[operation].append([fault, times, delay_s])

    def clear(self) -> None:
        """Remove every fault not yet consumed (the request counts in ``calls`` stay)."""
        with self._lock:
            for rules in self._rules.values():
                rules.clear()

    def unblock(self) -> None:
        """Let every request held by a ``block`` fault proceed, now and later."""
        self._unblocked.set()

    def _next_fault(self, operation: str) -> Optional[tuple[str, float]]:
        with self._lock:
            self.calls[operation] += 1
            rules = self._rules[operation]
            if not rules:
                return None
            rule = rules[0]
            if rule[1] > 0:
                rule[1] -= 1
                if rule[1] == 0:
                    rules.pop(0)
            return rule[0], rule[2]

    def _pass_time(self, seconds: float) -> None:
        if self._clock is not None and hasattr(self._clock, "advance"):
            self._clock.advance(seconds)
        else:
            threading.Event().wait(seconds)  # a slow request, not synchronisation

    def run(self, operation: str, apply: Callable[..., Any], args: tuple[Any, ...], timeout_s: float) -> Any:
        """Called by MemoryStore for each request while installed."""
        chosen = self._next_fault(operation)
        if chosen is None:
            return apply(*args)
        fault, delay_s = chosen
        if fault == "unavailable":
            raise StoreError(f"injected: {operation} unavailable", maybe_committed=False)
        if fault == "timeout":
            raise StoreError(f"injected: {operation} timed out, not applied", maybe_committed=True)
        if fault == "lost_response":
            apply(*args)
            raise StoreError(f"injected: {operation} applied, response lost", maybe_committed=True)
        if fault == "block":
            self.blocked.set()
            self._unblocked.wait(60)
            return apply(*args)
        # delay
        if delay_s > timeout_s:
            self._pass_time(timeout_s)
            apply(*args)  # the late commit: it lands after the client stopped waiting
            raise StoreError(f"injected: {operation} timed out after {timeout_s:g}s", maybe_committed=True)
        self._pass_time(delay_s)
        return apply(*args)
