"""The PostgreSQL release feed: releases made by any process, reported to this one's waiters at once.

Every release notifies, in the release's own statement, so the notification is delivered at its
commit and only if the row was freed. Where the key's line of waiters has a live waiter, the release
names the first of them, on the channel of that waiter's client (``turn_channel``: each feed has its
own, which a waiter records with its place in line), so it wakes that client alone; with nobody in
line, it notifies the lock table's channel (``release_channel``) with the key, which wakes every
waiter of the key. A client that waits LISTENs, on one connection of its own owned by one listener
thread, on its turn channel and on the channel of each table it waits in.

As with Redis pub/sub, a notification is only a hint to look again: a lost one (a reconnect, a LISTEN
not yet confirmed) leaves a waiter to its next poll, and it never admits anyone, since the waiter
must still win the conditional write, or have been handed the lease by the release's own write (the
notification then reports that write, with its version and fencing token; the waiter's next read
finds it too). It never grants, extends or ends ownership.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from typing import TYPE_CHECKING, Any, Callable, Optional

from .._release_feed import LINGER_S, ListenerFeed, Watch, WatchedChannel, parse_turn, turn_wake

if TYPE_CHECKING:  # annotations only
    from .session import Session

__all__ = ["PostgresReleaseFeed", "Watch", "release_channel", "turn_channel"]

_RELEASE, _TURN = "fastlease_release_", "fastlease_turn_"  # how the channels' names begin

#: The bound on the listener's LISTEN and UNLISTEN requests.
REQUEST_TIMEOUT_S = 5.0


def release_channel(table: str) -> str:
    """The NOTIFY channel of a lock table's releases. A digest of the name, so that it fits the 63 bytes
    of an identifier whatever the name (a channel is per database, as the table is)."""
    return _RELEASE + hashlib.sha1(table.encode()).hexdigest()[:24]


def turn_channel() -> str:
    """A new feed's channel of turns: a release (or a waiter that leaves with the turn) notifies it
    with the id of the waiter, of this feed's client, that is first in the key's line."""
    return _TURN + secrets.token_hex(12)


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
        #: This client's channel of turns, which its waiters record with their places in line.
        self.turn_name = turn_channel()
        self._turns_heard = False  # our LISTEN on turn_name is confirmed on the current connection

    def watch(self, table: str, key: str, wake: Callable[[], None], waiter: Optional[str] = None,
              turn: Optional[Callable[[], None]] = None) -> Watch:
        """Call ``wake()`` (on the listener thread; it must be quick and never raise) whenever ``key`` of
        ``table`` is released to anyone, until ``unwatch``; with ``waiter`` (its id in the key's line), a
        release that hands the turn to it calls ``turn()``. Never raises and never waits. The watch is
        ready once both our LISTENs (the table's releases, our turns) are confirmed."""
        return self._watch(release_channel(table), (key, wake), waiter, turn)

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
        self._turns_heard = False
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
        if listen and not self._turns_heard:  # (kept while the connection lasts: turns are few)
            session.run(b'LISTEN "%s"' % self.turn_name.encode(), [], REQUEST_TIMEOUT_S, prepare=False)
            self._turns_heard = True
        for name in listen:
            session.run(b'LISTEN "%s"' % name.encode(), [], REQUEST_TIMEOUT_S, prepare=False)
            with self._lock:
                listened = self._channels.get(name)
                if listened is not None:
                    listened.listening = True
                    listened.ready.set()

    def _read(self, session: Session, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for notifications, and wake the waiters of each key released."""
        pgconn = session.pgconn
        if self._wait_readable([pgconn.socket], timeout_s):
            pgconn.consume_input()  # raises on a connection the server ended
            from psycopg import pq

            if pgconn.status != pq.ConnStatus.OK:
                raise ListenerLost("the listener's connection ended")
        while True:
            notification = pgconn.notifies()
            if notification is None:
                return
            self._dispatch(notification.relname.decode(), notification.extra.decode("utf-8", "replace"))

    def _dispatch(self, name: str, payload: str) -> None:
        """A table's release channel carries the key released (its watchers on that key wake); our turn
        channel, the id of the waiter of ours whose turn it is (that waiter alone wakes), followed by a space
        and the key released when that is a semaphore's slot (the waiter is told it)."""
        with self._lock:
            if name == self.turn_name:
                waiter, freed = parse_turn(payload.encode())
                turns = [channel.turns[waiter] for channel in self._channels.values() if waiter in channel.turns]
                wakes = [turn_wake(turn, freed) for turn in turns[:1]]
            else:
                channel = self._channels.get(name)
                wakes = [] if channel is None else [wake for watched, wake in channel.watchers.values()
                                                    if watched == payload]
        self._wake_all(wakes)
