"""Counted semaphores (``fastlease.Semaphore``): at most ``limit`` holders, each a lease on one slot key,
with the lease's takeover rule, renewal and fencing per slot; a lock and a semaphore, or two limits, on one
key refuse each other; on the memory store with both engines, then on every store."""

from __future__ import annotations

import asyncio
import threading

import pytest

from fastlease import (
    AsyncSemaphore,
    FastleaseError,
    KeyKindMismatch,
    LockLost,
    LockNotAcquired,
    Semaphore,
    SyncDistributedLock,
    semaphore,
)
from fastlease.exceptions import StoreError
from fastlease.memory import MemoryClient
from fastlease.stores.base import LockRow
from fastlease.stores.memory import MemoryStore
from helpers.loops import run
from helpers.waiting import wait_until

BOUND_S = 10.0  # the longest any wait below may take before the test fails


def dead_slot_holder(limit, lease_ms=10_000):
    """A crashed holder's row in a slot of a semaphore of ``limit``: its lease is 10 s."""
    return LockRow(f"sem:{limit}:dead-host:1/dead-owner", "dead-version", lease_ms, 1)


# ---- on the memory store, both engines ----------------------------------------------------------
def test_at_most_limit_holders_each_in_its_own_slot_with_the_slots_own_token(make_client, store):
    client = make_client()
    guards = [Semaphore(client, table="locks", key="reports", limit=3, wait_timeout=0, identity=f"w{n}")
              for n in range(3)]
    for guard in guards:
        guard.acquire()
    assert [guard.slot for guard in guards] == [0, 1, 2]
    assert [guard.key for guard in guards] == ["reports", "reports#slot1", "reports#slot2"]
    assert {guard.semaphore_key for guard in guards} == {"reports"} and {guard.limit for guard in guards} == {3}
    assert [guard.fencing_token for guard in guards] == [1, 1, 1]  # each slot counts its own acquisitions
    assert sorted(store.rows("locks")) == ["reports", "reports#slot1", "reports#slot2"]
    fourth = Semaphore(client, table="locks", key="reports", limit=3, wait_timeout=0)
    with pytest.raises(LockNotAcquired, match=r"no slot of semaphore 'reports' \(limit 3\) in table 'locks' "
                                              r"acquired within 0s; this client holds 3 of its 3 slots itself"):
        fourth.acquire()
    assert fourth.slot is None and fourth.state == "failed"
    guards[1].release()
    with Semaphore(client, table="locks", key="reports", limit=3, wait_timeout=0) as again:
        assert again.slot == 1 and again.fencing_token == 2  # the freed slot, its token one higher
    for guard in (guards[0], guards[2]):
        guard.release()
    assert store.rows("locks") == {}  # every slot's row deleted at its release


def test_an_uncontended_hold_costs_two_requests_and_each_held_slot_tried_costs_two_more(make_client):
    client = make_client()
    with Semaphore(client, table="locks", key="k", limit=4, wait_timeout=0) as first:
        pass
    assert first.metrics[:2] == (2, 0)  # the put and the release, as a lease's
    with Semaphore(client, table="locks", key="k", limit=4, wait_timeout=0) as holder:
        with Semaphore(client, table="locks", key="k", limit=4, wait_timeout=0) as second:
            pass
    # Slot 0: a failed put and the read that observes it; slot 1: the put; then the release.
    assert holder.slot == 0 and second.slot == 1 and second.metrics[:2] == (3, 1)


def test_a_crashed_holders_slot_is_taken_over_after_one_whole_unchanged_lease(make_client, clock, store):
    for slot_key in ("k", "k#slot1"):
        store.plant("locks", slot_key, dead_slot_holder(2))
    client = make_client(clock=clock)
    start = clock.monotonic_ns()
    with Semaphore(client, table="locks", key="k", limit=2, lease_duration=30, wait_timeout=60) as lease:
        assert clock.monotonic_ns() - start == 10_000_000_000  # exactly the stored lease, from the first sighting
        assert lease.slot == 0 and store.rows("locks")["k"].owner == lease.owner
    assert store.rows("locks")["k#slot1"].owner == "sem:2:dead-host:1/dead-owner"  # (one slot is enough)


class TakeoverLostThenUnreadable(MemoryStore):
    """A store whose takeovers apply but answer with a timeout, and whose next read then fails: the
    takeover's outcome stays unknown after the first reconciling read."""

    fail_read = False

    def replace_if(self, *args):
        super().replace_if(*args)
        self.fail_read = True
        raise StoreError("the response was lost", maybe_committed=True)

    def read(self, *args):
        if self.fail_read:
            self.fail_read = False
            raise StoreError("the store did not answer")
        return super().read(*args)


def test_a_takeover_of_unknown_outcome_is_reconciled_on_its_own_slot(core, clock):
    store = TakeoverLostThenUnreadable()
    store.plant("locks", "k", dead_slot_holder(2))
    store.plant("locks", "k#slot1", LockRow("sem:2:live:1/live-owner", "v", 60_000, 1))  # held all along
    client = MemoryClient(store=store, clock=clock, _engine_module=core)
    try:
        start = clock.monotonic_ns()
        with Semaphore(client, table="locks", key="k", limit=2, wait_timeout=15) as lease:
            # The write that landed is found ours by the next step's read of slot 0, not mistaken for a
            # stranger's row to be watched for another lease (nor reconciled against slot 1's row).
            assert lease.slot == 0 and clock.monotonic_ns() - start < 11_000_000_000
    finally:
        client.close()
    assert sorted(store.rows("locks")) == ["k#slot1"]


def test_no_slot_is_taken_over_before_a_whole_lease(make_client, clock, store):
    for slot_key in ("k", "k#slot1"):
        store.plant("locks", slot_key, dead_slot_holder(2))
    client = make_client(clock=clock)
    with pytest.raises(LockNotAcquired):
        Semaphore(client, table="locks", key="k", limit=2, wait_timeout=9.99).acquire()
    assert {row.owner for row in store.rows("locks").values()} == {"sem:2:dead-host:1/dead-owner"}


def test_a_held_slot_is_renewed_and_its_validity_moves_on(make_client, clock):
    client = make_client(clock=clock)
    with Semaphore(client, table="locks", key="k", limit=2, lease_duration=3) as lease:
        clock.advance(10)  # three leases: only renewals keep it valid
        assert lease.is_valid() and lease.metrics.renewals >= 9
        lease.raise_if_lost()


def test_a_lock_and_a_semaphore_on_one_key_refuse_each_other_at_once(make_client, clock):
    client = make_client(clock=clock)
    start = clock.monotonic_ns()
    with SyncDistributedLock(client, table="locks", key="k", wait_timeout=0):
        with pytest.raises(KeyKindMismatch, match=r"'k' is held by a lock, and this is a semaphore of limit 3"):
            Semaphore(client, table="locks", key="k", limit=3, wait_timeout=60).acquire()
    with Semaphore(client, table="locks", key="k", limit=3, wait_timeout=0):
        with pytest.raises(KeyKindMismatch, match=r"'k' is held by a semaphore of limit 3, and this is a lock"):
            SyncDistributedLock(client, table="locks", key="k", wait_timeout=60).acquire()
    assert clock.monotonic_ns() == start  # refused, not waited out


def test_two_limits_on_one_key_refuse_each_other(make_client):
    client = make_client()
    with Semaphore(client, table="locks", key="k", limit=2, wait_timeout=0):
        with pytest.raises(KeyKindMismatch, match=r"by a semaphore of limit 2, and this is a semaphore of limit 5"):
            Semaphore(client, table="locks", key="k", limit=5, wait_timeout=0).acquire()


def test_a_lock_in_a_later_slot_is_refused_too(make_client, store):
    client = make_client()
    store.plant("locks", "k#slot1", LockRow("a-lock-owner", "v", 10_000, 1))
    with Semaphore(client, table="locks", key="k", limit=2, wait_timeout=0):
        with pytest.raises(KeyKindMismatch, match=r"'k#slot1' is held by a lock"):
            Semaphore(client, table="locks", key="k", limit=2, wait_timeout=0).acquire()
    assert sorted(store.rows("locks")) == ["k#slot1"]  # nothing of the refused acquisition left behind


def test_kind_mismatch_is_a_value_error_and_a_fastlease_error():
    assert issubclass(KeyKindMismatch, ValueError) and issubclass(KeyKindMismatch, FastleaseError)


@pytest.mark.parametrize(("limit", "error", "message"), [
    (0, ValueError, r"limit must be between 1 and 256 holders, got 0"),
    (257, ValueError, r"limit must be between 1 and 256 holders, got 257"),
    (True, TypeError, r"limit must be an int, got bool: True"),
    ("3", TypeError, r"limit must be an int, got str: '3'"),
    (2.0, TypeError, r"limit must be an int, got float: 2.0"),
])
def test_a_bad_limit_is_refused_when_the_guard_is_made(make_client, store, limit, error, message):
    with pytest.raises(error, match=message):
        Semaphore(make_client(), table="locks", key="k", limit=limit)
    with pytest.raises(error, match=message):
        semaphore(make_client(), table="locks", key="k", limit=limit)
    assert store.rows("locks") == {}


def test_a_key_without_room_for_the_slots_suffix_and_a_bad_identity_are_refused(make_client):
    client = make_client()
    Semaphore(client, table="locks", key="k" * 2048, limit=1)  # one slot: the key itself
    with pytest.raises(ValueError, match=r"must leave room for its slots' suffix \('#slot1'\) within 2048"):
        Semaphore(client, table="locks", key="k" * 2048, limit=2)
    with pytest.raises(ValueError, match=r"identity must be 1-128 printable characters without '/', got 'a/b'"):
        Semaphore(client, table="locks", key="k", limit=2, identity="a/b")


def test_a_slot_freed_in_this_client_wakes_its_waiter_at_once(make_client):
    client = make_client()
    held = [Semaphore(client, table="locks", key="k", limit=2, wait_timeout=0).acquire() for _ in range(2)]
    outcome = {}

    def wait_for_a_slot():
        with Semaphore(client, table="locks", key="k", limit=2, wait_timeout=BOUND_S) as lease:
            outcome["slot"] = lease.slot

    thread = threading.Thread(target=wait_for_a_slot, daemon=True)
    thread.start()
    wait_until(lambda: len(client.engine.signals), BOUND_S, "the waiter queued")
    held[1].release()
    thread.join(BOUND_S)
    assert outcome == {"slot": 1}
    held[0].release()


class RecordingFeed:
    """A release feed (fastlease.stores.base.ReleaseFeed) that reports nothing and records what is watched."""

    def __init__(self):
        self.watched = []

    def watch(self, table, key, wake):
        ready = threading.Event()
        ready.set()
        watch = type("Watch", (), {"ready": ready, "was_ready": True, "key": key})()
        self.watched.append(watch)
        return watch

    def unwatch(self, watch):
        self.watched.remove(watch)


def test_a_waiter_watches_every_slot_on_the_release_feed_until_it_holds_one(make_client):
    client = make_client()
    feed = client.engine.release_feed = RecordingFeed()
    held = [Semaphore(client, table="locks", key="k", limit=3, wait_timeout=0).acquire() for _ in range(3)]
    thread = threading.Thread(target=lambda: Semaphore(client, table="locks", key="k", limit=3,
                                                       wait_timeout=BOUND_S).acquire().release(), daemon=True)
    thread.start()
    wait_until(lambda: len(feed.watched) == 3, BOUND_S, "a watch on each of the three slots")
    assert sorted(watch.key for watch in feed.watched) == ["k", "k#slot1", "k#slot2"]
    held[0].release()  # slot 0, which the lease's own watch is not on
    thread.join(BOUND_S)
    assert not thread.is_alive() and feed.watched == []  # every watch ended with the acquisition
    for guard in held[1:]:
        guard.release()


def test_holders_says_who_holds_which_slot(make_client):
    client = make_client()
    a = Semaphore(client, table="locks", key="k", limit=3, identity="a").acquire()
    b = Semaphore(client, table="locks", key="k", limit=3, identity="b").acquire()
    found = client.holders("locks", "k")
    assert [(h["slot"], h["identity"], h["limit"], h["owner"], h["fence"]) for h in found] == [
        (0, "a", 3, a.owner, 1), (1, "b", 3, b.owner, 1)]
    a.release()  # slot 0 is free: the limit comes from the table's other slots, or from the caller
    assert [h["slot"] for h in client.holders("locks", "k")] == [1]
    assert [h["slot"] for h in client.holders("locks", "k", limit=3)] == [1]
    with pytest.raises(KeyKindMismatch, match=r"semaphore of limit 3, and this is a semaphore of limit 2"):
        client.holders("locks", "k", limit=2)
    b.release()
    assert client.holders("locks", "k") == []
    with SyncDistributedLock(client, table="locks", key="k"):
        with pytest.raises(KeyKindMismatch, match=r"'k' is held by a lock, not by a semaphore's slot"):
            client.holders("locks", "k")


def test_the_decorator_admits_at_most_limit_calls_at_once_per_resolved_key(make_client):
    client = make_client()
    inside, release = threading.Semaphore(0), threading.Event()
    running = {"now": 0, "most": 0}
    lock = threading.Lock()

    @semaphore(client, table="locks", key="build:{project}", limit=2, wait_timeout=BOUND_S)
    def build(project):
        with lock:
            running["now"] += 1
            running["most"] = max(running["most"], running["now"])
        inside.release()
        release.wait(BOUND_S)
        with lock:
            running["now"] -= 1
        return project

    threads = [threading.Thread(target=build, args=("a",), daemon=True) for _ in range(3)]
    for thread in threads:
        thread.start()
    for _ in range(2):
        assert inside.acquire(timeout=BOUND_S)
    assert not inside.acquire(timeout=0.3)  # the third call waits for a slot
    assert build.__name__ == "build" and len(client.holders("locks", "build:a")) == 2
    release.set()
    for thread in threads:
        thread.join(BOUND_S)
    assert running["most"] == 2 and inside.acquire(timeout=0)  # the third ran once a slot was free


def test_the_async_semaphore_cancels_its_body_at_the_loss_and_ends_with_lock_lost(make_client, store):
    client = make_client()
    body = []

    async def main():
        with pytest.raises(LockLost) as info:
            async with AsyncSemaphore(client, table="locks", key="k", limit=2, lease_duration=1.0,
                                      cancel_on_lost=True) as lease:
                assert lease.slot == 0
                store.remove("locks", lease.key)  # taken from under the holder
                try:
                    await asyncio.sleep(BOUND_S)
                except asyncio.CancelledError:
                    body.append("cancelled")
                    raise
        return info.value

    assert run(main()).cause == "stolen" and body == ["cancelled"]


def test_the_async_decorator_holds_a_slot_for_each_call(make_client):
    client = make_client()

    @semaphore(client, table="locks", key="k", limit=2)
    async def work():
        return [h["slot"] for h in client.holders("locks", "k")]

    assert run(work()) == [0]


# ---- every store -----------------------------------------------------------------------------------
def test_on_every_store_at_most_limit_hold_and_a_freed_slot_goes_to_the_waiter(make_store_client):
    a, b, c = make_store_client(), make_store_client(), make_store_client()
    key = f"sem-{threading.get_ident()}"  # (the moto server's table outlives a test)
    first = Semaphore(a, table="locks", key=key, limit=2, wait_timeout=0, lease_duration=2.0).acquire()
    second = Semaphore(b, table="locks", key=key, limit=2, wait_timeout=0, lease_duration=2.0).acquire()
    try:
        assert (first.slot, second.slot) == (0, 1)
        assert [h["owner"] for h in c.holders("locks", key)] == [first.owner, second.owner]
        with pytest.raises(LockNotAcquired):
            Semaphore(c, table="locks", key=key, limit=2, wait_timeout=0.3).acquire()
        with pytest.raises(KeyKindMismatch):
            SyncDistributedLock(c, table="locks", key=key, wait_timeout=0).acquire()
        outcome = {}

        def wait_for_a_slot():
            with Semaphore(c, table="locks", key=key, limit=2, wait_timeout=BOUND_S, lease_duration=2.0) as lease:
                outcome["slot"], outcome["token"] = lease.slot, lease.fencing_token

        thread = threading.Thread(target=wait_for_a_slot, daemon=True)
        thread.start()
        second.release()
        thread.join(BOUND_S)
        assert outcome["slot"] == 1 and outcome["token"] > second.fencing_token
    finally:
        first.release()
        if second.state == "held":
            second.release()
    assert c.holders("locks", key, limit=2) == []


def test_check_in_guards_the_callers_transaction_with_the_slot_held(tmp_path):
    import sqlite3

    from fastlease import SQLiteClient
    from fastlease.testing import NO_USAGE

    client = SQLiteClient(tmp_path / "app.db")
    db = sqlite3.connect(tmp_path / "app.db", isolation_level=None)
    try:
        db.execute("CREATE TABLE reports (day TEXT PRIMARY KEY)")
        with Semaphore(client, table="locks", key="reports", limit=2) as other:
            lease = Semaphore(client, table="locks", key="reports", limit=2).acquire()
            assert (other.slot, lease.slot) == (0, 1)
            db.execute("BEGIN IMMEDIATE")
            lease.check_in(db)  # the slot's row, not the semaphore's key
            db.execute("INSERT INTO reports VALUES ('2026-12-04')")
            db.execute("COMMIT")
            assert client.store.delete_if_owner("locks", "reports#slot1", lease.owner, 5.0, NO_USAGE)
            db.execute("BEGIN IMMEDIATE")
            with pytest.raises(LockLost) as lost:
                lease.check_in(db)  # the slot was taken from under it: nothing may commit
            db.execute("ROLLBACK")
            assert lost.value.cause == "stolen"
            with pytest.raises(LockLost):
                lease.release()
    finally:
        db.close()
        client.close()
    assert [row[0] for row in sqlite3.connect(tmp_path / "app.db").execute("SELECT day FROM reports")] == ["2026-12-04"]
