"""The guard's contract (docs/protocol.md, "The state machine" and "Limits"): arguments, single use,
metrics, states, errors."""

from __future__ import annotations

import math

import pytest

from fastlease import LockLost, LockNotAcquired, SyncDistributedLock
from fastlease.exceptions import FastleaseError, LockReleaseError
from fastlease.stores.base import NOT_DELETED
from fastlease.stores.memory import MemoryStore
from fastlease.testing import NO_USAGE

BAD_DURATIONS = [math.nan, math.inf, -math.inf, -1, 86_400.001, 10**9]


@pytest.mark.parametrize("value", BAD_DURATIONS + [0, 0.0999, 0.05])
def test_bad_lease_duration_raises_value_error_with_the_value(make_client, value):
    client = make_client()
    with pytest.raises(ValueError, match="lease_duration must be finite and between 0.1 and 86400") as info:
        SyncDistributedLock(client, table="locks", key="k", lease_duration=value)
    assert repr(value) in str(info.value)


@pytest.mark.parametrize("value", BAD_DURATIONS + [-0.001])
def test_bad_wait_timeout_raises_value_error_with_the_value(make_client, value):
    client = make_client()
    with pytest.raises(ValueError, match="wait_timeout must be finite and between 0 and 86400") as info:
        SyncDistributedLock(client, table="locks", key="k", wait_timeout=value)
    assert repr(value) in str(info.value)


@pytest.mark.parametrize("value", [True, False, "30", None, b"1", [30]])
def test_non_numeric_durations_raise_type_error(make_client, value):
    client = make_client()
    with pytest.raises(TypeError, match="lease_duration must be a number of seconds"):
        SyncDistributedLock(client, table="locks", key="k", lease_duration=value)
    with pytest.raises(TypeError, match="wait_timeout must be a number of seconds"):
        SyncDistributedLock(client, table="locks", key="k", wait_timeout=value)


@pytest.mark.parametrize(("value", "expected"), [(0.1, 0.1), (86_400, 86_400.0), (30, 30.0), (1.2345, 1.234)])
def test_duration_limits_are_inclusive_and_kept_in_milliseconds(make_client, value, expected):
    guard = SyncDistributedLock(make_client(), table="locks", key="k", lease_duration=value)
    assert guard.lease_duration == pytest.approx(expected, abs=0.001)


@pytest.mark.parametrize("table", ["ab", "x" * 256, "has space", "semi;colon", "é-table", ""])
def test_bad_table_names_raise_value_error(make_client, table):
    with pytest.raises(ValueError, match="table must be 3-255 characters"):
        SyncDistributedLock(make_client(), table=table, key="k")


@pytest.mark.parametrize("table", [None, 3, b"locks"])
def test_non_str_tables_raise_type_error(make_client, table):
    with pytest.raises(TypeError, match="table must be a str"):
        SyncDistributedLock(make_client(), table=table, key="k")


@pytest.mark.parametrize("key", ["", "x" * 2049, "\udcff"])
def test_bad_keys_raise_value_error(make_client, key):
    with pytest.raises(ValueError, match="lock key"):
        SyncDistributedLock(make_client(), table="locks", key=key)


def test_non_client_is_rejected():
    with pytest.raises(TypeError, match="client must be a fastlease client"):
        SyncDistributedLock(object(), table="locks", key="k")  # type: ignore[arg-type]


def test_defaults_are_30s_lease_and_35s_wait(make_client):
    guard = SyncDistributedLock(make_client(), table="locks", key="k")
    assert guard.lease_duration == 30.0
    assert guard._lease.wait_ms == 35_000


def test_uncontended_hold_costs_exactly_two_writes(make_client, store):
    client = make_client()
    with SyncDistributedLock(client, table="locks", key="import:daily") as lease:
        lease.raise_if_lost()
        assert lease.state == "held"
        assert lease.is_valid()
        row = store.rows("locks")["import:daily"]
        assert (row.owner, row.lease_ms, row.protocol) == (lease.owner, 30_000, 1)
    metrics = lease.metrics
    assert (metrics.write_requests, metrics.read_requests, metrics.renewals) == (2, 0, 0)
    assert (metrics.conditional_failures, metrics.request_failures, metrics.lost) == (0, 0, False)
    assert (metrics.consumed_rcu, metrics.consumed_wcu) == (0.0, 0.0)
    assert lease.state == "released"
    assert store.rows("locks") == {}


def test_owner_and_version_are_fresh_uuid4s(make_client, store):
    import uuid

    client = make_client()
    owners = set()
    for _ in range(50):
        with SyncDistributedLock(client, table="locks", key="k") as lease:
            row = store.rows("locks")["k"]
            assert uuid.UUID(row.owner).version == 4 and uuid.UUID(row.version).version == 4
            assert row.owner != row.version
            owners.add(lease.owner)
    assert len(owners) == 50


def test_guards_are_single_use_and_not_reentrant(make_client):
    client = make_client()
    guard = SyncDistributedLock(client, table="locks", key="k")
    with guard:
        with pytest.raises(RuntimeError, match="single-use"):
            guard.__enter__()
    with pytest.raises(RuntimeError, match="single-use"):
        with guard:
            pass


def test_raise_if_lost_outside_a_hold_raises_lock_lost_not_held(make_client):
    # As the reference does: code that catches LockLost around its check before a side effect must
    # not get a RuntimeError from a guard that was never acquired, failed, or is already released.
    holder = make_client()
    guard = SyncDistributedLock(holder, table="locks", key="k")
    with pytest.raises(LockLost, match="is not held \\(it is new\\)") as info:
        guard.raise_if_lost()
    assert info.value.cause == "not_held" and info.value.key == "k"
    with guard:
        failed = SyncDistributedLock(make_client(), table="locks", key="k", wait_timeout=0)
        with pytest.raises(LockNotAcquired):
            failed.__enter__()
        with pytest.raises(LockLost, match="it is failed") as info:
            failed.raise_if_lost()
        assert info.value.cause == "not_held"
    with pytest.raises(LockLost, match="it is released") as info:
        guard.raise_if_lost()
    assert info.value.cause == "not_held"
    assert guard.lost_cause is None  # nothing was lost: the cause is only the exception's


def test_acquire_and_release_without_with_have_the_block_s_outcomes(make_client, store):
    client = make_client()
    guard = SyncDistributedLock(client, table="locks", key="k")
    lease = guard.acquire()
    try:
        assert lease is guard and lease.state == "held" and lease.is_valid()
        assert client.holder("locks", "k")["owner"] == lease.owner
    finally:
        guard.release()
    assert guard.state == "released" and store.rows("locks") == {}
    assert client.holder("locks", "k") is None
    with pytest.raises(RuntimeError, match="single-use"):
        guard.acquire()
    with pytest.raises(RuntimeError, match="cannot be released in state released"):
        guard.release()
    taken = SyncDistributedLock(client, table="locks", key="k").acquire()
    store.remove("locks", "k")  # an operator's forced release
    with pytest.raises(LockLost) as info:
        taken.release()
    assert info.value.cause == "stolen"


def test_valid_until_is_the_end_of_validity_on_the_monotonic_clock(make_client, clock):
    client = make_client(clock=clock)
    lease = SyncDistributedLock(client, table="locks", key="k", lease_duration=10)
    assert lease.valid_until() is None  # not acquired yet
    lease.acquire()
    acquired_s = clock.monotonic_ns() / 1e9
    assert lease.valid_until() == acquired_s + 9.0  # 90% of the lease from the stamp before the write
    clock.advance(4)  # a renewal (due at 10/3 s) confirmed: validity counts from its stamp
    assert lease.metrics.renewals == 1
    renewed_until = lease.valid_until()
    assert acquired_s + 12.3 < renewed_until <= acquired_s + 13.0
    clock.jump_wall(5)  # the wall clock runs ahead: its end comes first, and is what counts
    assert lease.valid_until() == pytest.approx(renewed_until - 5, abs=1e-6)
    clock.jump_wall(-6)  # and a backwards jump ends validity at once
    assert lease.valid_until() is None and not lease.is_valid()
    with pytest.raises(LockLost, match="expired"):
        lease.release()
    assert lease.valid_until() is None


def test_holder_reads_the_row_and_validates_the_key(make_client, store):
    client = make_client()
    other = make_client()
    with SyncDistributedLock(client, table="locks", key="job:1") as lease:
        row = other.holder("locks", "job:1")
        assert row is not None
        assert (row["key"], row["owner"], row["fence"]) == ("job:1", lease.owner, lease.fencing_token)
        assert other.holder("locks", "job:2") is None
    with pytest.raises(ValueError, match="1-2048 UTF-8 bytes"):
        client.holder("locks", "")
    with pytest.raises(TypeError, match="lock key must be a str"):
        client.holder("locks", None)


def test_wait_timeout_zero_makes_one_attempt_and_never_sleeps(make_client, clock, faults):
    holder = make_client(clock=clock)
    contender = make_client(clock=clock)
    with SyncDistributedLock(holder, table="locks", key="k"):
        before = clock.monotonic_ns()
        guard = SyncDistributedLock(contender, table="locks", key="k", wait_timeout=0)
        with pytest.raises(LockNotAcquired, match="not acquired within 0s") as info:
            guard.__enter__()
        assert clock.monotonic_ns() == before  # no sleep happened: a fake clock only moves on waits
    assert info.value.key == "k"
    assert isinstance(info.value, TimeoutError) and isinstance(info.value, FastleaseError)
    assert guard.state == "failed"
    metrics = guard.metrics
    assert (metrics.write_requests, metrics.read_requests, metrics.wait_timeouts) == (1, 1, 1)
    assert faults.calls["put_if_absent"] == 2


def test_contention_waits_until_the_budget_then_fails(make_client, clock):
    holder = make_client(clock=clock)
    contender = make_client(clock=clock)
    with SyncDistributedLock(holder, table="locks", key="k", lease_duration=60):
        start = clock.monotonic_ns()
        with pytest.raises(LockNotAcquired):
            with SyncDistributedLock(contender, table="locks", key="k", wait_timeout=2.5):
                pass
        assert clock.monotonic_ns() - start == 2_500_000_000


@pytest.mark.parametrize(("wait_timeout", "shown"), [(0.5, "0.5s"), (0.25, "0.25s"), (2, "2s")])
def test_the_budget_in_the_message_is_the_one_given(make_client, clock, wait_timeout, shown):
    # The compiled engine once said "within 0s" for 0.5 s: a C integer division of wait_ms / 1000.
    holder = make_client(clock=clock)
    contender = make_client(clock=clock)
    with SyncDistributedLock(holder, table="locks", key="k", lease_duration=60):
        # (then, the row having stayed unchanged, how long a takeover needs: test_takeover.py)
        with pytest.raises(LockNotAcquired, match=f"not acquired within {shown}(;|$)"):
            with SyncDistributedLock(contender, table="locks", key="k", wait_timeout=wait_timeout):
                pass


def test_an_unreachable_store_is_named_in_the_message_and_logged_once(make_client, clock, faults, caplog):
    # Before, only "not acquired within 2s": the cause was in __cause__ alone.
    client = make_client(clock=clock)
    faults.add("put_if_absent", "unavailable", times=-1)
    with caplog.at_level("WARNING", logger="fastlease"):
        with pytest.raises(LockNotAcquired) as info:
            with SyncDistributedLock(client, table="locks", key="k", wait_timeout=2):
                pass
    assert str(info.value) == ("lease on 'k' in table 'locks' not acquired within 2s; last store error: "
                               "StoreError: injected: put_if_absent unavailable")
    assert faults.calls["put_if_absent"] > 3  # retried inside the budget, as before
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [f"the store could not be reached for the whole wait: {info.value}"]


def test_a_store_error_followed_by_plain_contention_is_not_blamed(make_client, clock, faults, caplog):
    holder, contender = make_client(clock=clock), make_client(clock=clock)
    with SyncDistributedLock(holder, table="locks", key="k", lease_duration=60):
        faults.add("put_if_absent", "unavailable")  # the first attempt fails, later ones see the row
        with caplog.at_level("WARNING", logger="fastlease"), pytest.raises(LockNotAcquired) as info:
            with SyncDistributedLock(contender, table="locks", key="k", wait_timeout=1):
                pass
    assert str(info.value).startswith("lease on 'k' in table 'locks' not acquired within 1s")
    assert "store error" not in str(info.value)
    assert not [r for r in caplog.records if r.levelname == "WARNING" and "reached" in r.getMessage()]


def test_nesting_a_key_this_client_holds_says_guards_are_not_reentrant(make_client, clock):
    client = make_client(clock=clock)
    with SyncDistributedLock(client, table="locks", key="k", lease_duration=60):
        with pytest.raises(LockNotAcquired, match="this client already holds that key .guards are not reentrant"):
            with SyncDistributedLock(client, table="locks", key="k", wait_timeout=0.5):
                pass
        other = make_client(clock=clock)  # another client (another process) holds nothing itself
        with pytest.raises(LockNotAcquired) as info:
            with SyncDistributedLock(other, table="locks", key="k", wait_timeout=0.5):
                pass
        assert "already holds" not in str(info.value)


def test_body_exceptions_propagate_unchanged_and_release_happens(make_client, store):
    client = make_client()

    class Boom(Exception):
        pass

    with pytest.raises(Boom) as info:
        with SyncDistributedLock(client, table="locks", key="k"):
            raise Boom("body")
    assert str(info.value) == "body"
    assert store.rows("locks") == {}


def test_release_failure_raises_lock_release_error(make_client, clock, faults, store):
    client = make_client(clock=clock)
    faults.add("delete_if_owner", "unavailable", times=-1)
    guard = SyncDistributedLock(client, table="locks", key="k", lease_duration=1)
    with pytest.raises(LockReleaseError, match="unconfirmed after 0.6s") as info:
        with guard:
            pass
    assert info.value.key == "k"
    assert guard.metrics.cleanup_failures == 1
    assert guard.metrics.request_failures >= 3
    assert "k" in store.rows("locks")  # left for recovery by observation


@pytest.mark.parametrize("how", ["lapsed in the block", "raise_if_lost raised"])
def test_release_failure_after_ownership_ended_raises_lock_lost_with_the_release_error(
    make_client, clock, faults, store, how
):
    client = make_client(clock=clock)
    faults.add("delete_if_owner", "unavailable", times=-1)
    guard = SyncDistributedLock(client, table="locks", key="k", lease_duration=1)
    with pytest.raises(LockLost) as info:
        with guard as lease:
            clock.jump_wall(-1)  # validity ends at once
            if how == "raise_if_lost raised":
                with pytest.raises(LockLost):
                    lease.raise_if_lost()
    assert info.value.cause == "expired" and info.value.key == "k"
    assert "release stayed unconfirmed" in str(info.value)
    assert isinstance(info.value.__cause__, LockReleaseError)
    assert guard.metrics.cleanup_failures == 1


def test_release_failure_while_body_raises_is_attached_as_a_note(make_client, clock, faults):
    client = make_client(clock=clock)
    faults.add("delete_if_owner", "unavailable", times=-1)
    with pytest.raises(KeyError) as info:
        with SyncDistributedLock(client, table="locks", key="k", lease_duration=1):
            raise KeyError("body")
    notes = getattr(info.value, "__notes__", [])
    assert any("LockReleaseError" in note for note in notes)


def test_row_taken_from_under_the_holder_raises_lock_lost_on_exit(make_client, store):
    client = make_client()
    with pytest.raises(LockLost) as info:
        with SyncDistributedLock(client, table="locks", key="k") as lease:
            store.remove("locks", "k")  # an operator's forced release
    assert info.value.cause == "stolen"
    assert lease.state == "lost" and lease.lost_cause == "stolen"
    assert lease.metrics.lost is True


@pytest.mark.parametrize("cause", ["expired", "unreachable", "cancelled"])
def test_leaving_after_a_lapse_raises_lock_lost_and_still_deletes_the_row(make_client, clock, faults, store, cause):
    # Nobody took the row, but nobody can tell that from inside the block: as the reference does,
    # leaving raises LockLost. The release itself is unchanged: the row, still ours, is deleted.
    client = make_client(clock=clock)
    max_hold = 3 if cause == "cancelled" else None
    if cause == "unreachable":
        faults.add("update_version_if", "unavailable", times=-1)
    with pytest.raises(LockLost, match=f"lapsed before the block ended \\({cause}\\)") as info:
        with SyncDistributedLock(client, table="locks", key="k", lease_duration=3, max_hold=max_hold):
            if cause == "expired":
                clock.jump_wall(-1)  # validity ends at once; no renewal step has noticed yet
            else:
                clock.advance(6.5)  # past the last validity (renewals failing, or stopped by max_hold)
    assert info.value.cause == cause
    assert store.rows("locks") == {}


def test_a_body_exception_after_a_lapse_wins_and_the_lapse_rides_along(make_client, clock, store):
    client = make_client(clock=clock)
    with pytest.raises(KeyError) as info:
        with SyncDistributedLock(client, table="locks", key="k", lease_duration=3):
            clock.jump_wall(-1)
            raise KeyError("body")
    assert any("LockLost" in note and "lapsed" in note for note in getattr(info.value, "__notes__", []))
    assert store.rows("locks") == {}


def test_check_in_on_a_store_without_transactions_is_a_type_error(make_client):
    with SyncDistributedLock(make_client(), table="locks", key="k") as lease:
        with pytest.raises(TypeError, match="MemoryClient has no transactions"):
            lease.check_in(object())


def test_inherited_client_and_guard_are_rejected_after_fork(make_client, in_forked_child):
    client = make_client()
    guard = SyncDistributedLock(client, table="locks", key="k")

    def use_inherited() -> str:
        outcomes = []
        for use in (guard.__enter__, lambda: SyncDistributedLock(client, table="locks", key="k")):
            try:
                use()
                outcomes.append("no error")
            except RuntimeError as error:
                outcomes.append("ok" if "Create the client in the worker" in str(error) else str(error))
        return "|".join(outcomes)

    assert in_forked_child(use_inherited) == "ok|ok"
    with guard:  # the parent is unaffected
        pass


def test_a_forked_child_cannot_release_its_parents_lease(make_client, in_forked_child):
    client = make_client()
    guard = SyncDistributedLock(client, table="locks", key="k")
    guard.__enter__()
    owner = guard.owner

    def release_inherited() -> str:
        try:
            guard.__exit__(None, None, None)
        except RuntimeError as error:
            return "refused" if "Create the client in the worker" in str(error) else str(error)
        return "released"

    assert in_forked_child(release_inherited) == "refused"
    [row] = client.inspect("locks", "k")
    assert row["owner"] == owner and row["fence"] == 1  # the parent still holds its row
    guard.__exit__(None, None, None)
    assert client.inspect("locks", "k") == []


def test_every_use_of_an_inherited_guard_s_ownership_raises_in_the_child(make_client, in_forked_child):
    # The contract: an inherited guard raises RuntimeError. Before, in a child forked during a hold,
    # raise_if_lost() returned, is_valid() was True and metrics worked.
    client = make_client()
    guard = SyncDistributedLock(client, table="locks", key="k")
    uses = {
        "raise_if_lost": guard.raise_if_lost,
        "is_valid": guard.is_valid,
        "valid_until": guard.valid_until,
        "metrics": lambda: guard.metrics,
        "owner": lambda: guard.owner,
        "fencing_token": lambda: guard.fencing_token,
        "check_in": lambda: guard.check_in(object()),
        "condition_check_item": guard.condition_check_item,
        "release": guard.release,
    }

    def use_inherited() -> str:
        outcomes = []
        for name, use in uses.items():
            try:
                use()
                outcomes.append(f"{name}: no error")
            except RuntimeError as error:
                outcomes.append(f"{name}: ok" if "forked child" in str(error) else f"{name}: {error}")
            except Exception as error:  # noqa: BLE001 - reported to the parent
                outcomes.append(f"{name}: {error!r}")
        return "|".join(outcomes)

    with guard:
        assert in_forked_child(use_inherited) == "|".join(f"{name}: ok" for name in uses)
        guard.raise_if_lost()  # the parent's lease is untouched
        assert guard.is_valid() and guard.metrics.lost is False


def test_a_closed_client_refuses_new_acquisitions_before_any_request(make_client, faults):
    client = make_client()
    client.close()
    with pytest.raises(RuntimeError, match="client is closed"):
        with SyncDistributedLock(client, table="locks", key="k"):
            pass
    assert sum(faults.calls.values()) == 0


def test_an_acquisition_interrupted_after_its_write_leaves_no_row_and_no_renewal(make_client, store, real_faults):
    import threading

    injector = real_faults
    injector.add("put_if_absent", "block")
    client = make_client()
    guard = SyncDistributedLock(client, table="locks", key="k")
    outcome: list[BaseException] = []

    def acquire() -> None:
        try:
            guard.__enter__()
        except BaseException as error:  # noqa: BLE001 - inspected below
            outcome.append(error)

    thread = threading.Thread(target=acquire)
    thread.start()
    assert injector.blocked.wait(10)
    client.close()  # closes between the sent put and its confirmation
    injector.unblock()
    thread.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], RuntimeError)
    assert guard.state == "failed"
    assert store.rows("locks") == {}
    assert len(client.engine.scheduler) == 0


def _duration_uses():
    """Every public argument that takes seconds, as (api, argument name, call with one value)."""
    from fastlease import DistributedLock, distributed_lock
    from fastlease.idempotency import AsyncIdempotentCall, IdempotentCall, idempotent
    from fastlease.idempotency.fastapi import idempotent_route

    guards = {"SyncDistributedLock": SyncDistributedLock, "DistributedLock": DistributedLock,
              "distributed_lock": distributed_lock}
    records = {"IdempotentCall": IdempotentCall, "AsyncIdempotentCall": AsyncIdempotentCall,
               "idempotent": idempotent, "idempotent_route": idempotent_route}
    uses = []
    for api, make in guards.items():
        for name in ("lease_duration", "wait_timeout", "max_hold"):
            uses.append((api, name, lambda client, value, make=make, name=name:
                         make(client, table="locks", key="k", **{name: value})))
    for api, make in records.items():
        for name in ("lease_duration", "wait", "ttl"):
            extra = {} if api == "idempotent_route" else {"key": "k"}
            uses.append((api, name, lambda client, value, make=make, name=name, extra=extra:
                         make(client, table="payments", **extra, **{name: value})))
    return uses


@pytest.mark.parametrize(("api", "name", "use"), _duration_uses(),
                         ids=lambda value: value if isinstance(value, str) else "")
def test_a_str_duration_is_a_type_error_in_every_api(make_client, api, name, use):
    # One rule for every duration: before, ttl="60" raised ValueError where lease_duration="30" raised
    # TypeError.
    with pytest.raises(TypeError, match=f"^{name} must be a number of seconds, got str: '60'$"):
        use(make_client(), "60")




class _OldAcquisitionStore(MemoryStore):
    """A store written to an older contract: True or False for an acquisition write."""

    def put_if_absent(self, *args):
        return super().put_if_absent(*args) is not None


class _OldReleaseStore(MemoryStore):
    """A store written to an older contract: the deleted row, or None, for a release."""

    def delete_if_owner(self, table, key, owner, timeout_s, usage):
        row = self.rows(table).get(key)
        return row if super().delete_if_owner(table, key, owner, timeout_s, usage) != NOT_DELETED else None


def test_a_lost_race_answered_as_false_is_refused_not_read_as_written(make_client):
    store = _OldAcquisitionStore()
    MemoryStore.put_if_absent(store, "locks", "k", "other", "v", 30_000, 1.0, NO_USAGE)  # another holder
    with pytest.raises(TypeError, match=r"_OldAcquisitionStore answered an acquisition write with False; a LockSt"):
        SyncDistributedLock(make_client(store=store), table="locks", key="k", wait_timeout=0).acquire()
    assert store.rows("locks")["k"].owner == "other"  # untouched, and never believed ours


def test_a_release_answered_with_a_row_is_refused(make_client):
    lease = SyncDistributedLock(make_client(store=_OldReleaseStore()), table="locks", key="k").acquire()
    with pytest.raises(TypeError, match=r"_OldReleaseStore answered a release with LockRow\(owner="):
        lease.release()
