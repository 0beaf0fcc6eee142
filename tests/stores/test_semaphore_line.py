"""A semaphore's line of waiters (docs/protocol.md, "Semaphores"), on Redis and PostgreSQL: one line per
semaphore, kept on its key (slot 0's), whichever slot its waiters read; a put on any slot is refused while a
live waiter is ahead in it; a slot's release wakes the head of that line alone, and a put in turn passes
the turn on (another slot may be free too). On Redis Cluster, whose slots' keys hash apart, a semaphore
keeps no line and every release wakes its waiters, as before.

Lines are planted and read through the server itself (a raw command or the test's own connection); waits
for another thread's state poll it, bounded.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterator

import pytest

from fastlease import PostgresClient, Semaphore
from fastlease.exceptions import LockLost, LockNotAcquired
from fastlease.redis import RedisClient
from fastlease.stores.base import DELETED
from fastlease.stores.postgres.sql import line_table
from fastlease.stores.redis.cluster import ClusterLayout
from fastlease.stores.redis.scripts import NodeLayout
from fastlease.testing import NO_USAGE, FakeClock
from helpers.waiting import wait_until

pytestmark = pytest.mark.server

T = 2.0  # timeout of a direct store request
BOUND_S = 10.0  # bound for every wait on another thread's state
SLOT1 = "s#slot1"  # the second slot of semaphore "s"


class Place:
    """One store: how to make a client, and how to read and plant the line kept on a key."""

    def __init__(self, make: Callable[..., Any], line: Callable[[str], list[str]],
                 plant: Callable[[str, str], None], subscribed: Callable[[Any, str], bool]) -> None:
        self.make, self.line, self.plant, self.subscribed = make, line, plant, subscribed


def redis_place(url: str, made: list[Any]) -> Place:
    def make(**kwargs: Any) -> RedisClient:
        client = RedisClient(url, **kwargs)
        made.append(client)
        return client

    reader = make()

    def line(key: str) -> list[str]:
        """The ids in ``key``'s line, as the engine knows them: without their client's token."""
        waiters = reader.store.call(key, T, b"ZRANGE", NodeLayout.line("locks", key), 0, -1)
        return [waiter.decode().partition("~")[2] or waiter.decode() for waiter in waiters]

    def plant(key: str, waiter: str) -> None:
        """``waiter`` first in ``key``'s line, alive for a minute (a waiter that read last and stopped)."""
        seconds, micros = reader.store.call(key, T, b"TIME")
        reader.store.call(key, T, b"ZADD", NodeLayout.line("locks", key), 0, waiter)
        reader.store.call(key, T, b"HSET", NodeLayout.alive("locks", key), waiter,
                          int(seconds) * 1000 + int(micros) // 1000 + 60_000)

    return Place(make, line, plant, lambda client, key: client.store.release_feed.subscribed("locks", key))


def postgres_place(make_client: Callable[..., PostgresClient], admin: Any) -> Place:
    def make(**kwargs: Any) -> PostgresClient:
        return make_client(tables=("locks",), **kwargs)

    def line(key: str) -> list[str]:
        rows = admin.execute(f"SELECT waiter FROM {line_table('locks')} WHERE key = %s ORDER BY arrived, waiter",
                             (key,))
        return [waiter for (waiter,) in rows]

    def plant(key: str, waiter: str) -> None:
        admin.execute(f"INSERT INTO {line_table('locks')} (key, waiter, channel, arrived, alive_until) VALUES"
                      " (%s, %s, 'fastlease_turn_test', clock_timestamp() - interval '1 second',"
                      " clock_timestamp() + interval '1 minute')", (key, waiter))

    return Place(make, line, plant, lambda client, key: client.store.release_feed.subscribed("locks"))


@pytest.fixture(params=["redis", "postgres"])
def place(request: pytest.FixtureRequest) -> Iterator[Place]:
    made: list[Any] = []
    if request.param == "redis":
        request.getfixturevalue("redis_db")  # emptied
        yield redis_place(request.getfixturevalue("redis_url"), made)
    else:
        yield postgres_place(request.getfixturevalue("make_client"), request.getfixturevalue("admin"))
    for client in made:
        client.close()


class SlotHolder:
    """Waits (on a thread of its own) for a slot of semaphore ``key``, then holds it until ``let_go``."""

    def __init__(self, client: Any, key: str = "s", limit: int = 2, wait_s: float = BOUND_S) -> None:
        self.client, self.key, self.limit, self.wait_s = client, key, limit, wait_s
        self.acquired, self._release = threading.Event(), threading.Event()
        self.guard: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            with Semaphore(self.client, table="locks", key=self.key, limit=self.limit, lease_duration=5,
                           wait_timeout=self.wait_s) as guard:
                self.guard = guard
                self.acquired.set()
                assert self._release.wait(BOUND_S * 3), "never let go"
        except BaseException as error:  # noqa: BLE001 - reported by let_go()
            self.error = error

    def let_go(self) -> None:
        """Release the slot (if held) and wait for the thread; raise what it raised."""
        self._release.set()
        self.thread.join(BOUND_S * 4)
        assert not self.thread.is_alive(), "slot holder still running"
        if self.error is not None:
            raise self.error


def hold_slots(client: Any, count: int, key: str = "s", limit: int = 2, lease_s: float = 30) -> list[Semaphore]:
    guards = []
    for _ in range(count):
        guard = Semaphore(client, table="locks", key=key, limit=limit, lease_duration=lease_s, wait_timeout=0)
        guard.__enter__()
        guards.append(guard)
    return guards


# ---- the store's steps -------------------------------------------------------------------------------
def test_a_put_on_any_slot_is_refused_while_a_live_waiter_is_ahead_in_the_semaphore_s_line(place):
    store = place.make().store
    assert store.shared_lines is True
    assert store.read_in_line("locks", SLOT1, "w-a", T, NO_USAGE, "s") == (None, True)  # free, and first
    assert store.read_in_line("locks", "s", "w-b", T, NO_USAGE, "s") == (None, False)  # free, but a's turn
    assert place.line("s") == ["w-a", "w-b"] and place.line(SLOT1) == []  # one line, on the semaphore's key
    assert store.put_in_turn("locks", SLOT1, "o1", "v1", 30_000, "", T, NO_USAGE, "s") is None  # no place
    assert store.put_in_turn("locks", SLOT1, "o1", "v1", 30_000, "w-b", T, NO_USAGE, "s") is None  # not first
    assert store.read("locks", SLOT1, T, NO_USAGE) is None
    assert store.put_in_turn("locks", SLOT1, "o1", "v1", 30_000, "w-a", T, NO_USAGE, "s") == 1  # its turn
    assert place.line("s") == ["w-b"]
    # A put that names no line of another key (an older client's, on its slot's own line) is not held back:
    # only the order of the waiters rests on the line, never the exclusion.
    assert store.put_if_absent("locks", "s#slot2", "o2", "v2", 30_000, T, NO_USAGE) == 1


def test_a_slot_s_release_wakes_the_head_of_the_line_and_its_put_wakes_the_next(place):
    client = place.make()
    store, feed = client.store, client.store.release_feed
    assert store.put_in_turn("locks", SLOT1, "o1", "v1", 30_000, "", T, NO_USAGE, "s") == 1  # nobody in line
    for waiter in ("w-a", "w-b"):
        row, turn = store.read_in_line("locks", SLOT1, waiter, T, NO_USAGE, "s")
        assert row.owner == "o1" and turn is False
    turns: list[tuple[str, str | None]] = []  # (whose, the key it was told is free)
    turned = {"a": threading.Event(), "b": threading.Event()}
    everyone = threading.Event()
    watches = [feed.watch("locks", "s", everyone.set, f"w-{name}",
                          lambda freed=None, name=name: (turns.append((name, freed)), turned[name].set()))
               for name in ("a", "b")]
    watches.append(feed.watch("locks", SLOT1, everyone.set))  # a watcher of the slot's own releases
    try:
        wait_until(lambda: place.subscribed(client, "s") and place.subscribed(client, SLOT1), BOUND_S,
                   "the subscriptions")
        assert store.free_in_line("locks", SLOT1, "o1", "s", T, NO_USAGE) == DELETED
        assert turned["a"].wait(BOUND_S) and turns == [("a", SLOT1)]  # the head alone, told the slot
        assert store.put_in_turn("locks", SLOT1, "o2", "v2", 30_000, "w-a", T, NO_USAGE, "s") == 2
        # Passed on, as another slot may be free too: which, the put does not know, and names none ("").
        assert turned["b"].wait(BOUND_S) and turns == [("a", SLOT1), ("b", "")]
        assert place.line("s") == ["w-b"] and not everyone.is_set()
        assert store.put_in_turn("locks", "s", "o3", "v3", 30_000, "w-b", T, NO_USAGE, "s") == 1
        assert place.line("s") == []
        assert store.free_in_line("locks", SLOT1, "o2", "s", T, NO_USAGE) == DELETED
        assert everyone.wait(BOUND_S)  # nobody in line: the release goes to every watcher of the slot
        assert len(turns) == 2
    finally:
        for watch in watches:
            feed.unwatch(watch)


def test_one_request_reads_every_slot_keeps_the_place_and_says_which_free_slot_is_the_waiter_s(place):
    store = place.make().store
    key = 'we"ird\\ke,y {x} é'  # quotes, a backslash, a comma, braces and a space: none may split the array
    keys = (key, f"{key}#slot1", f"{key}#slot2")  # its slots
    assert store.put_in_turn("locks", keys[0], "o0", "v0", 30_000, "", T, NO_USAGE, key) == 1
    rows, free = store.read_all_in_line("locks", keys, "w-a", T, NO_USAGE, key)
    assert [row and row.owner for row in rows] == ["o0", None, None] and free == 1  # first in line: its turn
    rows, free = store.read_all_in_line("locks", keys, "w-b", T, NO_USAGE, key)
    assert [row and row.owner for row in rows] == ["o0", None, None] and free == -1  # w-a is ahead
    assert place.line(key) == ["w-a", "w-b"]
    assert store.put_in_turn("locks", keys[1], "o1", "v1", 30_000, "w-a", T, NO_USAGE, key) == 1
    assert store.put_in_turn("locks", keys[2], "o2", "v2", 30_000, "w-b", T, NO_USAGE, key) == 1
    rows, free = store.read_all_in_line("locks", keys, "w-c", T, NO_USAGE, key)
    assert [row.owner for row in rows] == ["o0", "o1", "o2"] and free == -1  # all held
    assert rows[2].fence == 1 and rows[2].lease_ms == 30_000


# ---- semaphores that wait ----------------------------------------------------------------------------
def test_a_waiter_reads_every_slot_in_one_request_and_puts_where_a_release_says(place):
    holder, waiting = place.make(), place.make()
    held = hold_slots(holder, 8, limit=8)
    try:
        waiter = SlotHolder(waiting, limit=8)
        wait_until(lambda: place.line("s") != [] and place.subscribed(waiting, "s"), BOUND_S, "the waiter in line")
        held[5].__exit__(None, None, None)
        assert waiter.acquired.wait(BOUND_S)
        metrics = waiter.guard.metrics
        # A put on slot 0, one read of all 8 slots (and one more per poll, if any came), then the put on
        # slot 5, which the release named. Slot by slot it was a put and a read for each of the 8.
        assert waiter.guard.slot == 5 and metrics.write_requests == 2 and metrics.read_requests <= 3, metrics
        waiter.let_go()
    finally:
        for guard in held:
            if guard.is_valid():
                guard.__exit__(None, None, None)


def test_a_waiter_in_line_takes_over_a_slot_whose_holder_stopped(place):
    paused = place.make(clock=FakeClock())  # stops renewing: its clock stands
    held = hold_slots(paused, 2)
    taker = place.make(clock=FakeClock())  # waits a whole lease at once
    with Semaphore(taker, table="locks", key="s", limit=2, lease_duration=5, wait_timeout=120) as lease:
        assert lease.slot == 0 and lease.fencing_token == 2  # slot 0's row, seen unchanged for a lease
        assert lease.metrics.read_requests >= 2 and lease.metrics.write_requests == 2  # a put, the takeover
    assert place.line("s") == []
    with pytest.raises(LockLost):
        held[0].__exit__(None, None, None)
    held[1].__exit__(None, None, None)


def test_freed_slots_go_to_waiters_in_the_order_they_came_and_wake_only_the_first(place):
    holder = place.make()
    held = hold_slots(holder, 2)
    waiters: list[SlotHolder] = []
    try:
        for n in range(3):
            waiters.append(SlotHolder(place.make()))
            wait_until(lambda n=n: len(place.line("s")) == n + 1, BOUND_S, f"waiter {n} in line")
            client = waiters[n].client
            wait_until(lambda client=client: place.subscribed(client, "s"), BOUND_S, "its subscription")
        held[0].__exit__(None, None, None)
        assert waiters[0].acquired.wait(BOUND_S)
        # Nobody jumped the line, and the last waiter was never woken (without a line, every slot's release
        # woke every waiter, which read every slot). The second may have been: the put passes the turn on.
        assert not waiters[1].acquired.is_set() and not waiters[2].acquired.is_set()
        assert waiters[2].client.store.release_feed.delivered == 0
        held[1].__exit__(None, None, None)
        assert waiters[1].acquired.wait(BOUND_S) and not waiters[2].acquired.is_set()
        waiters[0].let_go()
        assert waiters[2].acquired.wait(BOUND_S)
        assert waiters[2].guard.slot == waiters[0].guard.slot != waiters[1].guard.slot
        assert place.line("s") == []
    finally:
        for waiter in waiters:
            waiter.let_go()
        for guard in held:
            if guard.is_valid():
                guard.__exit__(None, None, None)


def test_in_line_a_waiter_still_watches_the_other_slots_and_hears_a_stopped_holder_s_expire(redis_url, redis_db):
    paused = RedisClient(redis_url, clock=FakeClock())  # stops renewing: its slots run out on the server
    waiting = RedisClient(redis_url)
    try:
        held = hold_slots(paused, 2, lease_s=3)
        waiter = SlotHolder(waiting)
        feed = waiting.store.release_feed
        wait_until(lambda: feed.subscribed("locks", "s") and feed.subscribed("locks", SLOT1), BOUND_S,
                   "the waiter's watches of both slots")
        started = time.monotonic()
        remaining_s = max(redis_db.pttl(NodeLayout.lease("locks", key)) for key in ("s", SLOT1)) / 1000
        assert waiter.acquired.wait(BOUND_S)
        # At the expiry (the read set a wake-up for it on the slot's channel), not at the next poll in line,
        # which comes 187.5-562.5 ms apart with 3 s leases.
        assert time.monotonic() - started <= remaining_s + 0.15, remaining_s
        waiter.let_go()
        for guard in held:
            with pytest.raises(LockLost):
                guard.__exit__(None, None, None)
    finally:
        paused.close()
        waiting.close()


def test_a_try_does_not_take_a_free_slot_from_a_live_waiter_in_line(place):
    clients = (place.make(), place.make(wake_on_release=False))
    place.plant("s", "first")
    for client in clients:
        with pytest.raises(LockNotAcquired):
            Semaphore(client, table="locks", key="s", limit=2, wait_timeout=0).__enter__()
    assert place.line("s") == ["first"]


def test_a_wait_that_runs_out_gives_its_place_in_the_semaphore_s_line_up(place):
    holder = place.make()
    held = hold_slots(holder, 2)
    try:
        with pytest.raises(LockNotAcquired, match="no slot of semaphore 's'"):
            Semaphore(place.make(), table="locks", key="s", limit=2, lease_duration=5, wait_timeout=0.3).__enter__()
        assert place.line("s") == [] and place.line(SLOT1) == []
    finally:
        for guard in held:
            guard.__exit__(None, None, None)


def test_a_postgres_table_without_its_line_still_frees_and_puts_a_slot(make_client, admin):
    store = make_client(tables=("locks",)).store
    admin.execute(f"DROP TABLE {line_table('locks')}")  # as a lock table made by a version without the line
    assert store.put_in_turn("locks", SLOT1, "o1", "v1", 30_000, "w-a", T, NO_USAGE, "s") == 1
    rows, free = store.read_all_in_line("locks", ("s", SLOT1), "w-a", T, NO_USAGE, "s")
    assert rows[0] is None and rows[1].owner == "o1" and free == -1  # the rows alone: no turn is known
    assert store.free_in_line("locks", SLOT1, "o1", "s", T, NO_USAGE) == DELETED
    store.leave_line("locks", SLOT1, "w-a", T, "s")
    assert store._lineless == {"locks"}


def test_on_a_cluster_a_semaphore_keeps_no_line_and_every_release_wakes_its_waiters(redis_cluster_url,
                                                                                   redis_cluster_db):
    holder, first, second = (RedisClient(redis_cluster_url) for _ in range(3))
    try:
        assert holder.store.shared_lines is False
        held = hold_slots(holder, 2)
        waiters = [SlotHolder(first), SlotHolder(second)]
        for waiter in waiters:
            feed = waiter.client.store.release_feed
            wait_until(lambda feed=feed: feed.subscribed("locks", "s") and feed.subscribed("locks", SLOT1),
                       BOUND_S, "the waiter's watch of both slots")
        for guard in held:
            guard.__exit__(None, None, None)
        for waiter in waiters:
            assert waiter.acquired.wait(BOUND_S)
        lines = [holder.store.call(key, T, b"EXISTS", ClusterLayout.line("locks", key)) for key in ("s", SLOT1)]
        assert lines == [0, 0]
        for waiter in waiters:
            waiter.let_go()
    finally:
        for client in (holder, first, second):
            client.close()
