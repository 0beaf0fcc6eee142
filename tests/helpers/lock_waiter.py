"""A thread that waits for a lease and records what happened: for tests of release wake-ups, where a
waiter on one client watches another client release."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional

from fastlease import SyncDistributedLock
from helpers.waiting import wait_until

JOIN_SLACK_S = 20.0  # how much longer than its wait a waiter may take to finish


class Waiter:
    """Acquires ``key`` in ``table`` on ``client`` (waiting up to ``wait_s``, for a lease of ``lease_s``) on
    a thread of its own, and releases it at once; ``token`` and ``acquired_at`` (monotonic) say when, and
    ``writes`` how many acquisition writes it took (none where a release handed the lease over)."""

    def __init__(self, client: Any, key: str, wait_s: float = 20.0, lease_s: float = 5.0,
                 table: str = "locks") -> None:
        self.client, self.key, self.wait_s, self.lease_s, self.table = client, key, wait_s, lease_s, table
        self.token: Any = None
        self.acquired_at: Optional[float] = None
        self.writes: Optional[int] = None
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            with SyncDistributedLock(self.client, table=self.table, key=self.key, lease_duration=self.lease_s,
                                     wait_timeout=self.wait_s) as lease:
                self.acquired_at = time.monotonic()
                self.token = lease.fencing_token
                self.writes = lease.metrics.write_requests
        except BaseException as error:  # noqa: BLE001 - reported by join()
            self.error = error

    def join(self) -> None:
        """Wait for the thread (bounded); raise what the acquisition raised, if anything."""
        self.thread.join(JOIN_SLACK_S + self.wait_s)
        assert not self.thread.is_alive(), "waiter still waiting"
        if self.error is not None:
            raise self.error


def taken_on_release(held: SyncDistributedLock, client: Any, line: Callable[[], list[Any]], key: str = "k",
                     bound_s: float = 10.0) -> SyncDistributedLock:
    """A guard of ``client`` on ``key`` (of "locks") waits on a thread of its own until it has a place in the
    line (``line()``: the line's places), then ``held`` is released: the new guard, holding, is returned."""
    taker = SyncDistributedLock(client, table="locks", key=key, lease_duration=30, wait_timeout=bound_s)
    thread = threading.Thread(target=taker.__enter__, daemon=True)
    thread.start()
    wait_until(lambda: line() != [], bound_s, "the waiter's place in line")
    held.__exit__(None, None, None)
    thread.join(bound_s)
    assert not thread.is_alive() and taker.is_valid(), "the waiter never got the lease"
    return taker


def hand_over_between(first: Any, second: Any, line: Callable[[], list[Any]], key: str = "k",
                      bound_s: float = 10.0) -> SyncDistributedLock:
    """``first`` holds ``key`` (of "locks") while ``second`` waits for it in line, then releases it, which
    hands the lease over to ``second``: its guard, held, is returned. Fails if the release did not hand it
    over (the guard then wrote)."""
    held = SyncDistributedLock(first, table="locks", key=key, lease_duration=30)
    held.__enter__()
    taker = taken_on_release(held, second, line, key, bound_s)
    assert taker.metrics.write_requests == 1, "the lease was not handed over: its waiter wrote"  # (its first put)
    return taker


def come_back_after_a_handover(first: Any, second: Any, line: Callable[[], list[Any]], key: str = "k",
                               bound_s: float = 10.0) -> None:
    """``first`` hands ``key`` over to ``second`` (``hand_over_between``) and comes back for it at once: its
    acquisition's first step is a read in line, not a put that would fail (the key is ``second``'s), and it
    is handed the key back on ``second``'s release without a write. Once only: after a release that hands
    nothing over, a put comes first again."""
    back = taken_on_release(hand_over_between(first, second, line, key, bound_s), first, line, key, bound_s)
    assert back.metrics.write_requests == 0  # its reads in line, then the lease handed back (before: a put first)
    back.__exit__(None, None, None)  # nobody waits: freed, handed to nobody
    with SyncDistributedLock(first, table="locks", key=key, lease_duration=30) as again:
        assert (again.metrics.read_requests, again.metrics.write_requests) == (0, 1)
