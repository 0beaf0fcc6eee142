"""The lease-lost signal and max_hold (docs/protocol.md, "Renewal"): causes, on_lost once, the lost event."""

from __future__ import annotations

import logging

import pytest

from fastlease import LockLost, SyncDistributedLock, distributed_lock


def test_on_lost_is_called_once_with_the_cause_and_the_event_is_set(make_client, clock, faults, caplog):
    client = make_client(clock=clock)
    calls = []
    faults.add("update_version_if", "unavailable", times=-1)
    guard = SyncDistributedLock(client, table="locks", key="k", lease_duration=3, on_lost=calls.append)
    with caplog.at_level(logging.WARNING, logger="fastlease.engine"):
        with pytest.raises(LockLost):
            with guard as lease:
                event = lease.lost
                assert not event.is_set()
                clock.advance(2.8)  # past 90% of 3 s with every renewal failing
                assert event.is_set()
                lease.raise_if_lost()
    assert len(calls) == 1
    assert isinstance(calls[0], LockLost) and calls[0].cause == "unreachable" and calls[0].key == "k"
    assert lease.lost.is_set()  # still set, same event
    assert [r.message for r in caplog.records].count("lease lost: table=locks key='k' cause=unreachable") == 1


def test_a_failing_on_lost_callback_is_logged_not_raised(make_client, clock, store, caplog):
    client = make_client(clock=clock)

    def broken(error: LockLost) -> None:
        raise RuntimeError("callback bug")

    with caplog.at_level(logging.WARNING, logger="fastlease.engine"):
        with pytest.raises(LockLost) as info:
            with SyncDistributedLock(client, table="locks", key="k", lease_duration=3, on_lost=broken) as lease:
                store.plant("locks", "k", store.rows("locks")["k"]._replace(owner="thief"))
                clock.advance(1.0)  # the renewal finds the row stolen; the callback raises
                assert lease.state == "lost"
                lease.raise_if_lost()
    assert info.value.cause == "stolen"
    assert any("on_lost callback for 'k' raised" in r.message for r in caplog.records)


def test_lost_event_created_after_the_loss_is_already_set(make_client, clock, store):
    client = make_client(clock=clock)
    with pytest.raises(LockLost):
        with SyncDistributedLock(client, table="locks", key="k", lease_duration=3) as lease:
            store.remove("locks", "k")
            clock.advance(1.0)
            assert lease.lost.is_set()


def test_release_finding_the_row_taken_announces_stolen_once(make_client, store):
    client = make_client()
    calls = []
    with pytest.raises(LockLost):
        with SyncDistributedLock(client, table="locks", key="k", on_lost=calls.append) as lease:
            store.remove("locks", "k")
    assert [c.cause for c in calls] == ["stolen"]
    assert lease.lost.is_set()


def test_max_hold_stops_renewing_and_the_lease_lapses_as_cancelled(make_client, clock, store):
    client = make_client(clock=clock)
    calls = []
    guard = SyncDistributedLock(client, table="locks", key="k", lease_duration=3, max_hold=5, on_lost=calls.append)
    with pytest.raises(LockLost, match=r"lapsed before the block ended \(cancelled\)"), guard as lease:
        clock.advance(4.5)  # renewals at 1, 2, 3 and 4 s
        assert lease.metrics.renewals == 4
        clock.advance(2.1)  # 6.6 s: the renewal due at 5 s was skipped; validity from 4 s ends at 6.7 s
        assert lease.is_valid() and lease.metrics.renewals == 4
        clock.advance(0.2)
        with pytest.raises(LockLost) as info:
            lease.raise_if_lost()
        assert info.value.cause == "cancelled"
    assert [c.cause for c in calls] == ["cancelled"]
    assert store.rows("locks") == {}  # the row was still ours: deleted all the same


@pytest.mark.parametrize("value", [0.05, -1, float("nan"), float("inf"), 86_401])
def test_bad_max_hold_raises_value_error(make_client, value):
    with pytest.raises(ValueError, match="max_hold must be finite"):
        SyncDistributedLock(make_client(), table="locks", key="k", max_hold=value)
    with pytest.raises(ValueError, match="max_hold must be finite"):
        distributed_lock(make_client(), table="locks", key="k", max_hold=value)


def test_on_lost_must_be_callable(make_client):
    with pytest.raises(TypeError, match="on_lost must be a callable"):
        SyncDistributedLock(make_client(), table="locks", key="k", on_lost="not callable")


def test_decorator_passes_max_hold_and_on_lost(make_client, clock, faults):
    client = make_client(clock=clock)
    calls = []
    faults.add("update_version_if", "unavailable", times=-1)

    @distributed_lock(client, table="locks", key="k", lease_duration=3, max_hold=60, on_lost=calls.append)
    def job() -> str:
        clock.advance(2.8)
        return "done"

    with pytest.raises(LockLost) as info:  # the row was still ours, but validity lapsed during the call
        job()
    assert info.value.cause == "unreachable"
    assert [c.cause for c in calls] == ["unreachable"]
