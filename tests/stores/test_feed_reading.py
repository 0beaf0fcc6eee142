"""A waiting thread in a key's line reads the release feed itself (``ListenerFeed.wait_reading``): the
message that gives it its turn is read and acted on by that thread, without the listener thread's
wake-up of it; the listener gives its connection up when a waiting thread would read and takes it back
when none does; several waiting threads of one client share it; a connection lost by a reading thread
is made again by the listener. On one Redis server, the session's Redis Cluster and PostgreSQL."""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterator

import pytest

from fastlease import SyncDistributedLock
from fastlease.exceptions import LockNotAcquired
from fastlease.redis import RedisClient
from fastlease.stores import _release_feed
from fastlease.stores.postgres import feed as postgres_feed
from fastlease.stores.redis import cluster_feed
from fastlease.stores.redis import feed as redis_feed
from fastlease.testing import NO_USAGE
from helpers.waiting import wait_until

pytestmark = pytest.mark.server

T = 2.0  # timeout of a direct store request
BOUND_S = 10.0  # bound for every wait on another thread's state


@pytest.fixture(params=["redis", "redis-cluster", "postgres"])
def client(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "postgres":
        yield request.getfixturevalue("make_client")("fl-reader", tables=("locks",))
        return
    url = "redis_url" if request.param == "redis" else "redis_cluster_url"
    request.getfixturevalue("redis_db" if request.param == "redis" else "redis_cluster_db")  # emptied
    made = RedisClient(request.getfixturevalue(url))
    yield made
    made.close()


def hold(client: Any, key: str) -> SyncDistributedLock:
    guard = SyncDistributedLock(client, table="locks", key=key, lease_duration=30)
    guard.__enter__()
    return guard


def on_thread(target: Callable[[], Any]) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def in_line(client: Any, key: str, waiter: str, ran_on: list[str], ticket: threading.Event) -> Any:
    """Put ``waiter`` in ``key``'s line and watch for its turn, which records the thread it ran on."""
    client.store.read_in_line("locks", key, waiter, T, NO_USAGE)
    watch = client.store.release_feed.watch("locks", key, lambda: None, waiter,
                                            lambda: (ran_on.append(threading.current_thread().name), ticket.set()))
    wait_until(watch.ready.is_set, BOUND_S, "the subscription")
    return watch


def test_a_waiting_thread_reads_the_message_of_its_turn_itself(client):
    feed, me = client.store.release_feed, threading.get_ident()
    guard = hold(client, "k")
    ran_on: list[str] = []
    ticket = threading.Event()
    watch = in_line(client, "k", "w-a", ran_on, ticket)

    def release_once_we_read() -> None:
        wait_until(lambda: feed.reading_thread == me, BOUND_S, "the waiting thread to read in the listener's stead")
        guard.__exit__(None, None, None)

    releaser = on_thread(release_once_we_read)
    try:
        assert feed.wait_reading(ticket, BOUND_S) is True
        assert ran_on == [threading.current_thread().name]  # not the listener's thread
        assert feed.reading_thread is None
    finally:
        releaser.join(BOUND_S)
        feed.unwatch(watch)


def test_the_listener_reads_again_once_no_thread_waits_reading(client):
    feed = client.store.release_feed
    guard = hold(client, "k")
    ran_on: list[str] = []
    ticket = threading.Event()
    watch = in_line(client, "k", "w-a", ran_on, ticket)
    try:
        assert feed.wait_reading(ticket, 0.05) is False  # nothing came: a tick or five of reading, then back
        assert feed.reading_thread is None
        guard.__exit__(None, None, None)
        assert ticket.wait(BOUND_S)
        assert ran_on == [feed.thread_name]
    finally:
        feed.unwatch(watch)


def test_two_waiting_threads_of_one_client_each_get_their_turn(client):
    store, feed = client.store, client.store.release_feed
    guard = hold(client, "k")
    ran_on: dict[str, list[str]] = {"w-a": [], "w-b": []}
    tickets = {"w-a": threading.Event(), "w-b": threading.Event()}
    watches = [in_line(client, "k", waiter, ran_on[waiter], tickets[waiter]) for waiter in ("w-a", "w-b")]
    outcome: dict[str, bool] = {}
    waiting = [on_thread(lambda waiter=waiter: outcome.__setitem__(waiter, feed.wait_reading(tickets[waiter],
                                                                                              BOUND_S)))
               for waiter in ("w-a", "w-b")]
    try:
        wait_until(lambda: feed.reading_thread is not None, BOUND_S, "a waiting thread to read")
        guard.__exit__(None, None, None)  # w-a's turn
        assert tickets["w-a"].wait(BOUND_S) and not tickets["w-b"].is_set()
        store.leave_line("locks", "k", "w-a", T)  # w-a passes its turn on
        assert tickets["w-b"].wait(BOUND_S)
        for thread in waiting:
            thread.join(BOUND_S)
        assert outcome == {"w-a": True, "w-b": True}
        assert len(ran_on["w-a"]) == 1 and len(ran_on["w-b"]) == 1
    finally:
        for watch in watches:
            feed.unwatch(watch)


def subscribers(store: Any, key: str) -> list[bytes]:
    """The ids of the clients subscribed to anything (sharded or not) on the node that serves ``key``."""
    listing = store.call(key, T, b"CLIENT", b"LIST")
    fields = [dict(field.split(b"=", 1) for field in line.split() if b"=" in field)
              for line in (listing if isinstance(listing, bytes) else listing.encode()).splitlines()]
    return [entry[b"id"] for entry in fields if entry.get(b"sub", b"0") != b"0" or entry.get(b"ssub", b"0") != b"0"]


@pytest.mark.parametrize("client", ["redis", "redis-cluster"], indirect=True)
def test_a_connection_lost_while_a_waiting_thread_reads_is_made_again_by_the_listener(client):
    store, feed, me = client.store, client.store.release_feed, threading.get_ident()
    guard = hold(client, "k")
    ran_on: list[str] = []
    ticket = threading.Event()
    watch = in_line(client, "k", "w-a", ran_on, ticket)
    killed: list[int] = []

    def kill_then_release() -> None:
        wait_until(lambda: feed.reading_thread == me, BOUND_S, "the waiting thread to read")
        (first,) = subscribers(store, "k")
        killed.append(store.call("k", T, b"CLIENT", b"KILL", b"ID", first))
        wait_until(lambda: subscribers(store, "k") not in ([], [first]), BOUND_S, "a new subscription")
        wait_until(watch.ready.is_set, BOUND_S, "the server to confirm it")
        store.read_in_line("locks", "k", "w-a", T, NO_USAGE)  # (the wait polls meanwhile in the engine)
        guard.__exit__(None, None, None)

    releaser = on_thread(kill_then_release)
    try:
        assert feed.wait_reading(ticket, BOUND_S) is True
        releaser.join(BOUND_S)
        assert killed == [1] and len(ran_on) == 1
    finally:
        feed.unwatch(watch)


def test_a_waiter_cancelled_while_it_reads_the_feed_stops_within_a_tick_or_two(client):
    feed = client.store.release_feed
    guard = hold(client, "k")
    waiter = SyncDistributedLock(client, table="locks", key="k", lease_duration=30, wait_timeout=60)
    outcome: list[BaseException] = []

    def wait() -> None:
        try:
            waiter.__enter__()
        except LockNotAcquired as error:
            outcome.append(error)

    waiting = on_thread(wait)
    try:
        wait_until(lambda: feed.reading_thread == waiting.ident, BOUND_S, "the waiting thread to read the feed")
        waiter.cancel()
        waiting.join(BOUND_S)  # (its wait is 60 s: only the cancellation ends it within the bound)
        assert not waiting.is_alive() and len(outcome) == 1
    finally:
        guard.__exit__(None, None, None)


class Interrupted(BaseException):
    """Stands for KeyboardInterrupt, raised on the waiting thread while it reads."""


@pytest.mark.parametrize("client", ["redis"], indirect=True)
def test_an_interrupt_while_a_waiting_thread_reads_closes_the_connection_and_the_listener_makes_another(client):
    store, feed, me = client.store, client.store.release_feed, threading.get_ident()
    guard = hold(client, "k")

    def interrupt() -> None:
        raise Interrupted

    store.read_in_line("locks", "k", "w-a", T, NO_USAGE)
    watch = feed.watch("locks", "k", lambda: None, "w-a", interrupt)
    wait_until(watch.ready.is_set, BOUND_S, "the subscription")
    (first,) = subscribers(store, "k")

    def release_once_we_read() -> None:
        wait_until(lambda: feed.reading_thread == me, BOUND_S, "the waiting thread to read")
        guard.__exit__(None, None, None)

    releaser = on_thread(release_once_we_read)
    try:
        with pytest.raises(Interrupted):
            feed.wait_reading(threading.Event(), BOUND_S)
        releaser.join(BOUND_S)
        wait_until(lambda: subscribers(store, "k") not in ([], [first]), BOUND_S, "the listener's new subscription")
    finally:
        feed.unwatch(watch)


def test_a_listener_that_exits_idle_closes_its_connection_and_the_next_wait_starts_another(client, monkeypatch):
    for module in (redis_feed, cluster_feed, postgres_feed):
        monkeypatch.setattr(module, "LINGER_S", 0.0)
    monkeypatch.setattr(_release_feed, "LISTENER_IDLE_EXIT_S", 0.05)
    feed = client.store.release_feed
    watch = feed.watch("locks", "k", lambda: None)
    wait_until(watch.ready.is_set, BOUND_S, "the subscription")
    first = feed._thread
    feed.unwatch(watch)
    wait_until(lambda: not first.is_alive(), BOUND_S, "the idle listener to exit")
    assert feed._connection is None and feed._poke is None
    # The next wait in line starts another listener, which reads until a thread waits reading, as before.
    guard = hold(client, "k")
    ran_on: list[str] = []
    ticket = threading.Event()
    watch = in_line(client, "k", "w-a", ran_on, ticket)
    try:
        assert feed._thread is not first and feed._poke is not None
        guard.__exit__(None, None, None)
        assert ticket.wait(BOUND_S) and ran_on == [feed.thread_name]
    finally:
        feed.unwatch(watch)


def test_a_message_that_names_another_waiter_is_read_but_wakes_nobody(client):
    store, feed = client.store, client.store.release_feed
    guard = hold(client, "k")
    store.read_in_line("locks", "k", "w-x", T, NO_USAGE)  # first in line: a waiter this client does not watch for
    ran_on: list[str] = []
    ticket = threading.Event()
    watch = in_line(client, "k", "w-a", ran_on, ticket)
    try:
        received, delivered = feed.received, feed.delivered
        guard.__exit__(None, None, None)  # w-x's turn
        wait_until(lambda: feed.received > received, BOUND_S, "the release's message")
        assert feed.delivered == delivered and not ticket.is_set() and ran_on == []
    finally:
        feed.unwatch(watch)
