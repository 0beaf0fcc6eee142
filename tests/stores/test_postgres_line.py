"""The line of waiters on PostgreSQL (docs/protocol.md, "Waiting, polling and handoff"), as on Redis: a
waiter's read keeps its place in the lock table's line table, the store admits only the first live waiter
to a free key, a release (or a waiter leaving with the turn) notifies that waiter's id on its client's
turn channel and wakes it alone, in arrival order, a dead waiter's place is skipped once its deadline
passes, and a wait that ends gives its place up. A lock's release hands the lease over to the head's
fresh offer in its own statement (docs/protocol.md, "The handover on PostgreSQL"). A lock table whose
line is missing (made by an older version) falls back to waking every waiter, and a line without the
offers' columns to turns without handovers, each with one warning, until ``create_lock_table`` runs.

The line is read and planted through the test's own ``admin`` connection, and the channels are LISTENed
on one of the test's own; waits for another thread's or the server's state poll it, bounded.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any, Iterator

import psycopg
import pytest

from fastlease import PostgresClient, SyncDistributedLock
from fastlease.exceptions import LockLost, LockNotAcquired, StoreRequestRejected
from fastlease.stores.base import DELETED, HANDED_OVER, LINE_ALIVE_MS
from fastlease.stores.postgres.feed import release_channel
from fastlease.stores.postgres.sql import line_table
from fastlease.testing import NO_USAGE, FakeClock
from helpers.lock_waiter import Waiter, come_back_after_a_handover, hand_over_between
from helpers.still_clock import StillClock
from helpers.waiting import wait_until

T = 2.0  # timeout of a direct store request
BOUND_S = 10.0  # bound for every wait on another thread's state or on a notification
#: The longest sleep of a waiter in line between its reads (POLL_IN_LINE_MS, jittered up to 150%).
LONGEST_POLL_S = 0.5625
LOCKS = ("locks",)  # the lock table each client of these tests creates (its line with it)
LINE = line_table("locks")  # quoted
NO_LINE_WARNING = "has no line of waiters"
TURNS = "fastlease_turn_test"  # the turn channel of the waiters a test plants in a line


def line(admin: psycopg.Connection, key: str = "k") -> list[str]:
    """The waiters in ``key``'s line, live or not, in arrival order."""
    rows = admin.execute(f"SELECT waiter FROM {LINE} WHERE key = %s ORDER BY arrived, waiter", (key,))
    return [waiter for (waiter,) in rows]


def add_waiter(admin: psycopg.Connection, key: str, waiter: str, alive_for_ms: int, arrived_ago_ms: int) -> None:
    """Put ``waiter`` in ``key``'s line as a waiter that arrived ``arrived_ago_ms`` ago (the server's clock),
    read last and then stopped: alive ``alive_for_ms`` more (negative: already dead). A waiter already
    there keeps its place and takes the new deadline."""
    admin.execute(
        f"INSERT INTO {LINE} (key, waiter, channel, arrived, alive_until) VALUES (%s, %s, %s,"
        " clock_timestamp() - %s * interval '1 millisecond', clock_timestamp() + %s * interval '1 millisecond')"
        " ON CONFLICT (key, waiter) DO UPDATE SET alive_until = excluded.alive_until",
        (key, waiter, TURNS, arrived_ago_ms, alive_for_ms))


def hold(client: PostgresClient, key: str) -> SyncDistributedLock:
    guard = SyncDistributedLock(client, table="locks", key=key, lease_duration=30)
    guard.__enter__()
    return guard


def notifications(listener: psycopg.Connection, count: int) -> list[tuple[str, str]]:
    """The next ``count`` notifications on ``listener`` (bounded): (channel, payload)."""
    received = [(n.channel, n.payload) for n in listener.notifies(timeout=BOUND_S, stop_after=count)]
    assert len(received) == count, received
    return received


# ---- the store's steps -------------------------------------------------------------------------------
def test_a_read_in_line_keeps_a_place_and_says_whose_turn_it_is(make_client, admin):
    store = make_client(tables=LOCKS).store
    assert store.read_in_line("locks", "k", "w-a", T, NO_USAGE) == (None, True)  # free, and first
    assert store.read_in_line("locks", "k", "w-b", T, NO_USAGE) == (None, False)  # free, but a's turn
    assert store.read_in_line("locks", "k", "w-a", T, NO_USAGE) == (None, True)  # a keeps its place
    assert store.read_in_line("locks", "k", "w-b", T, NO_USAGE) == (None, False)  # and b its own, behind
    assert line(admin) == ["w-a", "w-b"]
    (left_ms,) = admin.execute(f"SELECT extract(epoch FROM alive_until - clock_timestamp()) * 1000 FROM {LINE}"
                               " WHERE key = 'k' AND waiter = 'w-b'").fetchone()
    assert 0 < left_ms <= LINE_ALIVE_MS
    assert store.put_in_turn("locks", "k", "o1", "v1", 30_000, "w-a", T, NO_USAGE) == 1
    row, turn = store.read_in_line("locks", "k", "w-b", T, NO_USAGE)
    assert row is not None and row.owner == "o1" and turn is False  # held: nobody's turn, not even the first's
    assert line(admin) == ["w-b"]


def test_only_the_first_live_waiter_may_take_a_free_key_and_it_leaves_the_line(make_client, admin):
    store = make_client(tables=LOCKS).store
    add_waiter(admin, "k", "ghost", alive_for_ms=60_000, arrived_ago_ms=2_000)
    add_waiter(admin, "k", "second", alive_for_ms=60_000, arrived_ago_ms=1_000)
    assert store.put_in_turn("locks", "k", "o1", "v1", 30_000, "newcomer", T, NO_USAGE) is None  # no place
    assert store.put_in_turn("locks", "k", "o1", "v1", 30_000, "second", T, NO_USAGE) is None  # not first
    assert store.read("locks", "k", T, NO_USAGE) is None
    assert line(admin) == ["ghost", "second"]  # a refused put leaves the line as it was
    assert store.put_in_turn("locks", "k", "o1", "v1", 30_000, "ghost", T, NO_USAGE) == 1  # its turn
    assert line(admin) == ["second"]
    assert store.read("locks", "k", T, NO_USAGE).owner == "o1"
    # Held: not even the first waiter's put is applied, and it keeps its place.
    assert store.put_in_turn("locks", "k", "o2", "v2", 30_000, "second", T, NO_USAGE) is None
    assert line(admin) == ["second"] and store.read("locks", "k", T, NO_USAGE).owner == "o1"


def test_a_put_without_a_place_waits_for_the_line_as_a_client_without_wake_ups_does(make_client, admin):
    store = make_client(tables=LOCKS).store
    add_waiter(admin, "k", "ghost", alive_for_ms=60_000, arrived_ago_ms=0)
    assert store.put_if_absent("locks", "k", "o1", "v1", 30_000, T, NO_USAGE) is None  # a live waiter first
    polling = make_client("fl-polling", wake_on_release=False)
    with pytest.raises(LockNotAcquired):  # it keeps no place, so it waits until nobody live waits
        SyncDistributedLock(polling, table="locks", key="k", lease_duration=5, wait_timeout=0.3).__enter__()
    admin.execute(f"DELETE FROM {LINE}")
    assert store.put_if_absent("locks", "k", "o1", "v1", 30_000, T, NO_USAGE) == 1  # nobody waits: anyone


def test_a_missing_lock_table_is_not_taken_for_a_missing_line(make_client):
    client = make_client(tables=LOCKS)
    with pytest.raises(StoreRequestRejected, match="create_lock_table"):
        SyncDistributedLock(client, table="nolocks", key="k", wait_timeout=1).__enter__()
    assert client.store._lineless == set()
    client.create_lock_table("nolocks")
    assert client.store.read_in_line("nolocks", "k", "w", T, NO_USAGE) == (None, True)  # in its line


def test_a_role_that_may_not_write_the_line_goes_without_it_but_not_without_the_lock_table(
        make_client, admin, postgres_db, caplog):
    make_client(tables=("locks", "other"))
    admin.execute("DROP ROLE IF EXISTS fl_app")
    admin.execute("CREATE ROLE fl_app LOGIN")
    try:
        admin.execute("GRANT USAGE ON SCHEMA public TO fl_app")
        admin.execute('GRANT SELECT, INSERT, UPDATE, DELETE ON "locks" TO fl_app')  # not on its line
        app = make_client("fl-app", user="fl_app")
        caplog.set_level(logging.WARNING, logger="fastlease.stores.postgres")
        with SyncDistributedLock(app, table="locks", key="k", wait_timeout=1) as lease:
            assert lease.fencing_token == 1
        assert app.store._lineless == {"locks"}
        assert [r for r in caplog.records if NO_LINE_WARNING in r.getMessage() and "42501" in r.getMessage()]
        with pytest.raises(StoreRequestRejected, match=r'"other" failed: permission denied .*42501'):
            SyncDistributedLock(app, table="other", key="k", wait_timeout=1).__enter__()  # no grant: refused
        app.close()
    finally:
        admin.execute("DROP OWNED BY fl_app")
        admin.execute("DROP ROLE fl_app")


def test_a_waiter_past_its_deadline_loses_its_place(make_client, admin):
    store = make_client(tables=LOCKS).store
    add_waiter(admin, "k", "dead", alive_for_ms=-1, arrived_ago_ms=2_000)
    add_waiter(admin, "k", "alive", alive_for_ms=60_000, arrived_ago_ms=1_000)
    assert store.put_in_turn("locks", "k", "o1", "v1", 30_000, "newcomer", T, NO_USAGE) is None  # alive is live
    assert store.read_in_line("locks", "k", "alive", T, NO_USAGE) == (None, True)  # the dead one is skipped
    assert store.put_in_turn("locks", "k", "o1", "v1", 30_000, "alive", T, NO_USAGE) == 1
    assert line(admin) == ["dead"]  # the put took "alive" out; the dead place stays a while
    # A read drops the places of the key's waiters dead for LINE_ALIVE_MS more, and only those.
    add_waiter(admin, "k", "dead", alive_for_ms=-LINE_ALIVE_MS - 1_000, arrived_ago_ms=0)
    add_waiter(admin, "k", "lately-dead", alive_for_ms=-1, arrived_ago_ms=500)
    row, turn = store.read_in_line("locks", "k", "w", T, NO_USAGE)
    assert row.owner == "o1" and turn is False
    assert line(admin) == ["lately-dead", "w"]


def test_leaving_the_line_with_the_turn_announces_the_next_waiter(make_client, admin, postgres_db):
    store = make_client(tables=LOCKS).store
    for waiter in ("w-a", "w-b", "w-c"):
        store.read_in_line("locks", "k", waiter, T, NO_USAGE)
    turns = store.release_feed.turn_name  # the channel the store's waiters took their places with
    with psycopg.connect(postgres_db, autocommit=True) as listener:
        listener.execute(f'LISTEN "{turns}"')
        listener.execute(f'LISTEN "{release_channel("locks")}"')
        store.leave_line("locks", "k", "w-c", T)  # not its turn: announces nothing
        store.leave_line("locks", "k", "w-a", T)  # its turn: b's now
        # Notifications arrive in commit order: c's leaving, had it notified, would come first.
        assert notifications(listener, 1) == [(turns, "w-b")]
        assert line(admin) == ["w-b"]
        assert store.put_in_turn("locks", "k", "o1", "v1", 30_000, "w-b", T, NO_USAGE) == 1  # b takes its turn
        store.read_in_line("locks", "k", "w-d", T, NO_USAGE)
        store.read_in_line("locks", "k", "w-e", T, NO_USAGE)
        store.leave_line("locks", "k", "w-d", T)  # first in line, but the key is held: nobody's turn
        store.leave_line("locks", "k", "w-e", T)
        assert line(admin) == []
        assert store.delete_if_owner("locks", "k", "o1", T, NO_USAGE) == DELETED  # nobody in line: to all
        assert notifications(listener, 1) == [(release_channel("locks"), "k")]  # d's leaving announced nothing


def test_a_turn_wakes_only_the_waiter_it_names_through_the_feed(make_client, admin):
    client = make_client(tables=LOCKS)
    store, feed = client.store, client.store.release_feed
    store.read_in_line("locks", "k", "w-a", T, NO_USAGE)
    store.read_in_line("locks", "k", "w-b", T, NO_USAGE)
    turns: list[str] = []
    woken = threading.Event()
    watch_a = feed.watch("locks", "k", woken.set, "w-a", lambda: turns.append("a"))
    watch_b = feed.watch("locks", "k", woken.set, "w-b", lambda: (turns.append("b"), woken.set()))
    try:
        wait_until(lambda: feed.subscribed("locks"), BOUND_S, "the subscription")
        store.leave_line("locks", "k", "w-a", T)
        assert woken.wait(BOUND_S)
        assert turns == ["b"] and feed.delivered == 1 and line(admin) == ["w-b"]
    finally:
        feed.unwatch(watch_a)
        feed.unwatch(watch_b)


def test_the_release_announces_the_first_live_waiter_or_with_nobody_in_line_the_key(make_client, admin,
                                                                                  postgres_db):
    store = make_client(tables=LOCKS).store
    with psycopg.connect(postgres_db, autocommit=True) as listener:
        listener.execute(f'LISTEN "{TURNS}"')
        listener.execute(f'LISTEN "{release_channel("locks")}"')
        assert store.put_in_turn("locks", "k", "o1", "v1", 30_000, "w-0", T, NO_USAGE) == 1
        add_waiter(admin, "k", "dead", alive_for_ms=-1, arrived_ago_ms=2_000)
        add_waiter(admin, "k", "w-live", alive_for_ms=60_000, arrived_ago_ms=1_000)
        add_waiter(admin, "k", "w-later", alive_for_ms=60_000, arrived_ago_ms=0)
        assert store.delete_if_owner("locks", "k", "o1", T, NO_USAGE) == DELETED
        assert notifications(listener, 1) == [(TURNS, "w-live")]
        assert line(admin) == ["dead", "w-live", "w-later"]  # a release takes nobody out of the line
        assert store.put_in_turn("locks", "j", "o2", "v2", 30_000, "w-j", T, NO_USAGE) == 1
        assert store.delete_if_owner("locks", "j", "o2", T, NO_USAGE) == DELETED
        assert notifications(listener, 1) == [(release_channel("locks"), "j")]
        assert store.delete_if_owner("locks", "j", "o2", T, NO_USAGE) != DELETED  # not held: no notification
        assert store.put_in_turn("locks", "k", "o3", "v3", 30_000, "w-live", T, NO_USAGE) == 2
        assert store.delete_if_owner("locks", "k", "o3", T, NO_USAGE) == DELETED
        assert notifications(listener, 1) == [(TURNS, "w-later")]  # the refused release's is none


# ---- leases that wait --------------------------------------------------------------------------------
def test_releases_hand_the_key_to_waiters_in_the_order_they_came_each_woken_once(make_client, admin):
    holder = make_client("fl-holder", tables=LOCKS)
    guard = hold(holder, "k")
    waiters, clients = [], []
    try:
        for n in range(3):
            client = make_client(f"fl-waiter-{n}")
            clients.append(client)
            waiters.append(Waiter(client, "k", wait_s=BOUND_S, lease_s=5))
            wait_until(lambda n=n: len(line(admin)) == n + 1, BOUND_S, f"waiter {n} in line")
            feed = client.store.release_feed
            wait_until(lambda feed=feed: feed.subscribed("locks"), BOUND_S, "its subscription")
    finally:
        guard.__exit__(None, None, None)
    for waiter in waiters:
        waiter.join()
    order = sorted(range(3), key=lambda n: waiters[n].acquired_at)
    assert order == [0, 1, 2]
    assert [waiter.token for waiter in waiters] == [2, 3, 4]
    # Each release woke one waiter: the one whose turn it was (without a line every release wakes all, and
    # the last waiter would be woken three times). A waiter whose own poll found its turn first is not woken.
    delivered = [client.store.release_feed.delivered for client in clients]
    assert all(count <= 1 for count in delivered) and sum(delivered) >= 2, delivered
    assert line(admin) == []


def test_a_dead_waiter_first_in_line_is_skipped_once_its_deadline_passes(make_client, admin):
    holder, client = make_client("fl-holder", tables=LOCKS), make_client("fl-waiter")
    guard = hold(holder, "k")
    alive_for_ms = 500
    add_waiter(admin, "k", "dead", alive_for_ms=alive_for_ms, arrived_ago_ms=1_000)  # read last just now, then died
    dead_until = time.monotonic() + alive_for_ms / 1000
    waiter = Waiter(client, "k", wait_s=BOUND_S, lease_s=5)
    wait_until(lambda: len(line(admin)) == 2, BOUND_S, "the waiter behind the dead one")
    guard.__exit__(None, None, None)  # the turn goes to the dead waiter: nobody is woken
    waiter.join()
    # Not before the dead waiter's place lapsed (the line is kept), and within a poll after it.
    assert dead_until - 0.05 <= waiter.acquired_at <= dead_until + LONGEST_POLL_S + 1.0
    assert client.store.release_feed.delivered == 0
    assert set(line(admin)) <= {"dead"}  # the waiter's put took it out (a later read drops the dead place)


def test_a_waiter_that_takes_over_leaves_the_line(make_client, admin):
    # A put in turn leaves the line in its own statement; a takeover must leave it apart, or its place
    # would be the head that its own release names, and the next waiter would wait for it to lapse.
    paused = make_client("fl-paused", tables=LOCKS, clock=FakeClock())  # stops renewing: its clock stands
    taker, after = make_client("fl-taker", clock=FakeClock()), make_client("fl-after")
    guard = hold(paused, "k")
    with SyncDistributedLock(taker, table="locks", key="k", lease_duration=5, wait_timeout=60) as lease:
        assert lease.fencing_token == 2 and line(admin) == []  # took over, and left its place
        waiter = Waiter(after, "k", wait_s=BOUND_S, lease_s=5)
        wait_until(lambda: line(admin) != [] and after.store.release_feed.subscribed("locks"), BOUND_S,
                   "the next waiter in line")
    waiter.join()
    assert waiter.token == 3 and after.store.release_feed.delivered == 1  # woken by the release: its turn
    with pytest.raises(LockLost):
        guard.__exit__(None, None, None)


class SleepLog(FakeClock):
    """A FakeClock that records each wait's timeout: the waiter's sleeps between its reads."""

    def __init__(self) -> None:
        super().__init__()
        self.sleeps: list[float] = []

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        self.sleeps.append(timeout_s)
        return super().wait(event, timeout_s)


@pytest.mark.parametrize("lease_s", [1, 30])
def test_in_line_the_poll_is_long_only_beside_a_long_lease(make_client, lease_s):
    # A crashed holder is taken over a lease after the first read that saw its last renewal: up to 1.5
    # polls late. Beside a 1 s lease, a waiter in line keeps the usual poll (62.5-187.5 ms); beside 30 s,
    # the longer one of the line (187.5-562.5 ms), which saves reads.
    holder = make_client("fl-holder", tables=LOCKS, clock=FakeClock())  # never renews: its clock stands
    clock = SleepLog()
    taker = make_client("fl-taker", clock=clock)
    feed = taker.store.release_feed
    ready = feed.watch("locks", "other", lambda: None)  # subscribed first: the waiter's watch is ready at once
    wait_until(lambda: feed.subscribed("locks"), BOUND_S, "the subscription")
    guard = SyncDistributedLock(holder, table="locks", key="k", lease_duration=lease_s)
    guard.__enter__()
    with SyncDistributedLock(taker, table="locks", key="k", lease_duration=5, wait_timeout=lease_s * 2) as lease:
        assert lease.fencing_token == 2  # taken over
    feed.unwatch(ready)
    assert len(clock.sleeps) >= 3, clock.sleeps
    if lease_s == 1:
        assert max(clock.sleeps) <= 0.1875, clock.sleeps
    else:
        assert max(clock.sleeps) > 0.1875, clock.sleeps
    with pytest.raises(LockLost):
        guard.__exit__(None, None, None)


def test_a_wait_that_runs_out_gives_its_place_up(make_client, admin):
    holder, client = make_client("fl-holder", tables=LOCKS), make_client("fl-waiter")
    guard = hold(holder, "k")
    try:
        with pytest.raises(LockNotAcquired):
            SyncDistributedLock(client, table="locks", key="k", lease_duration=5, wait_timeout=0.3).__enter__()
        assert line(admin) == []
    finally:
        guard.__exit__(None, None, None)


# ---- the handover of a released lease to the head of a lock's line -------------------------------------
OFFER = ("o-a", "v-a", 30_000, 1_500)  # owner, version, lease_ms, and the lease_ms of a lease handed over


@contextlib.contextmanager
def turns_heard(store: Any, postgres_db: str) -> Iterator[tuple[psycopg.Connection, str]]:
    """A connection of the test's that LISTENs on the turn channel of ``store``'s waiters, and that channel."""
    turns = store.release_feed.turn_name
    with psycopg.connect(postgres_db, autocommit=True) as listener:
        listener.execute(f'LISTEN "{turns}"')
        yield listener, turns


def held_with_w_a_first(store: Any) -> None:
    """``k`` held by o1 (fence 1), and waiter w-a first in its line with OFFER."""
    assert store.put_in_turn("locks", "k", "o1", "v1", 30_000, "", T, NO_USAGE) == 1
    assert store.read_in_line("locks", "k", "w-a", T, NO_USAGE, None, OFFER)[1] is False


def offer_at(admin: psycopg.Connection, waiter: str, ago_ms: int, key: str = "k") -> None:
    """Date ``waiter``'s offer ``ago_ms`` back on the server's clock (its place stays alive)."""
    admin.execute(f"UPDATE {LINE} SET offered_at = clock_timestamp() - %s * interval '1 millisecond'"
                  " WHERE key = %s AND waiter = %s", (ago_ms, key, waiter))


def test_a_release_hands_the_lease_over_to_the_head_s_fresh_offer_in_its_own_statement(make_client, admin,
                                                                                       postgres_db):
    store = make_client(tables=LOCKS).store
    with turns_heard(store, postgres_db) as (listener, turns):
        held_with_w_a_first(store)
        store.read_in_line("locks", "k", "w-b", T, NO_USAGE, None, ("o-b", "v-b", 30_000, 1_500))
        assert store.delete_if_owner("locks", "k", "o1", T, NO_USAGE) == HANDED_OVER
        assert notifications(listener, 1) == [(turns, "w-a =v-a 2")]  # its id, the version and the fence
        row = store.read("locks", "k", T, NO_USAGE)
        assert (row.owner, row.version, row.lease_ms, row.fence) == ("o-a", "v-a", 1_500, 2)
        assert line(admin) == ["w-b"]  # the head left the line: it holds the lease
        # A read with the offer that was taken finds the lease in its owner, and takes no new place.
        assert store.read_in_line("locks", "k", "w-a", T, NO_USAGE, None, OFFER) == (row, False)
        assert line(admin) == ["w-b"]
        # Its first renewal writes the lease's own lease_ms back.
        assert store.update_version_if("locks", "k", "o-a", "v-a", "v-a2", T, NO_USAGE, 30_000)
        assert store.read("locks", "k", T, NO_USAGE).lease_ms == 30_000
        assert store.update_version_if("locks", "k", "o-a", "v-a2", "v-a3", T, NO_USAGE)  # 0: left as it is
        assert store.read("locks", "k", T, NO_USAGE).lease_ms == 30_000
        # A read of w-a that ran beside the handover kept a place, ahead of w-b, with a fresh offer in the
        # owner that now holds the lease: its release deletes that place and hands over to w-b.
        admin.execute(f"INSERT INTO {LINE} (key, waiter, channel, arrived, alive_until, offer_owner, offer_version,"
                      " offer_px_ms, offered_at) VALUES ('k', 'w-a', %s, clock_timestamp() - interval '1 hour',"
                      " clock_timestamp() + interval '1 minute', 'o-a', 'v-a4', 1500, clock_timestamp())", (turns,))
        store.read_in_line("locks", "k", "w-b", T, NO_USAGE, None, ("o-b", "v-b", 30_000, 1_500))
        assert store.delete_if_owner("locks", "k", "o-a", T, NO_USAGE) == HANDED_OVER
        assert notifications(listener, 1) == [(turns, "w-b =v-b 3")]
        assert store.read("locks", "k", T, NO_USAGE).owner == "o-b" and line(admin) == []


def test_an_offer_older_than_a_third_of_its_span_only_wakes_its_waiter(make_client, admin, postgres_db):
    store = make_client(tables=LOCKS).store
    with turns_heard(store, postgres_db) as (listener, turns):
        held_with_w_a_first(store)
        offer_at(admin, "w-a", ago_ms=OFFER[3] // 3 + 50)  # its waiter may be gone: no handover
        assert store.delete_if_owner("locks", "k", "o1", T, NO_USAGE) == DELETED
        assert notifications(listener, 1) == [(turns, "w-a")]  # its turn, as without an offer
        assert store.read("locks", "k", T, NO_USAGE) is None and line(admin) == ["w-a"]
        # A waiter with no offer (a semaphore's, a version without handovers) is woken alike.
        store.read_in_line("locks", "k", "w-a", T, NO_USAGE)
        assert store.put_in_turn("locks", "k", "o2", "v2", 30_000, "w-a", T, NO_USAGE) == 2
        store.read_in_line("locks", "k", "w-b", T, NO_USAGE)
        assert store.delete_if_owner("locks", "k", "o2", T, NO_USAGE) == DELETED
        assert notifications(listener, 1) == [(turns, "w-b")]
        assert store.read("locks", "k", T, NO_USAGE) is None


def test_a_waiter_that_leaves_frees_a_lease_handed_over_to_it_meanwhile_and_announces_the_next(make_client, admin,
                                                                                                postgres_db):
    store = make_client(tables=LOCKS).store
    with turns_heard(store, postgres_db) as (listener, turns):
        held_with_w_a_first(store)
        store.read_in_line("locks", "k", "w-b", T, NO_USAGE)
        assert store.delete_if_owner("locks", "k", "o1", T, NO_USAGE) == HANDED_OVER  # handed over to w-a
        assert notifications(listener, 1) == [(turns, "w-a =v-a 2")]
        store.leave_line("locks", "k", "w-b", T, None, "o-b")  # nothing handed over to it: nothing freed
        assert store.read("locks", "k", T, NO_USAGE).owner == "o-a"
        store.read_in_line("locks", "k", "w-b", T, NO_USAGE)
        store.leave_line("locks", "k", "w-a", T, None, "o-a")  # w-a's wait ended: its lease is freed
        assert notifications(listener, 1) == [(turns, "w-b")]
        assert store.read("locks", "k", T, NO_USAGE) is None
        assert store.put_in_turn("locks", "k", "o-b", "v-b", 30_000, "w-b", T, NO_USAGE) == 3  # (fence kept)


def test_a_lease_handed_over_is_held_without_a_write_and_renewed_250_ms_after_its_stamp(make_client, admin):
    """The waiter's clock moves only when the test moves it, and so do its renewals: it holds the handed
    lease with the handover's 1.5 s (times 0.9) counted from the stamp before its read, and its first
    renewal, 250 ms after that stamp, writes the lease's own lease_ms back."""
    holder, clock = make_client("fl-holder", tables=LOCKS), StillClock()
    taker = make_client("fl-taker", clock=clock)
    guard = hold(holder, "k")
    lease = SyncDistributedLock(taker, table="locks", key="k", lease_duration=30, wait_timeout=3_600)
    thread = threading.Thread(target=lease.__enter__, daemon=True)
    thread.start()
    wait_until(lambda: line(admin) != [], BOUND_S, "the waiter's place in line")
    guard.__exit__(None, None, None)
    thread.join(BOUND_S)
    assert not thread.is_alive() and lease.is_valid()
    assert lease.fencing_token == guard.fencing_token + 1 and lease.metrics.write_requests == 1
    stamp_ns = clock.monotonic_ns()
    assert lease._lease.valid_until_ns() - stamp_ns == 1_350_000_000
    assert holder.store.read("locks", "k", T, NO_USAGE).lease_ms == 1_500 and line(admin) == []
    clock.advance(0.249)
    assert lease.metrics.write_requests == 1
    clock.advance(0.001)
    assert lease._lease.valid_until_ns() - stamp_ns == 250_000_000 + 27_000_000_000
    assert holder.store.read("locks", "k", T, NO_USAGE).lease_ms == 30_000
    lease.__exit__(None, None, None)


def test_a_client_that_handed_the_key_over_reads_before_it_writes_when_it_comes_back(make_client, admin):
    first, second = make_client("fl-first", tables=LOCKS), make_client("fl-second")
    come_back_after_a_handover(first, second, lambda: line(admin))


def test_a_client_that_handed_the_key_over_to_a_holder_that_has_gone_reads_then_puts(make_client, admin):
    first, second = make_client("fl-first", tables=LOCKS), make_client("fl-second")
    hand_over_between(first, second, lambda: line(admin)).__exit__(None, None, None)
    back = hold(first, "k")  # its read finds the key free, and the turn its own: then its put
    assert (back.metrics.read_requests, back.metrics.write_requests) == (1, 1) and back.is_valid()
    back.__exit__(None, None, None)


def test_a_lease_handed_over_to_a_waiter_that_died_in_line_is_taken_over_after_the_handover_s_span(make_client,
                                                                                                  admin):
    """A waiter that offered, then died, is handed the lease, written with the handover's 1.5 s as its
    lease_ms: the next waiter takes it over once it has seen it unchanged that long, not the lease's 30 s."""
    holder, client = make_client("fl-holder", tables=LOCKS), make_client("fl-waiter")
    guard = hold(holder, "k")
    holder.store.read_in_line("locks", "k", "dead", T, NO_USAGE, None, OFFER)  # its last read, then it died
    waiter = Waiter(client, "k", wait_s=BOUND_S, lease_s=5)
    wait_until(lambda: len(line(admin)) == 2, BOUND_S, "the waiter behind the dead one")
    released_at = time.monotonic()
    guard.__exit__(None, None, None)  # hands the lease over to the dead waiter
    waiter.join()
    assert waiter.token == guard.fencing_token + 2  # the handover's token, then its own takeover's
    taken_at = released_at + OFFER[3] / 1000
    assert taken_at - 0.05 <= waiter.acquired_at <= taken_at + 2 * LONGEST_POLL_S + 1.0


def test_a_line_made_by_an_earlier_version_takes_turns_without_handovers_until_create_lock_table(
        make_client, admin, caplog):
    holder = make_client("fl-holder", tables=LOCKS)
    admin.execute(f"ALTER TABLE {LINE} DROP COLUMN offer_owner, DROP COLUMN offer_version,"
                  " DROP COLUMN offer_px_ms, DROP COLUMN offered_at")  # as an earlier version made it
    waiting = make_client("fl-waiter")
    caplog.set_level(logging.WARNING, logger="fastlease.stores.postgres")

    def waited_for_a_release() -> Waiter:
        guard = hold(holder, "k")
        waiter = Waiter(waiting, "k", wait_s=BOUND_S, lease_s=30)
        wait_until(lambda: line(admin) != [] and waiting.store.release_feed.subscribed("locks"), BOUND_S,
                   "the waiter in line")
        guard.__exit__(None, None, None)
        waiter.join()
        return waiter

    waiter = waited_for_a_release()
    # Its turn came by the feed, and it wrote: a put in turn, after its refused first put.
    assert waiter.token == 2 and waiter.writes == 2 and waiting.store.release_feed.delivered == 1
    assert line(admin) == []
    assert "locks" in waiting.store._offerless and "locks" in holder.store._offerless
    assert not waiting.store._lineless and not holder.store._lineless
    warnings = [record.getMessage() for record in caplog.records if "no offers' columns" in record.getMessage()]
    assert len(warnings) == 2 and all("'locks'" in message for message in warnings), warnings

    waiting.create_lock_table("locks")  # adds the columns: this client's waiters offer again
    holder.create_lock_table("locks")
    assert "locks" not in waiting.store._offerless and "locks" not in holder.store._offerless
    waiter = waited_for_a_release()
    assert waiter.token == 4 and waiter.writes == 1  # handed over: its one write was its refused put


def test_create_lock_table_alters_a_line_only_when_it_lacks_the_offers_columns(make_client, postgres_db):
    """A rerun on an up-to-date line takes no ACCESS EXCLUSIVE lock (ALTER TABLE would): it completes while
    another transaction writes the line."""
    store = make_client(tables=LOCKS).store
    with psycopg.connect(postgres_db) as writer:  # a transaction left open, holding ROW EXCLUSIVE on the line
        writer.execute(f"INSERT INTO {LINE} (key, waiter, channel, arrived, alive_until)"
                       " VALUES ('k', 'w', 'c', now(), now())")
        store.create_table("locks", False, 2.0)  # with an ALTER, it would wait for the lock and time out
        writer.rollback()


# ---- a lock table without a line ---------------------------------------------------------------------
def test_a_lock_table_without_its_line_wakes_every_waiter_until_create_lock_table_makes_it(make_client, admin,
                                                                                       caplog):
    holder = make_client("fl-holder", tables=LOCKS)
    admin.execute(f"DROP TABLE {LINE}")  # as a lock table made by a version without the line
    waiting = make_client("fl-waiter")  # (creating the table would make the line again)
    feed = waiting.store.release_feed
    caplog.set_level(logging.WARNING, logger="fastlease.stores.postgres")
    guard = hold(holder, "k")
    waiter = Waiter(waiting, "k", wait_s=BOUND_S, lease_s=5)
    wait_until(lambda: feed.subscribed("locks"), BOUND_S, "the waiter's LISTEN")
    guard.__exit__(None, None, None)
    waiter.join()
    assert waiter.token == 2 and feed.delivered == 1  # the release woke it, on the release channel
    assert "locks" in holder.store._lineless and "locks" in waiting.store._lineless
    warnings = [record for record in caplog.records if NO_LINE_WARNING in record.getMessage()]
    # Once per client, however many of its requests would have used the line (the waiter's put and reads).
    assert len(warnings) == 2 and all(record.levelno == logging.WARNING for record in warnings), warnings
    assert all("'locks'" in record.getMessage() for record in warnings)

    waiting.create_lock_table("locks")  # makes the line again: this client uses it from now on
    assert admin.execute("SELECT to_regclass(%s)", (LINE,)).fetchone()[0] is not None
    assert "locks" not in waiting.store._lineless
    guard = hold(holder, "k")  # (the holder still goes without: its releases wake every waiter)
    waiter = Waiter(waiting, "k", wait_s=BOUND_S, lease_s=5)
    wait_until(lambda: line(admin) != [], BOUND_S, "the waiter's place in the line made again")
    guard.__exit__(None, None, None)
    waiter.join()
    assert waiter.token == 4 and line(admin) == []  # its put took it out of the line
    assert len([record for record in caplog.records if NO_LINE_WARNING in record.getMessage()]) == 2


def test_without_a_line_the_store_steps_answer_as_the_plain_ones(make_client, admin):
    """A lineless table's read never gives a turn (the engine then waits for a wake-up or a poll), its put
    is a plain put, and leaving the line does nothing."""
    store = make_client(tables=LOCKS).store
    admin.execute(f"DROP TABLE {LINE}")
    assert store.read_in_line("locks", "k", "w-a", T, NO_USAGE) == (None, False)
    assert store.put_in_turn("locks", "k", "o1", "v1", 30_000, "w-b", T, NO_USAGE) == 1
    row, turn = store.read_in_line("locks", "k", "w-a", T, NO_USAGE)
    assert row.owner == "o1" and turn is False
    store.leave_line("locks", "k", "w-a", T)
    assert store.delete_if_owner("locks", "k", "o1", T, NO_USAGE) == DELETED
    assert store._lineless == {"locks"}


def test_the_line_table_is_named_after_its_lock_table_and_fits_an_identifier(make_client, admin):
    make_client(tables=("t" * 63, "Orders.v2-x"))
    names = [name for (name,) in admin.execute(
        "SELECT tablename::text FROM pg_tables WHERE schemaname = 'public' AND tablename LIKE 'fastlease_line_%'")]
    assert sorted(names) == sorted(line_table(table).strip('"') for table in ("t" * 63, "Orders.v2-x"))
    assert all(len(name) <= 63 for name in names)
    (comment,) = admin.execute("SELECT obj_description(to_regclass(%s), 'pg_class')",
                               (line_table("Orders.v2-x"),)).fetchone()
    assert "Orders.v2-x" in comment  # what an operator listing the tables reads about it
