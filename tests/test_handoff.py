"""Handoff (§5.2): same-process waiters are served first-come first-served and woken at once on
release; a client that has had to wait for a key gives others the next turn after releasing it."""

from __future__ import annotations

import threading
import time

from fastlease import MemoryClient, SyncDistributedLock


def test_threads_sharing_a_client_take_fair_turns(core):
    client = MemoryClient(_core=core)
    counts = [0] * 4
    reads = [0] * 4
    start = threading.Barrier(4)
    deadline = [0.0]

    def worker(index: int) -> None:
        start.wait(10)
        for _ in range(100_000):  # bounded; the deadline ends it first
            if time.monotonic() >= deadline[0]:
                return
            guard = SyncDistributedLock(client, table="locks", key="hot", wait_timeout=10)
            with guard:
                threading.Event().wait(0.002)  # the critical section's work
            counts[index] += 1
            reads[index] += guard.metrics.read_requests

    deadline[0] = time.monotonic() + 3
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    finally:
        client.close()
    total = sum(counts)
    assert total > 100
    assert min(counts) >= 0.15 * total, counts  # nobody starves
    # Only the oldest waiter is woken on a release, so a handoff costs about one read, not one per waiter.
    assert sum(reads) <= 2 * total, (sum(reads), total)


def test_turn_taking_needs_recent_contention(core):
    signals = core.ReleaseSignals()
    key = ("locks", "k")
    ms = 1_000_000
    signals.released(key, False, 0)
    assert not signals.should_yield(key, 1 * ms)  # never found it held: never yields
    signals.released(key, True, 1_000 * ms)  # released after having waited for it
    assert signals.should_yield(key, 1_000 * ms + core.YIELD_WINDOW_MS * ms - 1)
    assert not signals.should_yield(key, 1_000 * ms + core.YIELD_WINDOW_MS * ms)  # came back too late to matter
    signals.released(key, False, 5_000 * ms)  # an uncontended turn still remembers the contention
    assert signals.should_yield(key, 5_001 * ms)
    signals.released(key, False, (1_000 + core.CONTENTION_MEMORY_MS) * ms)  # contention now forgotten
    assert not signals.should_yield(key, (1_001 + core.CONTENTION_MEMORY_MS) * ms)


def test_an_acquisition_that_should_yield_waits_a_poll_first(make_client, clock):
    client = make_client(clock=clock)
    client._release_signals.released(("locks", "k"), True, clock.monotonic_ns())
    before = clock.monotonic_ns()
    with SyncDistributedLock(client, table="locks", key="k", wait_timeout=5) as lease:
        waited_ns = clock.monotonic_ns() - before
    poll_ns = client._core.POLL_INTERVAL_MS * 1_000_000
    assert 1.5 * poll_ns <= waited_ns <= 1.75 * poll_ns  # longer than any waiter's poll interval
    assert lease.metrics.read_requests == 0  # then the key was free at once
    before = clock.monotonic_ns()
    with SyncDistributedLock(client, table="locks", key="k", wait_timeout=0):
        assert clock.monotonic_ns() == before  # wait_timeout=0 never waits, not even to yield
