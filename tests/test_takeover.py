"""Takeover by observation (docs/protocol.md, "Observation and takeover"): only after this client saw
the same row unchanged for its lease."""

from __future__ import annotations

import pytest

from fastlease import LockNotAcquired, SyncDistributedLock
from fastlease.exceptions import MalformedLockRow
from fastlease.stores.base import LockRow

ABANDONED = LockRow("dead-owner", "dead-version", 10_000, 1)  # a crashed holder's 10 s lease


def test_takeover_happens_one_full_lease_after_the_first_observation(core, make_client, clock, store):
    store.plant("locks", "k", ABANDONED)
    client = make_client(clock=clock)
    start = clock.monotonic_ns()
    with SyncDistributedLock(client, table="locks", key="k", lease_duration=30, wait_timeout=60) as lease:
        waited_ns = clock.monotonic_ns() - start
        assert store.rows("locks")["k"].owner == lease.owner
    assert waited_ns == 10_000_000_000  # exactly the stored lease, measured from the first sighting
    metrics = lease.metrics
    # One failed put, one waiting mark (the holder might be alive), the takeover, the release: polls only read.
    assert metrics.write_requests == 4
    # Polls every 0.5-1.5 poll intervals (jittered) over the 10 s.
    poll_ms = core.POLL_INTERVAL_MS
    assert 10_000 // (1.5 * poll_ms) <= metrics.read_requests <= 10_000 // (0.5 * poll_ms) + 2


def test_no_takeover_before_a_full_lease_even_for_an_old_row(make_client, clock, store):
    clock.advance(3600)  # the row is "old" by any wall clock: it must not matter
    store.plant("locks", "k", ABANDONED)
    client = make_client(clock=clock)
    with pytest.raises(LockNotAcquired):
        with SyncDistributedLock(client, table="locks", key="k", wait_timeout=9.99):
            pass
    assert store.rows("locks")["k"] == ABANDONED._replace(waiting=True)  # only the waiting hint added


def test_a_client_keeps_observations_across_short_attempts(make_client, clock, store):
    store.plant("locks", "k", ABANDONED)
    client = make_client(clock=clock)
    for _ in range(4):  # four 2 s waits, 0.5 s apart: 10 s of observation accumulates
        with pytest.raises(LockNotAcquired):
            with SyncDistributedLock(client, table="locks", key="k", wait_timeout=2):
                pass
        clock.advance(0.5)
    with SyncDistributedLock(client, table="locks", key="k", wait_timeout=0) as lease:
        assert lease.state == "held"


def test_a_fresh_client_starts_its_own_observation(make_client, clock, store):
    store.plant("locks", "k", ABANDONED)
    first = make_client(clock=clock)
    with pytest.raises(LockNotAcquired):
        with SyncDistributedLock(first, table="locks", key="k", wait_timeout=9):
            pass
    fresh = make_client(clock=clock)
    with pytest.raises(LockNotAcquired):
        with SyncDistributedLock(fresh, table="locks", key="k", wait_timeout=9):
            pass
    assert store.rows("locks")["k"] == ABANDONED._replace(waiting=True)  # only the waiting hint added


def test_a_live_holder_is_never_taken_over(make_client, clock, store):
    holder = make_client(clock=clock)
    contender = make_client(clock=clock)
    with SyncDistributedLock(holder, table="locks", key="k", lease_duration=1) as lease:
        with pytest.raises(LockNotAcquired):  # 20 leases of waiting: renewals keep changing the version
            with SyncDistributedLock(contender, table="locks", key="k", wait_timeout=20):
                pass
        lease.raise_if_lost()
        assert lease.metrics.renewals >= 59


def test_a_changed_lease_ms_restarts_observation(make_client, clock, store):
    store.plant("locks", "k", ABANDONED)
    client = make_client(clock=clock)
    with pytest.raises(LockNotAcquired):
        with SyncDistributedLock(client, table="locks", key="k", wait_timeout=9):
            pass
    store.plant("locks", "k", ABANDONED._replace(lease_ms=20_000))
    with pytest.raises(LockNotAcquired):
        with SyncDistributedLock(client, table="locks", key="k", wait_timeout=19):
            pass


@pytest.mark.parametrize(
    "row",
    [
        LockRow("o", "v", 10_000, 2),
        LockRow("o", "v", 99, 1),
        LockRow("o", "v", 86_400_001, 1),
        LockRow("o", "v", "10000", 1),
        LockRow("o", "v", 10_000.0, 1),
        LockRow("o", "v", True, 1),
        LockRow(None, "v", 10_000, 1),
        LockRow("", "v", 10_000, 1),
        LockRow("o", 5, 10_000, 1),
        LockRow("o", "v", 10_000, "1"),
        LockRow("o", "v", 10_000, True),
        LockRow("o", "v", 10_000, 1, 1),
        LockRow("o", "v", 10_000, 1, None),
        LockRow("o", "v", 10_000, 1, False, 0),
        LockRow("o", "v", 10_000, 1, False, "7"),
        LockRow("o", "v", 10_000, 1, False, True),
    ],
)
def test_malformed_rows_fail_closed_and_are_never_taken_over(make_client, clock, store, row):
    store.plant("locks", "k", row)
    client = make_client(clock=clock)
    guard = SyncDistributedLock(client, table="locks", key="k", wait_timeout=100)
    with pytest.raises(MalformedLockRow) as info:
        guard.__enter__()
    assert isinstance(info.value, ValueError) and info.value.key == "k"
    assert guard.state == "failed"
    clock.advance(1000)
    with pytest.raises(MalformedLockRow):
        SyncDistributedLock(client, table="locks", key="k", wait_timeout=0).__enter__()
    assert store.rows("locks")["k"] == row


def test_observation_cache_is_bounded_lru(core):
    cache = core.ObservationCache(2)
    assert cache.observe(("t", "a"), "o", "v", 100, 0) == 0
    assert cache.observe(("t", "b"), "o", "v", 100, 5) == 0
    assert cache.observe(("t", "a"), "o", "v", 100, 10) == 10  # refreshes a: b is now the oldest
    assert cache.observe(("t", "c"), "o", "v", 100, 20) == 0  # evicts b
    assert len(cache) == 2
    assert cache.observe(("t", "b"), "o", "v", 100, 30) == 0  # b restarted: eviction only delays
    assert cache.observe(("t", "c"), "o", "v2", 100, 40) == 0  # changed version restarts
    assert cache.observe(("t", "c"), "o", "v2", 100, 45) == 5
    with pytest.raises(ValueError):
        core.ObservationCache(0)


def test_client_observation_cache_holds_4096(make_client):
    assert make_client().engine.observations.capacity == 4096


def test_fencing_tokens_increase_with_every_acquisition_and_takeover(make_client, clock, store):
    first, second = make_client(clock=clock), make_client(clock=clock)
    tokens = []
    for client in (first, second, first):
        with SyncDistributedLock(client, table="locks", key="k") as lease:
            tokens.append(lease.fencing_token)
    held = SyncDistributedLock(first, table="locks", key="k", lease_duration=1)
    held.__enter__()
    first.close()  # the holder stops renewing: its row is abandoned
    with SyncDistributedLock(second, table="locks", key="k", lease_duration=1, wait_timeout=10) as lease:
        tokens.append(lease.fencing_token)  # the takeover
    assert tokens == [1, 2, 3, 5]  # 4 went to the abandoned holder
    assert held.fencing_token == 4
    with SyncDistributedLock(second, table="locks", key="other") as lease:
        assert lease.fencing_token == 1  # per key



def test_a_cron_style_run_is_told_how_long_a_takeover_needs_and_a_long_enough_wait_takes_it(
    make_client, clock, store
):
    # A cron job: every run is a fresh client. With wait_timeout=0 it can never take a crashed holder's
    # lease over (it has seen the row for no time at all); the message says what wait would.
    store.plant("locks", "k", ABANDONED)
    for _ in range(3):
        with pytest.raises(LockNotAcquired) as info:
            with SyncDistributedLock(make_client(clock=clock), table="locks", key="k", wait_timeout=0):
                pass
        assert "its row was seen unchanged for 0.0 s of the 10 s a takeover needs" in str(info.value)
        assert "a wait_timeout of at least 10.25 s takes it over in one run, on any host" in str(info.value)
        clock.advance(60)
    start = clock.monotonic_ns()
    with SyncDistributedLock(make_client(clock=clock), table="locks", key="k", wait_timeout=10.25) as lease:
        assert store.rows("locks")["k"].owner == lease.owner
    assert clock.monotonic_ns() - start <= 10_250_000_000


def test_a_wait_as_long_as_the_lease_gets_no_takeover_advice(make_client, clock, store):
    store.plant("locks", "k", ABANDONED)
    holder = make_client(clock=clock)
    with SyncDistributedLock(holder, table="locks", key="live", lease_duration=10):  # a live, renewed holder
        with pytest.raises(LockNotAcquired) as info:
            with SyncDistributedLock(make_client(clock=clock), table="locks", key="live", wait_timeout=12):
                pass
    assert "a takeover needs" not in str(info.value)


def test_a_row_renewed_during_the_wait_gets_no_takeover_advice(make_client, clock, store):
    holder = make_client(clock=clock)
    with SyncDistributedLock(holder, table="locks", key="live", lease_duration=3):  # renewed every 1 s
        with pytest.raises(LockNotAcquired) as info:
            with SyncDistributedLock(make_client(clock=clock), table="locks", key="live", wait_timeout=2.5):
                pass
    assert "a takeover needs" not in str(info.value)  # its holder is alive: the version changed meanwhile
