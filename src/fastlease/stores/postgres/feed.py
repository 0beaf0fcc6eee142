"""The PostgreSQL release feed: releases made by any process, reported to this one's waiters at once.

Every release notifies its lock table's channel (``release_channel``) with the key, in the release's
own statement, so the notification is delivered at its commit and only if the row was freed. A
client that waits for a key LISTENs on the table's channel, on one connection of its own owned by one
listener thread, and wakes its waiters on that key when the key's notification arrives; other
processes then take their turn at once instead of at their next poll.

As with Redis pub/sub, a notification is only a hint to look again: a lost one (a reconnect, a LISTEN
not yet confirmed) leaves a waiter to its next poll, and it never admits anyone, since the waiter
must still win the conditional write. It never grants, extends or ends ownership.
"""

from __future__ import annotations

import hashlib
import select
import time
from typing import TYPE_CHECKING, Any, Callable

from .._release_feed import LINGER_S, LISTENER_TICK_S, ListenerFeed, Watch, WatchedChannel

if TYPE_CHECKING:  # annotations only
    from .session import Session

__all__ = ["PostgresReleaseFeed", "Watch", "release_channel"]

#: The bound on the listener's LISTEN and UNLISTEN requests.
REQUEST_TIMEOUT_S = 5.0


def release_channel(table: str) -> str:
    """The NOTIFY channel of a lock table's releases. A digest of the name, so that it fits the 63 bytes
    of an identifier whatever the name (a channel is per database, as the table is)."""
    return "fastlease_release_" + hashlib.sha1(table.encode()).hexdigest()[:24]


class ListenerLost(Exception):
    """The listener's connection ended; the listener connects again (after a back-off)."""


class _Channel(WatchedChannel):
    __slots__ = ("listening",)

    def __init__(self) -> None:
        super().__init__()
        self.listening = False  # watchers: ident -> (key, wake)


class PostgresReleaseFeed(ListenerFeed):
    """The ReleaseFeed of one PostgresStore (see ``stores/base.py``). ``delivered`` counts the
    notifications that woke a waiter."""

    thread_name = "fastlease-postgres-feed"
    listener_errors = (Exception,)  # the store's Failure, psycopg's errors on a broken socket, ListenerLost

    def __init__(self, store: Any) -> None:
        super().__init__()
        self._store = store

    def watch(self, table: str, key: str, wake: Callable[[], None]) -> Watch:
        """Call ``wake()`` (on the listener thread; it must be quick and never raise) whenever ``key`` of
        ``table`` is released, until ``unwatch``. Never raises and never waits."""
        return self._watch(release_channel(table), (key, wake))

    def subscribed(self, table: str) -> bool:
        """True once the server has confirmed our LISTEN on ``table``'s releases."""
        with self._lock:
            channel = self._channels.get(release_channel(table))
            return channel is not None and channel.listening and channel.ready.is_set()

    # ---- the listener thread's I/O ----------------------------------------------------------------
    def _new_channel(self) -> _Channel:
        return _Channel()

    def _connect(self) -> Session:
        session: Session = self._store.connect(REQUEST_TIMEOUT_S)
        return session

    def _disconnect(self, session: Session) -> None:
        session.close()

    def _forget_subscriptions(self) -> None:
        for channel in self._channels.values():
            channel.ready.clear()
            channel.listening = False

    def _send_changes(self, session: Session) -> None:
        """LISTEN on channels that gained a watcher, UNLISTEN those idle past the linger."""
        now = time.monotonic()
        listen, unlisten = [], []
        with self._lock:
            for name, channel in list(self._channels.items()):
                if channel.watchers and not channel.listening:
                    listen.append(name)
                elif not channel.watchers and now - channel.idle_since > LINGER_S:
                    del self._channels[name]
                    if channel.listening:
                        unlisten.append(name)
        for name in unlisten:
            session.run(b'UNLISTEN "%s"' % name.encode(), [], REQUEST_TIMEOUT_S, prepare=False)
        for name in listen:
            session.run(b'LISTEN "%s"' % name.encode(), [], REQUEST_TIMEOUT_S, prepare=False)
            with self._lock:
                listened = self._channels.get(name)
                if listened is not None:
                    listened.listening = True
                    listened.ready.set()

    def _read(self, session: Session) -> None:
        """Wait up to a tick for notifications, and wake the waiters of each key released."""
        pgconn = session.pgconn
        poller = select.poll()
        poller.register(pgconn.socket, select.POLLIN)
        if poller.poll(LISTENER_TICK_S * 1000):
            pgconn.consume_input()  # raises on a connection the server ended
            from psycopg import pq

            if pgconn.status != pq.ConnStatus.OK:
                raise ListenerLost("the listener's connection ended")
        while True:
            notification = pgconn.notifies()
            if notification is None:
                return
            self._dispatch(notification.relname.decode(), notification.extra.decode("utf-8", "replace"))

    def _dispatch(self, name: str, key: str) -> None:
        with self._lock:
            channel = self._channels.get(name)
            wakes = [] if channel is None else [wake for watched, wake in channel.watchers.values() if watched == key]
        self._wake_all(wakes)
