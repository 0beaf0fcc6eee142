"""Ambiguous writes (docs/protocol.md, "Reconciliation of a write whose outcome is unknown"): a
timed-out or dropped write is reconciled by a consistent read; late successes never revive a guard;
transient errors while waiting are retried inside the budget."""

from __future__ import annotations

import pytest

from fastlease import LockLost, LockNotAcquired, SyncDistributedLock
from fastlease.exceptions import StoreError


def test_lost_acquire_response_is_reconciled_as_held(make_client, clock, faults, store):
    client = make_client(clock=clock)
    faults.add("put_if_absent", "lost_response")
    with SyncDistributedLock(client, table="locks", key="k", wait_timeout=0) as lease:
        assert store.rows("locks")["k"].owner == lease.owner
        assert lease.fencing_token == store.rows("locks")["k"].fence == 1  # the token read back with the row
    metrics = lease.metrics
    assert (metrics.write_requests, metrics.read_requests, metrics.request_failures) == (2, 1, 1)


def test_timed_out_unapplied_acquire_is_reconciled_then_retried(make_client, clock, faults, store):
    client = make_client(clock=clock)
    faults.add("put_if_absent", "timeout")
    with SyncDistributedLock(client, table="locks", key="k", wait_timeout=5) as lease:
        assert store.rows("locks")["k"].owner == lease.owner
    assert faults.calls["put_if_absent"] == 2
    assert lease.metrics.read_requests >= 1


def test_late_commit_is_confirmed_with_validity_from_before_the_write(make_client, clock, faults, store):
    client = make_client(clock=clock)
    faults.add("put_if_absent", "delay", delay_s=100)  # far past the 1 s request timeout (lease/3)
    faults.add("update_version_if", "unavailable", times=-1)  # no renewal may extend validity here
    start = clock.monotonic_ns()
    with pytest.raises(LockLost):
        with SyncDistributedLock(client, table="locks", key="k", lease_duration=3, wait_timeout=5) as lease:
            assert clock.monotonic_ns() - start == 1_000_000_000
            clock.advance(1.69)  # 2.69 s after the stamp taken before the put: inside 2.7 s
            assert lease.is_valid()
            clock.advance(0.02)  # 2.71 s: past 90% of the lease
            lease.raise_if_lost()


def test_a_confirmation_too_late_to_be_valid_does_not_count(make_client, clock, faults, store):
    client = make_client(clock=clock)
    faults.add("put_if_absent", "lost_response")
    # Three reconciling reads time out (0.33 s each, lease/3): the fourth confirms our row, but
    # more than 90% of the lease has passed since the stamp taken before the put.
    faults.add("read", "delay", delay_s=0.5, times=3)
    with SyncDistributedLock(client, table="locks", key="k", lease_duration=1, wait_timeout=5) as lease:
        owner = lease.owner
    metrics = lease.metrics
    # put (lost) + delete of the stale row + put + release
    assert metrics.write_requests == 4
    assert owner and store.rows("locks") == {}


def test_unreadable_outcome_keeps_the_write_pending_and_cleans_up_on_failure(make_client, clock, faults, store):
    client = make_client(clock=clock)
    faults.add("put_if_absent", "lost_response")
    faults.add("read", "unavailable", times=-1)
    guard = SyncDistributedLock(client, table="locks", key="k", lease_duration=10, wait_timeout=1)
    with pytest.raises(LockNotAcquired) as info:
        guard.__enter__()
    assert isinstance(info.value.__cause__, StoreError)
    assert store.rows("locks") == {}  # the possibly-committed row was deleted by its owner id
    assert guard.state == "failed"


def test_transient_errors_while_waiting_are_retried_with_backoff(make_client, clock, faults, store):
    client = make_client(clock=clock)
    faults.add("put_if_absent", "unavailable", times=4)
    start = clock.monotonic_ns()
    with SyncDistributedLock(client, table="locks", key="k", wait_timeout=10) as lease:
        waited_ns = clock.monotonic_ns() - start
    assert lease.metrics.request_failures == 4
    # Back-off 25, 50, 100, 200 ms, each jittered 50-150%: 187.5 ms to 562.5 ms in all.
    assert 187_500_000 <= waited_ns <= 562_500_000


def test_transient_error_with_zero_wait_fails_at_once_with_the_cause(make_client, clock, faults):
    client = make_client(clock=clock)
    faults.add("put_if_absent", "unavailable")
    with pytest.raises(LockNotAcquired) as info:
        with SyncDistributedLock(client, table="locks", key="k", wait_timeout=0):
            pass
    assert isinstance(info.value.__cause__, StoreError)


def test_lost_renewal_response_is_confirmed_by_the_next_step(make_client, clock, faults, store):
    client = make_client(clock=clock)
    faults.add("update_version_if", "lost_response")
    with SyncDistributedLock(client, table="locks", key="k", lease_duration=3) as lease:
        clock.advance(1.0)  # renewal applied, response lost
        clock.advance(0.25)  # retry after lease/12: reads, finds our new version, confirms
        lease.raise_if_lost()
        assert lease.metrics.renewals == 1
        clock.advance(5.0)
        lease.raise_if_lost()
    assert faults.calls["update_version_if"] >= 3


def test_unapplied_renewal_timeout_is_retried_from_the_old_version(make_client, clock, faults):
    client = make_client(clock=clock)
    faults.add("update_version_if", "timeout")
    with SyncDistributedLock(client, table="locks", key="k", lease_duration=3) as lease:
        clock.advance(1.3)
        lease.raise_if_lost()
        assert lease.metrics.renewals == 1
    assert lease.metrics.lost is False


def test_lost_release_response_is_reconciled(make_client, clock, faults, store):
    client = make_client(clock=clock)
    faults.add("delete_if_owner", "lost_response")
    with SyncDistributedLock(client, table="locks", key="k") as lease:
        pass
    assert store.rows("locks") == {}
    assert lease.state == "released"
    assert lease.metrics.read_requests == 1


def test_unapplied_release_timeout_is_reconciled_then_retried(make_client, clock, faults, store):
    client = make_client(clock=clock)
    faults.add("delete_if_owner", "timeout")
    with SyncDistributedLock(client, table="locks", key="k") as lease:
        pass
    assert store.rows("locks") == {}
    assert faults.calls["delete_if_owner"] == 2
    assert lease.metrics.cleanup_failures == 0
