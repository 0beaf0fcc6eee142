"""The line of waiters on Redis and Redis Cluster (docs/protocol.md, "Waiting, polling and handoff"):
a waiter's read keeps its place, the store admits only the first live waiter to a free key, a release
wakes that waiter alone and in arrival order, a dead waiter's place is skipped once its deadline passes,
and a wait that ends gives its place up. Every test runs on one server and on the session's cluster."""

from __future__ import annotations

import threading
import time
from typing import Any, Iterator

import pytest

from fastlease import SyncDistributedLock
from fastlease.exceptions import LockLost, LockNotAcquired
from fastlease.redis import RedisClient
from fastlease.stores._release_feed import ListenerFeed, WatchedChannel
from fastlease.stores.base import HANDED_OVER, Record
from fastlease.stores.redis.cluster import ClusterLayout
from fastlease.stores.redis.scripts import ALIVE_MS, NodeLayout
from fastlease.testing import NO_USAGE, FakeClock
from helpers.lock_waiter import Waiter, come_back_after_a_handover, hand_over_between
from helpers.still_clock import StillClock
from helpers.waiting import wait_until

pytestmark = pytest.mark.server

T = 2.0  # timeout of a direct store request
BOUND_S = 10.0  # bound for every wait on another thread's state
#: The longest sleep of a waiter in line between its reads (POLL_IN_LINE_MS, jittered up to 150%).
LONGEST_POLL_S = 0.5625


class Where:
    """One deployment: how to make a client and where its keys of ``key`` live."""

    def __init__(self, url: str, layout: Any) -> None:
        self.url, self.layout = url, layout
        self.made: list[RedisClient] = []

    def client(self, **kwargs: Any) -> RedisClient:
        client = RedisClient(self.url, **kwargs)
        self.made.append(client)
        return client

    def raw(self, client: RedisClient, key: str, *command: Any) -> Any:
        """One command on the node that serves ``key`` (the store routes it by the key's slot)."""
        return client.store.call(key, T, *command)

    def line(self, client: RedisClient, key: str) -> list[bytes]:
        """The ids in ``key``'s line, those of ``client``'s waiters without its token (as the engine knows them)."""
        own = client.store.client_token.encode() + b"~"
        ids = self.raw(client, key, b"ZRANGE", self.layout.line("locks", key), 0, -1)
        return [waiter.removeprefix(own) for waiter in ids]

    def server_ms(self, client: RedisClient, key: str) -> int:
        seconds, micros = self.raw(client, key, b"TIME")
        return int(seconds) * 1000 + int(micros) // 1000

    def add_waiter(self, client: RedisClient, key: str, waiter: str, alive_for_ms: int, score: int = 0) -> None:
        """Put ``waiter`` in ``key``'s line as a waiter that read last and then stopped: first (score 0),
        alive ``alive_for_ms`` more (negative: already dead), as ``client``'s."""
        waiter = client.store.line_id(waiter)
        self.raw(client, key, b"ZADD", self.layout.line("locks", key), score, waiter)
        self.raw(client, key, b"HSET", self.layout.alive("locks", key), waiter,
                 self.server_ms(client, key) + alive_for_ms)


@pytest.fixture(params=["node", "cluster"])
def where(request: pytest.FixtureRequest) -> Iterator[Where]:
    if request.param == "node":
        request.getfixturevalue("redis_db")  # emptied
        place = Where(request.getfixturevalue("redis_url"), NodeLayout)
    else:
        request.getfixturevalue("redis_cluster_db")  # emptied
        place = Where(request.getfixturevalue("redis_cluster_url"), ClusterLayout)
    yield place
    for client in place.made:
        client.close()


def hold(client: RedisClient, key: str) -> SyncDistributedLock:
    guard = SyncDistributedLock(client, table="locks", key=key, lease_duration=30)
    guard.__enter__()
    return guard


# ---- the store's steps -------------------------------------------------------------------------------
def test_a_read_in_line_keeps_a_place_and_says_whose_turn_it_is(where):
    client = where.client()
    store = client.store
    assert store.read_in_line("locks", "k", "w-a", T, NO_USAGE) == (None, True)  # free, and first
    assert store.read_in_line("locks", "k", "w-b", T, NO_USAGE) == (None, False)  # free, but a's turn
    assert store.read_in_line("locks", "k", "w-a", T, NO_USAGE) == (None, True)  # a keeps its place
    assert where.line(client, "k") == [b"w-a", b"w-b"]
    deadline = int(where.raw(client, "k", b"HGET", where.layout.alive("locks", "k"), store.line_id("w-b")))
    assert 0 < deadline - where.server_ms(client, "k") <= ALIVE_MS
    guard = hold(client, "k")
    try:
        row, turn = store.read_in_line("locks", "k", "w-a", T, NO_USAGE)
        assert row is not None and row.owner == guard.owner and turn is False  # held: nobody's turn
    finally:
        guard.__exit__(None, None, None)


def test_only_the_first_live_waiter_may_take_a_free_key_and_it_leaves_the_line(where):
    client = where.client()
    store = client.store
    where.add_waiter(client, "k", "ghost", alive_for_ms=60_000)
    assert store.put_if_absent("locks", "k", "o1", "v1", 30_000, T, NO_USAGE) is None  # no place in line
    assert store.put_in_turn("locks", "k", "o1", "v1", 30_000, "second", T, NO_USAGE) is None  # not first
    assert store.read("locks", "k", T, NO_USAGE) is None
    assert store.put_in_turn("locks", "k", "o1", "v1", 30_000, "ghost", T, NO_USAGE) == 1  # its turn
    assert where.line(client, "k") == []
    assert store.read("locks", "k", T, NO_USAGE).owner == "o1"


def test_a_waiter_past_its_deadline_loses_its_place(where):
    client = where.client()
    where.add_waiter(client, "k", "dead", alive_for_ms=-1)
    where.add_waiter(client, "k", "alive", alive_for_ms=60_000, score=1)
    assert client.store.put_if_absent("locks", "k", "o1", "v1", 30_000, T, NO_USAGE) is None  # alive is first now
    assert where.line(client, "k") == [b"alive"]  # the dead one dropped on the way
    where.add_waiter(client, "k", "alive", alive_for_ms=-1)
    assert client.store.put_if_absent("locks", "k", "o1", "v1", 30_000, T, NO_USAGE) == 1
    assert where.line(client, "k") == []


def test_an_idempotent_call_s_completion_deletes_the_line(where):
    client = where.client()
    guard = hold(client, "k")
    client.store.read_in_line("locks", "k", "w-a", T, NO_USAGE)
    completion = Record("COMPLETED", "f", b"r", 0, guard.owner)
    assert client.store.finish_if_owner("locks", "k", "records", completion, 0, T) is True
    assert where.line(client, "k") == []
    assert where.raw(client, "k", b"EXISTS", where.layout.alive("locks", "k")) == 0


def test_leaving_the_line_with_the_turn_hands_it_to_the_next_waiter(where):
    client = where.client()
    store, feed = client.store, client.store.release_feed
    store.read_in_line("locks", "k", "w-a", T, NO_USAGE)
    store.read_in_line("locks", "k", "w-b", T, NO_USAGE)
    turns: list[str] = []
    woken = threading.Event()
    watch_a = feed.watch("locks", "k", woken.set, "w-a", lambda: turns.append("a"))
    watch_b = feed.watch("locks", "k", woken.set, "w-b", lambda: (turns.append("b"), woken.set()))
    try:
        wait_until(lambda: feed.subscribed("locks", "k"), BOUND_S, "the subscription")
        store.leave_line("locks", "k", "w-a", T)
        assert woken.wait(BOUND_S)
        assert turns == ["b"] and where.line(client, "k") == [b"w-b"]
    finally:
        feed.unwatch(watch_a)
        feed.unwatch(watch_b)


def watch_turns(client: RedisClient, waiter: str) -> tuple[threading.Event, Any]:
    """Watch "k" as ``waiter`` of ``client`` would, once subscribed: an event set by its turn, and the watch."""
    feed, told = client.store.release_feed, threading.Event()
    watch = feed.watch("locks", "k", lambda: None, waiter, told.set)
    wait_until(lambda: feed.subscribed("locks", "k"), BOUND_S, "the subscriptions")
    return told, watch


def test_a_turn_is_read_only_by_the_client_whose_waiter_it_names(where):
    holder, first, second = where.client(), where.client(), where.client()
    assert holder.store.put_if_absent("locks", "k", "o1", "v1", 30_000, T, NO_USAGE) == 1
    first.store.read_in_line("locks", "k", "w-a", T, NO_USAGE)
    second.store.read_in_line("locks", "k", "w-b", T, NO_USAGE)
    (told_a, watch_a), (told_b, watch_b) = watch_turns(first, "w-a"), watch_turns(second, "w-b")
    feed_a, feed_b = first.store.release_feed, second.store.release_feed
    read_a, read_b = feed_a.received, feed_b.received
    try:
        holder.store.delete_if_owner("locks", "k", "o1", T, NO_USAGE)  # w-a's turn, on its client's channel
        assert told_a.wait(BOUND_S) and feed_a.received == read_a + 1
        assert first.store.put_in_turn("locks", "k", "o2", "v2", 30_000, "w-a", T, NO_USAGE) == 2
        first.store.delete_if_owner("locks", "k", "o2", T, NO_USAGE)  # w-b's turn
        # One connection delivers in order: had the second client read the first turn, it would count two.
        assert told_b.wait(BOUND_S) and feed_b.received == read_b + 1
    finally:
        feed_a.unwatch(watch_a)
        feed_b.unwatch(watch_b)


def test_a_waiter_id_without_a_client_token_has_its_turn_on_the_key_s_channel(where):
    # A waiter of an earlier version (its id has no "<token>~") is first in line; a client of this version
    # watches the key with no waiter in line, so it listens on the key's channel alone.
    holder, watcher = where.client(), where.client()
    assert holder.store.put_if_absent("locks", "k", "o1", "v1", 30_000, T, NO_USAGE) == 1
    where.raw(holder, "k", b"ZADD", where.layout.line("locks", "k"), 0, "old-waiter")
    where.raw(holder, "k", b"HSET", where.layout.alive("locks", "k"), "old-waiter",
              where.server_ms(holder, "k") + 60_000)
    feed = watcher.store.release_feed
    watch = feed.watch("locks", "k", lambda: None)
    try:
        wait_until(lambda: feed.subscribed("locks", "k"), BOUND_S, "the subscription")
        received = feed.received
        holder.store.delete_if_owner("locks", "k", "o1", T, NO_USAGE)
        wait_until(lambda: feed.received == received + 1, BOUND_S, "the turn, on the key's channel")
    finally:
        feed.unwatch(watch)


def test_a_turn_published_on_the_key_s_channel_by_an_earlier_version_still_reaches_its_waiter(where):
    client = where.client()
    told, watch = watch_turns(client, "w-a")
    publish = b"PUBLISH" if where.layout is NodeLayout else b"SPUBLISH"
    try:
        where.raw(client, "k", publish, where.layout.channel("locks", "k"), client.store.line_id("w-a"))
        assert told.wait(BOUND_S)
    finally:
        client.store.release_feed.unwatch(watch)


def test_a_message_wakes_the_waiter_it_names_and_one_without_a_name_wakes_all():
    feed, channel = ListenerFeed(), WatchedChannel()
    channel.watchers = {1: "wake-1", 2: "wake-2"}
    channel.turns = {b"w-1": "turn-1"}
    assert feed.wakes_for(channel, b"w-1") == ["turn-1"]
    assert feed.wakes_for(channel, b"w-elsewhere") == []  # another process's waiter: nobody here
    assert feed.wakes_for(channel, b"1") == ["wake-1", "wake-2"]


# ---- the handover of a released lease to the head of its line ------------------------------------------
OFFER = ("o-a", "v-a", 30_000, 1_500)  # owner, version, lease_ms, and the PX of a lease handed over


def turns_of(feed: Any, waiter: str) -> tuple[list[Any], threading.Event, Any]:
    """Watch the key "k" as ``waiter`` would: what each turn message that names it said, and an event set by it."""
    said: list[Any] = []
    told = threading.Event()
    watch = feed.watch("locks", "k", lambda: None, waiter, lambda freed=None: (said.append(freed), told.set()))
    wait_until(lambda: feed.subscribed("locks", "k"), BOUND_S, "the subscription")
    return said, told, watch


def held_with_an_offer(where: Where, offer: tuple[str, str, int, int]) -> tuple[RedisClient, Any, Any]:
    """A client, its store and feed, with "k" held by "o1" and waiter "w-a" first in line with ``offer``."""
    client = where.client()
    store = client.store
    assert store.put_if_absent("locks", "k", "o1", "v1", 30_000, T, NO_USAGE) == 1
    row, turn = store.read_in_line("locks", "k", "w-a", T, NO_USAGE, None, offer)
    assert row.owner == "o1" and turn is False
    return client, store, store.release_feed


def test_a_release_hands_the_lease_over_to_the_head_of_the_line_in_the_owner_its_read_offered(where):
    client, store, feed = held_with_an_offer(where, OFFER)
    store.read_in_line("locks", "k", "w-b", T, NO_USAGE)  # behind it, without an offer
    said, told, watch = turns_of(feed, "w-a")
    try:
        assert store.delete_if_owner("locks", "k", "o1", T, NO_USAGE) == HANDED_OVER
        row = store.read("locks", "k", T, NO_USAGE)
        assert (row.owner, row.version, row.lease_ms, row.fence) == ("o-a", "v-a", 30_000, 2)
        # The PX of the handover, not the lease's own: a waiter that died in line holds the key 1.5 s at most.
        assert 0 < where.raw(client, "k", b"PTTL", where.layout.lease("locks", "k")) <= 1_500
        assert where.line(client, "k") == [b"w-b"]  # taken out of the line, its offer gone
        assert where.raw(client, "k", b"HGET", where.layout.alive("locks", "k"), store.line_id("w-a offer")) is None
        assert told.wait(BOUND_S) and said == ["=v-a 2"]
        # Its next read (a message lost, say) sees the lease in its owner, and does not join the line again.
        row, turn = store.read_in_line("locks", "k", "w-a", T, NO_USAGE, None, ("o-a", "v-a2", 30_000, 1_500))
        assert row.version == "v-a" and turn is False and where.line(client, "k") == [b"w-b"]
    finally:
        feed.unwatch(watch)


def test_an_offer_older_than_a_third_of_its_px_is_not_taken_and_the_waiter_is_woken_to_write(where):
    client, store, feed = held_with_an_offer(where, ("o-a", "v-a", 30_000, 3))  # stale after 1 ms
    written = where.server_ms(client, "k")
    wait_until(lambda: where.server_ms(client, "k") >= written + 3, BOUND_S, "3 ms on the server's clock")
    said, told, watch = turns_of(feed, "w-a")
    try:
        assert store.delete_if_owner("locks", "k", "o1", T, NO_USAGE) == 1
        assert store.read("locks", "k", T, NO_USAGE) is None
        assert told.wait(BOUND_S) and said == [None]  # its turn, to write itself
        assert where.line(client, "k") == [b"w-a"]
    finally:
        feed.unwatch(watch)


def test_a_waiter_that_leaves_deletes_a_lease_handed_over_to_it_meanwhile_and_wakes_the_next(where):
    client, store, feed = held_with_an_offer(where, OFFER)
    store.read_in_line("locks", "k", "w-b", T, NO_USAGE)
    assert store.delete_if_owner("locks", "k", "o1", T, NO_USAGE) == HANDED_OVER  # handed over to w-a, which has gone
    said, told, watch = turns_of(feed, "w-b")
    try:
        store.leave_line("locks", "k", "w-a", T, None, "o-a")
        assert store.read("locks", "k", T, NO_USAGE) is None
        assert told.wait(BOUND_S) and said == [None] and where.line(client, "k") == [b"w-b"]
        store.leave_line("locks", "k", "w-b", T, None, "o-b")  # nothing handed over to it: nothing deleted
        assert store.put_if_absent("locks", "k", "o2", "v2", 30_000, T, NO_USAGE) == 3
        store.leave_line("locks", "k", "w-c", T, None, "o-c")
        assert store.read("locks", "k", T, NO_USAGE).owner == "o2"
    finally:
        feed.unwatch(watch)


def test_a_lease_handed_over_is_held_without_a_write_valid_from_before_the_read_that_offered(where):
    """The waiter's clock moves only when the test moves it, and so do its renewals: the validity it holds
    the handed lease with is the handover's 1.5 s (times 0.9) counted from the stamp before its read, not
    the lease's 30 s, and its first renewal, which sets the lease, comes 250 ms after that stamp, not at
    once (a hold shorter than that writes nothing more)."""
    holder, clock = where.client(), StillClock()
    taker = where.client(clock=clock)
    guard = hold(holder, "k")
    lease = SyncDistributedLock(taker, table="locks", key="k", lease_duration=30, wait_timeout=3_600)
    thread = threading.Thread(target=lease.__enter__, daemon=True)
    thread.start()
    wait_until(lambda: where.line(holder, "k") != [], BOUND_S, "the waiter's place in line")
    guard.__exit__(None, None, None)
    thread.join(BOUND_S)
    assert not thread.is_alive() and lease.is_valid()
    # Its one write was its first attempt's put, refused (the key was held): the handover needed none.
    assert lease.fencing_token == guard.fencing_token + 1 and lease.metrics.write_requests == 1
    stamp_ns = clock.monotonic_ns()  # the clock has not moved since the read that left the offer
    assert lease._lease.valid_until_ns() - stamp_ns == 1_350_000_000
    assert 0 < where.raw(holder, "k", b"PTTL", where.layout.lease("locks", "k")) <= 1_500
    clock.advance(0.249)
    assert lease._lease.valid_until_ns() - stamp_ns == 1_350_000_000 and lease.metrics.write_requests == 1
    clock.advance(0.001)  # the first renewal is due now
    assert lease._lease.valid_until_ns() - stamp_ns == 250_000_000 + 27_000_000_000
    assert lease.metrics.write_requests == 2
    assert where.raw(holder, "k", b"PTTL", where.layout.lease("locks", "k")) > 1_500
    lease.__exit__(None, None, None)


def test_a_client_that_handed_the_key_over_reads_before_it_writes_when_it_comes_back(where):
    first, second = where.client(), where.client()
    come_back_after_a_handover(first, second, lambda: where.line(first, "k"))


def test_a_client_that_handed_the_key_over_to_a_holder_that_has_gone_reads_then_puts(where):
    first, second = where.client(), where.client()
    hand_over_between(first, second, lambda: where.line(first, "k")).__exit__(None, None, None)
    back = hold(first, "k")  # its read finds the key free, and the turn its own: then its put
    assert (back.metrics.read_requests, back.metrics.write_requests) == (1, 1) and back.is_valid()
    back.__exit__(None, None, None)


# ---- leases that wait --------------------------------------------------------------------------------
def test_releases_hand_the_key_to_waiters_in_the_order_they_came_each_woken_once(where):
    holder = where.client()
    guard = hold(holder, "k")
    waiters, clients = [], []
    try:
        for n in range(3):
            client = where.client()
            clients.append(client)
            waiters.append(Waiter(client, "k", wait_s=BOUND_S, lease_s=5))
            wait_until(lambda n=n: len(where.line(holder, "k")) == n + 1, BOUND_S, f"waiter {n} in line")
            feed = client.store.release_feed
            wait_until(lambda feed=feed: feed.subscribed("locks", "k"), BOUND_S, "its subscription")
    finally:
        guard.__exit__(None, None, None)
    for waiter in waiters:
        waiter.join()
    order = sorted(range(3), key=lambda n: waiters[n].acquired_at)
    assert order == [0, 1, 2]
    # Each release woke one waiter: the one whose turn it was (without a line every release wakes all, and
    # the last waiter would be woken three times). A waiter whose own poll found its turn first is not woken.
    delivered = [client.store.release_feed.delivered for client in clients]
    assert all(count <= 1 for count in delivered) and sum(delivered) >= 2, delivered
    assert where.line(holder, "k") == []


def test_a_dead_waiter_first_in_line_is_skipped_once_its_deadline_passes(where):
    holder, client = where.client(), where.client()
    guard = hold(holder, "k")
    alive_for_ms = 500
    where.add_waiter(holder, "k", "dead", alive_for_ms=alive_for_ms)  # read last just now, then died
    dead_until = time.monotonic() + alive_for_ms / 1000
    waiter = Waiter(client, "k", wait_s=BOUND_S, lease_s=5)
    wait_until(lambda: len(where.line(holder, "k")) == 2, BOUND_S, "the waiter behind the dead one")
    guard.__exit__(None, None, None)  # the turn goes to the dead waiter: nobody is woken
    waiter.join()
    # Not before the dead waiter's place lapsed (the line is kept), and within a poll after it.
    assert dead_until - 0.05 <= waiter.acquired_at <= dead_until + LONGEST_POLL_S + 1.0
    assert where.line(holder, "k") == []


def test_a_lease_handed_over_to_a_waiter_that_died_in_line_expires_with_the_handover_s_px(where):
    """A waiter that offered, then died, is handed the lease: the key is held for the handover's 1.5 s (as
    its place in line would have held up the line), not for the lease's 30 s, and the next waiter takes it
    at that expiry (woken by its read's PTTL), not a poll later."""
    holder, client = where.client(), where.client()
    guard = hold(holder, "k")
    holder.store.read_in_line("locks", "k", "dead", T, NO_USAGE, None, OFFER)  # its last read, then it died
    waiter = Waiter(client, "k", wait_s=BOUND_S, lease_s=5)
    wait_until(lambda: len(where.line(holder, "k")) == 2, BOUND_S, "the waiter behind the dead one")
    released_at = time.monotonic()
    guard.__exit__(None, None, None)  # hands the lease over to the dead waiter
    waiter.join()
    assert holder.store.read("locks", "k", T, NO_USAGE) is None  # (the waiter released it in turn)
    assert waiter.token == guard.fencing_token + 2  # the handover's token, then its own
    expired_at = released_at + OFFER[3] / 1000
    assert expired_at - 0.05 <= waiter.acquired_at <= expired_at + LONGEST_POLL_S + 1.0


def test_a_waiter_that_takes_over_leaves_the_line(where):
    # ACQUIRE in turn leaves the line in its own script; a takeover must leave it apart, or its place would
    # be the head that its own release names, and the next waiter would wait for it to lapse.
    paused = where.client(clock=FakeClock())  # stops renewing: its clock stands
    taker, after = where.client(clock=FakeClock()), where.client()
    guard = hold(paused, "k")
    with SyncDistributedLock(taker, table="locks", key="k", lease_duration=5, wait_timeout=60) as lease:
        assert lease.fencing_token == 2 and where.line(taker, "k") == []  # took over, and left its place
        waiter = Waiter(after, "k", wait_s=BOUND_S, lease_s=5)
        wait_until(lambda: where.line(taker, "k") != [] and after.store.release_feed.subscribed("locks", "k"),
                   BOUND_S, "the next waiter in line")
    waiter.join()
    assert waiter.token == 3 and after.store.release_feed.delivered == 1  # woken by the release: its turn
    with pytest.raises(LockLost):
        guard.__exit__(None, None, None)


def test_a_wait_that_runs_out_gives_its_place_up(where):
    holder, client = where.client(), where.client()
    guard = hold(holder, "k")
    try:
        with pytest.raises(LockNotAcquired):
            SyncDistributedLock(client, table="locks", key="k", lease_duration=5, wait_timeout=0.3).__enter__()
        assert where.line(holder, "k") == []
    finally:
        guard.__exit__(None, None, None)


def test_a_client_without_wake_ups_keeps_no_place_and_waits_for_the_line(where):
    """``wake_on_release=False`` joins no line: while a live waiter is first, it cannot take the free key."""
    holder, polling = where.client(), where.client(wake_on_release=False)
    where.add_waiter(holder, "k", "first", alive_for_ms=60_000)
    with pytest.raises(LockNotAcquired):
        SyncDistributedLock(polling, table="locks", key="k", lease_duration=5, wait_timeout=0.3).__enter__()
    assert where.line(holder, "k") == [b"first"]


def test_without_a_confirmed_subscription_a_waiter_in_line_polls_at_the_usual_interval(redis_url, redis_db):
    """A feed that never confirms its watch (here an ACL that refuses SUBSCRIBE; a Redis Cluster without
    sharded pub/sub alike) delivers no turn: the waiter keeps its place but polls every 62.5-187.5 ms, as
    without a line, not at the line's 187.5-562.5 ms, so its turn is not left waiting for a slow poll."""
    redis_db.execute_command("ACL", "SETUSER", "no-subscribe", "on", ">pw", "~*", "&*", "+@all", "-subscribe")
    url = redis_url.replace("redis://", "redis://no-subscribe:pw@")
    holder, client = RedisClient(redis_url), RedisClient(url)
    try:
        guard = hold(holder, "k")
        lease = SyncDistributedLock(client, table="locks", key="k", lease_duration=5, wait_timeout=BOUND_S)
        thread = threading.Thread(target=lease.__enter__, daemon=True)
        thread.start()
        wait_until(lambda: holder.store.call("k", T, b"ZCARD", NodeLayout.line("locks", "k")) == 1, BOUND_S,
                   "the waiter's place in line")
        time.sleep(2.0)  # the span whose polls are counted: not a synchronisation
        guard.__exit__(None, None, None)
        thread.join(BOUND_S)
        assert lease.is_valid()
        # 2 s of polls at most 187.5 ms apart: at least 10 reads (at the line's interval, 5 on average).
        assert lease.metrics.read_requests >= 10, lease.metrics
        # The release handed the lease over, and with no message to say so the waiter's next read found it in
        # its own owner: no write but its first attempt's refused put.
        assert lease.metrics.write_requests == 1 and lease.fencing_token == guard.fencing_token + 1, lease.metrics
        assert not client.store.release_feed.subscribed("locks", "k")
        lease.__exit__(None, None, None)
    finally:
        holder.close()
        client.close()
