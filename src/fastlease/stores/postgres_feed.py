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
import itertools
import select
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Optional

if TYPE_CHECKING:  # the store module imports this one
    from .postgres import _Session

__all__ = ["PostgresReleaseFeed", "Watch", "release_channel"]

#: How long the listener thread waits for a notification before it looks at its watch list again.
LISTENER_TICK_S = 0.01
#: A channel stays listened to this long after its last watcher left: a worker that loops over one
#: table then keeps its LISTEN instead of renewing it on every wait.
LINGER_S = 2.0
#: The listener thread (and its connection) ends after this long with no channel; the next watch
#: starts another.
LISTENER_IDLE_EXIT_S = 30.0
#: The bound on the listener's LISTEN and UNLISTEN requests.
REQUEST_TIMEOUT_S = 5.0


def release_channel(table: str) -> str:
    """The NOTIFY channel of a lock table's releases. A digest of the name, so that it fits the 63 bytes
    of an identifier whatever the name (a channel is per database, as the table is)."""
    return "fastlease_release_" + hashlib.sha1(table.encode()).hexdigest()[:24]


class ListenerLost(Exception):
    """The listener's connection ended; the listener connects again (after a back-off)."""


class _Channel:
    __slots__ = ("watchers", "ready", "listening", "idle_since")

    def __init__(self) -> None:
        self.watchers: dict[int, tuple[str, Callable[[], None]]] = {}  # ident -> (key, wake)
        self.ready = threading.Event()  # LISTEN confirmed by the server on the current connection
        self.listening = False
        self.idle_since = 0.0


class Watch:
    """A waiter's interest in one key's releases: ``ready`` once the server has confirmed the LISTEN on
    the key's table; ``was_ready`` if it already had when the watch began."""

    __slots__ = ("channel", "ident", "ready", "was_ready")

    def __init__(self, channel: str, ident: int, ready: threading.Event, was_ready: bool) -> None:
        self.channel = channel
        self.ident = ident
        self.ready = ready
        self.was_ready = was_ready


class PostgresReleaseFeed:
    """The ReleaseFeed of one PostgresStore (see ``stores/base.py``). ``delivered`` counts the
    notifications that woke a waiter."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._channels: dict[str, _Channel] = {}
        self._idents = itertools.count(1)
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self.delivered = 0

    def watch(self, table: str, key: str, wake: Callable[[], None]) -> Watch:
        """Call ``wake()`` (on the listener thread; it must be quick and never raise) whenever ``key`` of
        ``table`` is released, until ``unwatch``. Never raises and never waits."""
        name = release_channel(table)
        with self._lock:
            channel = self._channels.get(name)
            if channel is None:
                channel = self._channels[name] = _Channel()
            ident = next(self._idents)
            channel.watchers[ident] = (key, wake)
            was_ready = channel.ready.is_set()
            if not self._stop.is_set() and (self._thread is None or not self._thread.is_alive()):
                self._thread = threading.Thread(target=self._listen, name="fastlease-postgres-feed", daemon=True)
                self._thread.start()
        return Watch(name, ident, channel.ready, was_ready)

    def unwatch(self, watch: Watch) -> None:
        """End ``watch``: its ``wake`` is not called again. The channel stays listened to ``LINGER_S`` more."""
        with self._lock:
            channel = self._channels.get(watch.channel)
            if channel is not None and channel.watchers.pop(watch.ident, None) is not None and not channel.watchers:
                channel.idle_since = time.monotonic()

    def subscribed(self, table: str) -> bool:
        """True once the server has confirmed our LISTEN on ``table``'s releases."""
        with self._lock:
            channel = self._channels.get(release_channel(table))
            return channel is not None and channel.listening and channel.ready.is_set()

    def close(self) -> None:
        """Stop the listener thread (joined for up to 5 s); waiters then rely on polling alone."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)

    # ---- the listener thread -----------------------------------------------------------------------
    def _listen(self) -> None:
        session: Optional[_Session] = None
        backoff_s = 0.05
        idle_since = time.monotonic()
        try:
            while not self._stop.is_set():
                try:
                    if session is None:
                        session = self._store.connect(REQUEST_TIMEOUT_S)
                        with self._lock:  # a new connection listens to nothing yet
                            for channel in self._channels.values():
                                channel.ready.clear()
                                channel.listening = False
                        backoff_s = 0.05
                    self._send_changes(session)
                    self._read(session)
                except Exception as failure:  # noqa: BLE001 - the store's failures, psycopg's, ListenerLost
                    self._lost(session, failure)
                    session = None
                    self._stop.wait(backoff_s)  # the waiters poll meanwhile
                    backoff_s = min(backoff_s * 2, 1.0)
                    continue
                with self._lock:
                    if self._channels:
                        idle_since = time.monotonic()
                    elif time.monotonic() - idle_since > LISTENER_IDLE_EXIT_S:
                        self._thread = None
                        return
        finally:
            if session is not None:
                session.close()

    def _lost(self, session: Optional[_Session], failure: BaseException) -> None:
        """The connection failed: forget what it listened to (the next one LISTENs again)."""
        if session is not None:
            session.close()
        with self._lock:
            for channel in self._channels.values():
                channel.ready.clear()
                channel.listening = False

    def _send_changes(self, session: _Session) -> None:
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

    def _read(self, session: _Session) -> None:
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
        if wakes:
            self.delivered += 1
        for wake in wakes:
            wake()
