"""The PostgreSQL release feed on a real server: a release notifies its table's channel, a waiting
client LISTENs and wakes its waiter at once, a lost notification only leaves the waiter to its poll,
the listener LISTENs again on a new connection after its own is terminated, and
``wake_on_release=False`` listens to nothing.

Each client gets its own ``application_name``, so its connections (the listener's among them) are
found in ``pg_stat_activity``. Waits for another thread's or the server's state poll it, bounded.
"""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from fastlease import PostgresClient, SyncDistributedLock
from fastlease.stores.postgres.feed import release_channel
from helpers.waiting import wait_until

BOUND_S = 20.0
LOCKS = ("locks",)  # the lock table each client of these tests creates


def listener_backends(admin: psycopg.Connection, app: str) -> list[int]:
    """The backends of ``app`` whose last statement was a LISTEN: the feed's connection."""
    rows = admin.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s AND query LIKE 'LISTEN %%'",
                         (app,))
    return [pid for (pid,) in rows]


class Waiter:
    """A thread that acquires ``key`` on ``client`` and records its fencing token (or error)."""

    def __init__(self, client: PostgresClient, key: str) -> None:
        self.client, self.key = client, key
        self.token: Any = None
        self.error: Any = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            with SyncDistributedLock(self.client, table="locks", key=self.key, lease_duration=5,
                                     wait_timeout=BOUND_S) as lease:
                self.token = lease.fencing_token
        except BaseException as error:  # noqa: BLE001 - reported by join()
            self.error = error

    def join(self) -> None:
        self.thread.join(BOUND_S + 5)
        assert not self.thread.is_alive(), "the waiter did not finish"
        assert self.error is None, self.error


def test_a_release_notifies_its_table_channel_with_the_key(make_client, postgres_db):
    holder = make_client("fl-holder", tables=LOCKS)
    with psycopg.connect(postgres_db, autocommit=True) as listener:
        listener.execute(f'LISTEN "{release_channel("locks")}"')
        with SyncDistributedLock(holder, table="locks", key="job:é 1", lease_duration=5):
            pass
        received = [(n.channel, n.payload) for n in listener.notifies(timeout=BOUND_S, stop_after=1)]
    assert received == [(release_channel("locks"), "job:é 1")]


def test_a_release_wakes_a_waiter_of_another_client_through_the_feed(make_client, admin):
    holder, waiting = make_client("fl-holder", tables=LOCKS), make_client("fl-waiter", tables=LOCKS)
    feed = waiting.store.release_feed
    with SyncDistributedLock(holder, table="locks", key="hot", lease_duration=30):
        waiter = Waiter(waiting, "hot")
        wait_until(lambda: feed.subscribed("locks"), BOUND_S, "the waiter's LISTEN")
        assert listener_backends(admin, "fl-waiter")
        assert feed.delivered == 0
    waiter.join()
    assert waiter.token == 2 and feed.delivered == 1  # the notification reached the waiter and woke it


def test_a_lost_notification_only_leaves_the_waiter_to_its_poll(make_client, admin):
    holder, waiting = make_client("fl-holder", tables=LOCKS), make_client("fl-waiter", tables=LOCKS)
    feed = waiting.store.release_feed
    guard = SyncDistributedLock(holder, table="locks", key="hot", lease_duration=30)
    guard.__enter__()
    waiter = Waiter(waiting, "hot")
    wait_until(lambda: feed.subscribed("locks"), BOUND_S, "the waiter's LISTEN")
    admin.execute("UPDATE locks SET owner = NULL, version = NULL WHERE key = 'hot'")  # freed, no notification
    waiter.join()
    assert waiter.token == 2 and feed.delivered == 0
    holder.close()


def test_the_feed_listens_again_after_its_connection_is_terminated(make_client, admin):
    holder, waiting = make_client("fl-holder", tables=LOCKS), make_client("fl-waiter", tables=LOCKS)
    feed = waiting.store.release_feed
    with SyncDistributedLock(holder, table="locks", key="hot", lease_duration=30):
        waiter = Waiter(waiting, "hot")
        wait_until(lambda: feed.subscribed("locks"), BOUND_S, "the waiter's LISTEN")
        (first,) = wait_until(lambda: listener_backends(admin, "fl-waiter"), BOUND_S, "the listener's backend")
        admin.execute("SELECT pg_terminate_backend(%s)", (first,))
        wait_until(lambda: not feed.subscribed("locks"), BOUND_S, "the feed to notice")
        wait_until(lambda: feed.subscribed("locks"), BOUND_S, "the feed to LISTEN again")
        assert wait_until(lambda: listener_backends(admin, "fl-waiter"), BOUND_S, "the new listener") != [first]
    waiter.join()
    assert feed.delivered == 1


def test_without_wake_on_release_nothing_listens(make_client, admin):
    holder = make_client("fl-holder", tables=LOCKS)
    waiting = make_client("fl-waiter", tables=LOCKS, wake_on_release=False)
    assert waiting.engine.release_feed is None
    with SyncDistributedLock(holder, table="locks", key="hot", lease_duration=30):
        waiter = Waiter(waiting, "hot")
        wait_until(lambda: admin.execute("SELECT waiting FROM locks WHERE key = 'hot'").fetchone()[0], BOUND_S,
                   "the waiter's mark")
        assert listener_backends(admin, "fl-waiter") == []
    waiter.join()
    assert waiting.store._feed is None  # never made


def test_wake_on_release_must_be_a_bool(postgres_db):
    with pytest.raises(TypeError, match="wake_on_release"):
        PostgresClient(postgres_db, wake_on_release="yes")
