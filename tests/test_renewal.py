"""Renewal (docs/protocol.md, "Renewal" and "Validity"): every lease/3 from one thread per client;
validity on both clocks; loss detection."""

from __future__ import annotations

import threading
import time

import pytest

from fastlease import LockLost, LockNotAcquired, SyncDistributedLock
from helpers.waiting import wait_until


def test_renewal_keeps_a_lease_alive_through_ten_leases(make_client, clock, store):
    holder = make_client(clock=clock)
    contender = make_client(clock=clock)
    with SyncDistributedLock(holder, table="locks", key="k", lease_duration=3) as lease:
        for _ in range(100):  # 30 s of body in 0.3 s steps: 10 leases
            clock.advance(0.3)
            lease.raise_if_lost()
            with pytest.raises(LockNotAcquired):
                with SyncDistributedLock(contender, table="locks", key="k", wait_timeout=0):
                    pass
    assert lease.metrics.renewals == 30  # every lease/3
    assert lease.metrics.write_requests == 32
    assert lease.state == "released"


def test_renewal_on_the_real_thread_through_ten_leases(make_client):
    holder, contender = make_client(), make_client()  # system clock: the renewal thread really runs
    body_done = threading.Event()
    try:
        with SyncDistributedLock(holder, table="locks", key="k", lease_duration=0.2) as lease:
            deadline = time.monotonic() + 2.0  # the body runs 10 leases
            while time.monotonic() < deadline:
                lease.raise_if_lost()
                with pytest.raises(LockNotAcquired):
                    with SyncDistributedLock(contender, table="locks", key="k", wait_timeout=0):
                        pass
                body_done.wait(0.02)  # the body's own pacing, not synchronisation
        assert lease.metrics.renewals >= 10  # ~30 expected; loaded CI machines may lag, never stop
        assert lease.metrics.lost is False
    finally:
        holder.close()
        contender.close()


def test_one_renewal_thread_per_client_whatever_the_lease_count(make_client):
    client = make_client()
    before = {t for t in threading.enumerate() if t.name == "fastlease-renewal"}
    guards = [SyncDistributedLock(client, table="locks", key=f"k{i}") for i in range(50)]
    try:
        for guard in guards:
            guard.__enter__()
        after = {t for t in threading.enumerate() if t.name == "fastlease-renewal"}
        assert len(after - before) == 1
        assert len(client.engine.scheduler) == 50
    finally:
        for guard in guards:
            guard.__exit__(None, None, None)
        client.close()
    assert len(client.engine.scheduler) == 0


def test_short_holds_do_not_grow_the_renewal_heap(make_client):
    client = make_client()
    for _ in range(5000):
        with SyncDistributedLock(client, table="locks", key="k"):
            pass
    assert client.engine.scheduler.heap_size() <= 130  # compacted whenever stale entries pass 64 and half


def test_unreachable_store_loses_the_lease_at_90_percent(make_client, clock, faults):
    client = make_client(clock=clock)
    faults.add("update_version_if", "unavailable", times=-1)
    with pytest.raises(LockLost) as info:
        with SyncDistributedLock(client, table="locks", key="k", lease_duration=12) as lease:
            clock.advance(10.79)
            lease.raise_if_lost()  # still inside 90% of 12 s
            clock.advance(0.02)
            lease.raise_if_lost()
    assert info.value.cause == "unreachable"
    assert lease.lost_cause == "unreachable"
    metrics = lease.metrics
    assert metrics.lost and metrics.renewals == 0
    # First try at 4 s, then every min(lease/12, 1 s) = 1 s until validity ends at 10.8 s.
    assert metrics.request_failures == faults.calls["update_version_if"] == 7


def test_renewal_blocked_by_a_hung_request_is_detected_as_loss(make_client, real_faults):
    injector = real_faults
    injector.add("update_version_if", "block")
    client = make_client()
    try:
        with pytest.raises(LockLost) as info:
            with SyncDistributedLock(client, table="locks", key="k", lease_duration=0.3) as lease:
                assert injector.blocked.wait(5), "the renewal request never started"
                # Validity ends 0.9 * 0.3 s after the acquisition.
                wait_until(lambda: not lease.is_valid(), 5, "the lease's validity to end", interval=0.01)
                lease.raise_if_lost()
        assert info.value.cause in ("expired", "unreachable")
    finally:
        injector.unblock()
        client.close()


def test_a_renewal_confirmed_after_validity_ended_neither_counts_nor_extends(make_client, real_faults, store):
    # docs/protocol.md, "Validity": such a confirmation does not count. Before, it extended validity
    # from its stamp (the lease carried on) and metrics.renewals became 1.
    real_faults.add("update_version_if", "block")
    client = make_client()
    with pytest.raises(LockLost, match=r"lapsed before the block ended \(expired\)"):
        with SyncDistributedLock(client, table="locks", key="k", lease_duration=0.3) as lease:
            assert real_faults.blocked.wait(5), "the first renewal never started"
            # Validity ends 0.27 s after the acquisition.
            wait_until(lambda: not lease.is_valid(), 5, "the lease's validity to end", interval=0.01)
            real_faults.unblock()  # the renewal write lands now, after validity ended
            assert lease.lost.wait(5), "the late confirmation was taken as a renewal"
            assert lease.lost_cause == "expired"
    assert lease.metrics.renewals == 0 and lease.metrics.write_requests == 3
    assert store.rows("locks") == {}


def test_a_renewal_report_stamped_outside_validity_is_not_counted(make_client, clock):
    # The renewal process's reports go through Lease.apply_renewal: one whose write was sent outside
    # the validity it would extend neither extends it nor counts.
    client = make_client(clock=clock)
    with SyncDistributedLock(client, table="locks", key="k", lease_duration=3) as lease:
        engine_lease = lease._lease
        version = lease._lease.version
        stale_mono, stale_wall = clock.monotonic_ns() - 10**10, clock.time_ns() - 10**10
        engine_lease.apply_renewal("late-version", stale_mono, stale_wall, (1, 0, 0, 0, 1))
        assert lease.metrics.renewals == 0 and lease.metrics.write_requests == 2
        assert engine_lease.version == version
        engine_lease.apply_renewal("in-time", clock.monotonic_ns(), clock.time_ns(), (2, 0, 0, 0, 2))
        assert lease.metrics.renewals == 2  # a report within validity counts what it reports


def test_renewal_conditional_failure_means_stolen(make_client, clock, store):
    client = make_client(clock=clock)
    with pytest.raises(LockLost) as info:
        with SyncDistributedLock(client, table="locks", key="k", lease_duration=3) as lease:
            store.plant("locks", "k", store.rows("locks")["k"]._replace(owner="thief"))
            clock.advance(1.0)  # the renewal at lease/3 finds another owner
            assert lease.state == "lost"
            lease.raise_if_lost()
    assert info.value.cause == "stolen"


@pytest.mark.parametrize("jump", [-0.001, -30.0, 27.0])
def test_wall_clock_jumps_invalidate_and_never_extend(make_client, clock, jump):
    client = make_client(clock=clock)
    with pytest.raises(LockLost) as at_exit:
        with SyncDistributedLock(client, table="locks", key="k", lease_duration=30) as lease:
            clock.jump_wall(jump)
            assert not lease.is_valid()
            with pytest.raises(LockLost) as info:
                lease.raise_if_lost()
    assert info.value.cause == at_exit.value.cause == "expired"


def test_a_small_forward_wall_jump_keeps_validity_until_the_earlier_clock(make_client, clock):
    client = make_client(clock=clock)
    with pytest.raises(LockLost, match="lapsed"):
        with SyncDistributedLock(client, table="locks", key="k", lease_duration=30) as lease:
            clock.jump_wall(20)
            assert lease.is_valid()
            clock.advance(6.9)  # monotonic 6.9 s, wall 26.9 s: still inside 27 s on both
            assert lease.is_valid()
            clock.advance(0.2)  # wall passes 27 s first; the first renewal is only due at 10 s
            assert not lease.is_valid()


@pytest.mark.slow  # a 6 s hold
def test_one_client_renews_a_thousand_leases_without_losing_any(core, make_client, capsys):
    client = make_client()
    before = set(threading.enumerate())
    guards = [SyncDistributedLock(client, table="locks", key=f"k{i}", lease_duration=1.5) for i in range(1000)]
    try:
        for guard in guards:
            guard.__enter__()
        done = threading.Event()
        done.wait(6)  # the hold itself: four leases long, twelve renewal rounds (one every 0.5 s)
        lost = [guard.key for guard in guards if not guard.is_valid()]
        started, max_late_ns, total_late_ns = client.engine.scheduler.lateness()
        new_threads = set(threading.enumerate()) - before
    finally:
        for guard in guards:
            guard.__exit__(None, None, None)
        client.close()
    with capsys.disabled():
        print(f"\n[{core.IMPLEMENTATION}] 1000 leases x 6 s: {started} renewals, lateness max "
              f"{max_late_ns / 1e6:.1f} ms, mean {total_late_ns / max(started, 1) / 1e6:.2f} ms, "
              f"{len(new_threads)} threads")
    assert lost == []
    assert started >= 1000 * 11  # two renewals per lease per second
    assert sum(guard.metrics.lost for guard in guards) == 0
    assert len(new_threads) <= 1 + core.RENEWAL_WORKERS
