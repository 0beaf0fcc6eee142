"""Release wake-ups on a Redis Cluster, through sharded pub/sub (Redis 7).

Release and an idempotent completion SPUBLISH on their key's shard channel
(``fastlease:{E}:T:released``, in the key's slot), which only the node serving that slot delivers. So
the listener thread keeps one pub/sub connection per node that serves a watched key, and SSUBSCRIBEs
each channel on its slot's node, as the store's slot map has it.

When a slot moves (a resharding, a failover), the node that lost it ends its subscriptions with an
``sunsubscribe`` we did not ask for, or answers our SSUBSCRIBE with MOVED; the channel is then
subscribed again on the slot's new node once the slot map is fetched again. Meanwhile, as after any
lost message, the waiter only polls: a message is a hint to look again, and never admits anyone.

A server without sharded pub/sub (before Redis 7) answers SSUBSCRIBE with an error: the feed then
stops subscribing, logs it once, and every waiter polls.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional

from ...exceptions import StoreError
from .._release_feed import LINGER_S, ListenerFeed, Watch, WatchedChannel
from .replies import pubsub_event, reply_code

__all__ = ["RedisClusterReleaseFeed"]

_log = logging.getLogger("fastlease.stores.redis")

#: How long the listener may spend fetching the slot map for a subscription.
MAP_TIMEOUT_S = 1.0


class _Channel(WatchedChannel):
    __slots__ = ("node", "outstanding")

    def __init__(self) -> None:
        super().__init__()
        self.node: Any = None  # the (host, port) our last SSUBSCRIBE went to; None: not subscribed
        self.outstanding = 0  # SSUBSCRIBE/SUNSUBSCRIBE commands not yet confirmed


class _Links:
    """The listener's pub/sub connections, one per node (made when a channel needs that node)."""

    def __init__(self) -> None:
        self.by_node: dict[Any, Any] = {}


class RedisClusterReleaseFeed(ListenerFeed):
    """Releases on the cluster, delivered to this process's waiters at once (module docstring).
    ``delivered`` counts messages that woke a waiter."""

    thread_name = "fastlease-redis-cluster-feed"

    def __init__(self, store: Any) -> None:
        super().__init__()
        self._store = store
        redis = store._redis
        self.listener_errors = (redis.exceptions.RedisError, OSError, StoreError)
        self.unsupported = False  # the server has no sharded pub/sub: nothing is subscribed, waiters poll

    def watch(self, table: str, key: str, wake: Callable[[], None], waiter: Optional[str] = None,
              turn: Optional[Callable[[], None]] = None) -> Watch:
        """Call ``wake()`` (on the listener thread; it must be quick and never raise) whenever the key
        is released, until ``unwatch``; with ``waiter`` (its id in the key's line), a release that hands
        the turn to it calls ``turn()`` instead, and one that hands it to another waiter nothing. Never
        raises and never waits."""
        channel, turns = self._store.release_channels(table, key)
        return self._watch(channel, wake, self._store.line_id(waiter) if waiter else None, turn,
                           turns if waiter else None)

    def subscribed(self, table: str, key: str) -> bool:
        """True once the slot's node has confirmed our subscription to ``key``'s releases, and to this
        client's turn channel of the key while a waiter of ours watches it."""
        channel, turns = self._store.release_channels(table, key)
        return self._confirmed(channel, turns, lambda each: each.node is not None and each.ready.is_set())

    # ---- the listener thread's I/O ----------------------------------------------------------------
    def _new_channel(self) -> _Channel:
        return _Channel()

    def _connect(self) -> _Links:
        return _Links()

    def _disconnect(self, links: _Links) -> None:
        for connection in links.by_node.values():
            connection.disconnect()
        links.by_node.clear()

    def _forget_subscriptions(self) -> None:
        for channel in self._channels.values():
            channel.ready.clear()
            channel.node = None
            channel.outstanding = 0

    def _drop_node(self, links: _Links, node: Any) -> None:
        """A node's connection failed or refused a subscription: close it, and subscribe its channels
        again after the next slot map (its slots may have moved)."""
        connection = links.by_node.pop(node, None)
        if connection is not None:
            connection.disconnect()
        with self._lock:
            for channel in self._channels.values():
                if channel.node == node:
                    channel.ready.clear()
                    channel.node = None
                    channel.outstanding = 0
        self._store.forget_slot_map()

    def _send_changes(self, links: _Links) -> None:
        """SSUBSCRIBE channels that gained a watcher (each on its slot's node), SUNSUBSCRIBE those idle
        past the linger."""
        if self.unsupported:
            return
        now = time.monotonic()
        subscribe, unsubscribe = [], []
        with self._lock:
            for name, channel in list(self._channels.items()):
                if channel.watchers and channel.node is None:
                    subscribe.append(name)
                elif not channel.watchers and now - channel.idle_since > LINGER_S:
                    if channel.node is not None:
                        unsubscribe.append((name, channel.node))
                        channel.node = None
                        channel.ready.clear()
                        channel.outstanding += 1
                    elif channel.outstanding == 0:
                        del self._channels[name]
        for name, node in unsubscribe:
            connection = links.by_node.get(node)
            if connection is not None:
                connection.send_command(b"SUNSUBSCRIBE", name, check_health=False)
        for name in subscribe:
            deadline = time.monotonic() + MAP_TIMEOUT_S
            node = self._store.node_for(self._store.name_slot(name), "", deadline)
            connection = links.by_node.get(node)
            if connection is None:
                connection = self._store.new_connection(resp2=True, address=node)
                connection.connect()
                links.by_node[node] = connection
            with self._lock:
                channel = self._channels.get(name)
                if channel is None or not channel.watchers or channel.node is not None:
                    continue
                channel.node = node
                channel.outstanding += 1
            # One channel per command: a command's shard channels must all be in one slot.
            connection.send_command(b"SSUBSCRIBE", name, check_health=False)

    def _read(self, links: _Links, timeout_s: float) -> None:
        if not links.by_node:
            self._stop.wait(timeout_s)
            return
        redis = self._store._redis
        waited = False
        for node, connection in list(links.by_node.items()):
            try:
                if not waited and not connection.can_read(timeout=0):
                    # Nothing here yet: wait for any node's connection at once, then look at each.
                    waited = True
                    self._wait_readable([other._sock for other in links.by_node.values()], timeout_s)
                while connection.can_read(timeout=0):
                    self._dispatch(node, connection.read_response())
                    waited = True  # (then the others are only looked at)
            except redis.exceptions.ResponseError as error:
                if reply_code(redis, error) not in ("MOVED", "ASK", "CLUSTERDOWN", "MASTERDOWN", "TRYAGAIN"):
                    self.unsupported = True  # e.g. "unknown command 'SSUBSCRIBE'": poll from now on
                    _log.info("Redis Cluster has no sharded pub/sub (%s): waiters poll for releases", error)
                self._drop_node(links, node)
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
                self._drop_node(links, node)

    def _dispatch(self, node: Any, reply: Any) -> None:
        kind, name, payload = pubsub_event(reply)
        with self._lock:
            channel = self._channels.get(name)
            if channel is None:
                return
            if kind == "smessage":
                wakes = self.wakes_for(channel, payload)
            elif kind == "sunsubscribe" and channel.outstanding == 0:
                # Not ours: the node gave the slot away. Subscribe again where the new map puts it.
                channel.ready.clear()
                channel.node = None
                self._store.forget_slot_map()
                return
            else:  # "ssubscribe" / "sunsubscribe": the node confirms one of our commands
                channel.outstanding = max(0, channel.outstanding - 1)
                if channel.outstanding == 0 and channel.node is not None:
                    channel.ready.set()
                return
        self._wake_all(wakes)
