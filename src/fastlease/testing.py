"""Test helpers: a deterministic :class:`FakeClock`, a :class:`FaultInjector` for MemoryStore, and
pytest fixtures for code that uses fastlease.

``FakeClock`` replaces both clocks of a client (``MemoryClient(clock=FakeClock())``). Waiting on it
moves time instead of sleeping, and moving time runs every renewal that falls due on the way, in
order, in the calling thread, so tests of takeover and renewal are exact and instant.

The fixtures load with ``pytest_plugins = ["fastlease.testing"]`` in a ``conftest.py``:

- ``fastlease_clock``: a :class:`FakeClock`;
- ``fastlease_memory_client``: a ``MemoryClient`` on that clock (closed after the test);
- ``fastlease_sqlite_client``: a ``SQLiteClient`` on a file in the test's ``tmp_path``;
- ``fastlease_dynamodb_table``: the lock table name the DynamoDB fixture creates (override it to choose);
- ``fastlease_dynamodb_client``: a ``DynamoDBClient`` inside moto's in-process ``mock_aws`` (fake
  credentials, ``us-east-1``), its lock table created (needs ``boto3`` and ``moto``);
- ``fastlease_redis_url``: one ``redis-server`` per session on a free 127.0.0.1 port, no persistence,
  stopped by its PID. Where ``redis-server`` is not installed the tests that use it skip, except when
  the environment has ``CI=true``: a CI run fails instead, so it can never pass by skipping them.

Importing this module imports pytest only when pytest is installed; the other helpers need nothing.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, Iterator, Optional

from .exceptions import StoreError
from .stores.base import NO_USAGE  # re-exported for tests that call store operations directly

__all__ = [
    "FakeClock",
    "FaultInjector",
    "FAULTS",
    "NO_USAGE",
    "fastlease_clock",
    "fastlease_dynamodb_client",
    "fastlease_dynamodb_table",
    "fastlease_memory_client",
    "fastlease_redis_url",
    "fastlease_sqlite_client",
]

#: Injectable faults. ``delay``: the request takes ``delay_s``; past its timeout it still commits but
#: reports a timeout (a late commit). ``lost_response``: applied, then reported as a timeout.
#: ``timeout``: not applied, reported as a timeout (could have committed, did not).
#: ``unavailable``: not applied, reported as a definite failure (throttled, refused).
#: ``block``: waits until the injector's ``unblock()`` (bounded by 60 s), then applies.
FAULTS = ("delay", "lost_response", "timeout", "unavailable", "block")
OPERATIONS = ("put_if_absent", "replace_if", "update_version_if", "mark_waiting", "delete_if_owner", "read")


class FakeClock:
    """Monotonic and wall clocks that move only when told to."""

    def __init__(self, *, monotonic_ns: int = 10**12, wall_ns: int = 1_767_225_600 * 10**9) -> None:
        self._monotonic_ns = monotonic_ns
        self._wall_ns = wall_ns
        self._lock = threading.RLock()
        self._schedulers: list[Any] = []

    def monotonic_ns(self) -> int:
        """The monotonic clock, in ns: it moves only by :meth:`advance`."""
        return self._monotonic_ns

    def time_ns(self) -> int:
        """The wall clock, in ns since the epoch: it moves with :meth:`advance` and by :meth:`jump_wall`."""
        return self._wall_ns

    def attach_scheduler(self, scheduler: Any) -> bool:
        """Called by a client's renewal scheduler: this clock runs its renewals as time moves."""
        with self._lock:
            self._schedulers.append(scheduler)
        return True

    def advance(self, seconds: float) -> None:
        """Move both clocks forward, stopping at each due renewal to run it (an ideal renewal thread)."""
        if not seconds >= 0:
            raise ValueError(f"FakeClock.advance takes seconds >= 0, got {seconds!r}")
        with self._lock:
            target_ns = self._monotonic_ns + int(seconds * 1e9)
            while True:
                due = [d for d in (s.next_due_ns() for s in self._schedulers) if d and d <= target_ns]
                step_to = min(due) if due else target_ns
                if step_to > self._monotonic_ns:
                    self._wall_ns += step_to - self._monotonic_ns
                    self._monotonic_ns = step_to
                if not due:
                    return
                for scheduler in self._schedulers:
                    scheduler.run_due()

    def jump_wall(self, seconds: float) -> None:
        """Move only the wall clock (negative: backwards), as NTP or an operator would."""
        with self._lock:
            self._wall_ns += int(seconds * 1e9)

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        """Waiting moves time by ``timeout_s`` unless the event is already set."""
        if not event.is_set():
            self.advance(timeout_s)
        return event.is_set()


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


# ---- pytest fixtures (``pytest_plugins = ["fastlease.testing"]``) ----------------------------------
try:
    import pytest
except ImportError:  # the helpers above work without pytest; the fixtures need it
    pytest = None  # type: ignore[assignment]  # a module or None: the fixtures below exist only with pytest


def _running_in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


if pytest is not None:

    @pytest.fixture
    def fastlease_clock() -> FakeClock:
        """A :class:`FakeClock`: time moves only when the test (or a wait) moves it."""
        return FakeClock()

    @pytest.fixture
    def fastlease_memory_client(fastlease_clock: FakeClock) -> Iterator[Any]:
        """A ``MemoryClient`` on ``fastlease_clock``: renewals and takeovers happen as the test advances it."""
        from .memory import MemoryClient

        client = MemoryClient(clock=fastlease_clock)
        try:
            yield client
        finally:
            client.close()

    @pytest.fixture
    def fastlease_sqlite_client(tmp_path: Any) -> Iterator[Any]:
        """A ``SQLiteClient`` on ``tmp_path / "fastlease.sqlite3"`` (real clocks; other processes may open it)."""
        from .sqlite import SQLiteClient

        client = SQLiteClient(tmp_path / "fastlease.sqlite3")
        try:
            yield client
        finally:
            client.close()

    @pytest.fixture
    def fastlease_dynamodb_table() -> str:
        """The lock table ``fastlease_dynamodb_client`` creates; override this fixture to choose another name."""
        return "locks"

    @pytest.fixture
    def fastlease_dynamodb_client(fastlease_dynamodb_table: str) -> Iterator[Any]:
        """A ``DynamoDBClient`` inside moto's in-process ``mock_aws`` with ``fastlease_dynamodb_table`` created.

        Every boto3 client the test makes while it runs also talks to the same mock. In-process moto does
        not make conditional writes atomic against concurrent threads: tests of races between processes
        need a moto server (``fastlease.testing_moto.MotoServer`` serialises its requests)."""
        import boto3
        from moto import mock_aws

        from .dynamodb import DynamoDBClient

        with mock_aws():
            session = boto3.session.Session(
                aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
            )
            client = DynamoDBClient(session=session)
            client.create_lock_table(fastlease_dynamodb_table)
            try:
                yield client
            finally:
                client.close()

    @pytest.fixture(scope="session")
    def fastlease_redis_url() -> Iterator[str]:
        """``redis://127.0.0.1:<port>/0`` of a ``redis-server`` started for the session and stopped by its PID.

        Skips where ``redis-server`` cannot start, except under ``CI=true``, where it fails."""
        from .testing_redis import RedisServer, RedisServerUnavailable

        server = RedisServer()
        try:
            url = server.start()
        except RedisServerUnavailable as error:
            if _running_in_ci():
                pytest.fail(f"CI=true: the Redis tests must run, but {error}")
            pytest.skip(str(error))
        try:
            yield url
        finally:
            server.stop()
