"""Redis: the release feed, which wakes this process's waiters when any process releases a key."""

from __future__ import annotations

import time

from .._release_feed import LINGER_S, ListenerFeed, Watch, WatchedChannel
from .replies import pubsub_event

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

    from .store import RedisStore


class _Channel(WatchedChannel):
    __slots__ = ("subscribed", "outstanding")

    def __init__(self) -> None:
        super().__init__()
        self.subscribed = False  # our last command for it was SUBSCRIBE
        self.outstanding = 0  # SUBSCRIBE/UNSUBSCRIBE commands not yet confirmed


class RedisReleaseFeed(ListenerFeed):
    """Releases published by any process, delivered to this process's waiters at once.

    One listener thread per store owns one pub/sub connection (made with the pool's settings) and all
    its I/O: waiters only register callbacks. A channel is subscribed while a waiter watches it (and
    ``LINGER_S`` more). A message is only a hint to look again: a lost one (a reconnect, a subscription
    not yet confirmed) leaves the waiter to its next poll, and it never admits anyone, since the
    waiter must still win the conditional write. ``delivered`` counts messages that woke a waiter.
    """

    thread_name = "fastlease-redis-feed"

    def __init__(self, store: RedisStore) -> None:
        super().__init__()
        self._store = store
        redis = store._redis
        self.listener_errors = (redis.exceptions.RedisError, OSError)

    def watch(self, table: str, key: str, wake: Callable[[], None], waiter: Optional[str] = None,
              turn: Optional[Callable[[], None]] = None) -> Watch:
        """Call ``wake()`` (on the listener thread; it must be quick and never raise) whenever the
        key is released, until ``unwatch``; with ``waiter`` (its id in the key's line), a release that
        hands the turn to it calls ``turn()`` instead, and one that hands it to another waiter nothing.
        Never raises and never waits."""
        channel, turns = self._store.release_channels(table, key)
        return self._watch(channel, wake, self._store.line_id(waiter) if waiter else None, turn,
                           turns if waiter else None)

    def subscribed(self, table: str, key: str) -> bool:
        """True once the server has confirmed our subscription to ``key``'s releases, and to this client's
        turn channel of the key while a waiter of ours watches it."""
        return self._confirmed(*self._store.release_channels(table, key),
                               lambda channel: channel.subscribed and channel.ready.is_set())

    # ---- the listener thread's I/O ----------------------------------------------------------------
    def _new_channel(self) -> _Channel:
        return _Channel()

    def _connect(self) -> Any:
        connection = self._store.new_connection(resp2=True)
        connection.connect()
        return connection

    def _disconnect(self, connection: Any) -> None:
        connection.disconnect()

    def _forget_subscriptions(self) -> None:
        for channel in self._channels.values():
            channel.ready.clear()
            channel.subscribed = False
            channel.outstanding = 0

    def _read(self, connection: Any, timeout_s: float) -> None:
        if connection.can_read(timeout=0) or self._wait_readable([connection._sock], timeout_s):
            self._dispatch(connection.read_response())
            while connection.can_read(timeout=0):
                self._dispatch(connection.read_response())

    def _send_changes(self, connection: Any) -> None:
        """Subscribe channels that gained a watcher, unsubscribe those idle past the linger."""
        now = time.monotonic()
        subscribe, unsubscribe = [], []
        with self._lock:
            for name, channel in list(self._channels.items()):
                if channel.watchers and not channel.subscribed:
                    channel.subscribed = True
                    channel.outstanding += 1
                    subscribe.append(name)
                elif not channel.watchers and now - channel.idle_since > LINGER_S:
                    if channel.subscribed:
                        channel.subscribed = False
                        channel.ready.clear()
                        channel.outstanding += 1
                        unsubscribe.append(name)
                    elif channel.outstanding == 0:
                        del self._channels[name]
        if subscribe:
            connection.send_command(b"SUBSCRIBE", *subscribe, check_health=False)
        if unsubscribe:
            connection.send_command(b"UNSUBSCRIBE", *unsubscribe, check_health=False)

    def _dispatch(self, reply: Any) -> None:
        kind, name, payload = pubsub_event(reply)
        with self._lock:
            channel = self._channels.get(name)
            if channel is None:
                return
            if kind == "message":
                wakes = self.wakes_for(channel, payload)
            else:  # "subscribe" / "unsubscribe": the server confirms one of our commands
                channel.outstanding = max(0, channel.outstanding - 1)
                if channel.outstanding == 0 and channel.subscribed:
                    channel.ready.set()
                return
        self._wake_all(wakes)
