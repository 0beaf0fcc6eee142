"""A thread that waits for a lease and records what happened: for tests of release wake-ups, where a
waiter on one client watches another client release."""

from __future__ import annotations

import threading
import time
from typing import Any, Optional

from fastlease import SyncDistributedLock

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
