"""What the stores' release feeds share (Redis pub/sub, PostgreSQL LISTEN/NOTIFY): the watch list, the
listener thread's life (start on the first watch, reconnect with back-off, exit when idle) and its
timings. Each store's feed adds only its own I/O: connect, send its (un)subscriptions, read and
dispatch, disconnect. See ``stores/base.py`` (``ReleaseFeed``) for what a feed may and may not do.
"""

from __future__ import annotations

import itertools
import os
import select
import threading
import time
from functools import partial

TYPE_CHECKING = False  # typing is not imported at run time (the renewal process imports this module)
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

__all__ = ["LINGER_S", "LISTENER_IDLE_EXIT_S", "LISTENER_TICK_S", "ListenerFeed", "Watch", "WatchedChannel",
           "parse_turn", "turn_wake"]

#: The listener looks at its watch list this often while nothing arrives; it bounds how long a new watch
#: waits for its subscription (the engine then reads once more, so nothing released meanwhile is missed).
LISTENER_TICK_S = 0.01
#: A channel stays subscribed this long after its last watcher left: a worker that loops over one key
#: (or table) then keeps its subscription instead of renewing it on every wait.
LINGER_S = 2.0
#: The listener thread exits after this long with no channel; the next watch starts another.
LISTENER_IDLE_EXIT_S = 30.0
#: After a connection is lost, the listener connects again this long after (seconds), doubled up to the
#: second figure while each new connection fails before a tick of work.
RECONNECT_BACKOFF_S = (0.05, 1.0)


def parse_turn(payload: bytes) -> tuple[bytes, Optional[str]]:
    """A message that gives a waiter its turn: the waiter's id, then, after a space, the key a release
    freed (a semaphore's slot; empty when a put passed the turn on), or "=<version> <fence>" where a Redis
    release handed a lock's lease over to the waiter, or None where the message names neither (a lock's)."""
    waiter, space, freed = payload.partition(b" ")
    return waiter, freed.decode("utf-8", "replace") if space else None


def turn_wake(turn: Any, freed: Optional[str]) -> Callable[[], None]:
    """What the feed calls for a turn: the waiter's ``turn``, told the key ``freed`` where the message named one."""
    return turn if freed is None else partial(turn, freed)


class WatchedChannel:
    """One channel's watchers (ident -> what the feed calls), ``turns`` (a waiter's id in the key's line,
    as bytes -> what the feed calls when a message names it), and ``ready``: subscribed, and confirmed
    by the server, on the current connection; ``wake_at``: when the watched lease expires on the server
    (monotonic seconds, 0: not known). Feeds add their own bookkeeping in subclasses."""

    __slots__ = ("watchers", "turns", "ready", "idle_since", "wake_at")

    def __init__(self) -> None:
        self.watchers: dict[int, Any] = {}
        self.turns: dict[bytes, Any] = {}
        self.ready = threading.Event()
        self.idle_since = 0.0
        self.wake_at = 0.0


class Watch:
    """A waiter's interest in one key's releases: ``ready`` once the subscription is confirmed (that of
    ``turn_channel``, where there is one); ``was_ready`` if it already was when the watch began; ``waiter``,
    its id in the key's line (bytes), or None; ``turn_channel``, the channel where its client's turns on
    the key arrive, if not the key's own."""

    __slots__ = ("channel", "ident", "ready", "was_ready", "waiter", "turn_channel")

    def __init__(self, channel: Any, ident: int, ready: threading.Event, was_ready: bool,
                 waiter: Optional[bytes] = None, turn_channel: Any = None) -> None:
        self.channel = channel
        self.ident = ident
        self.ready = ready
        self.was_ready = was_ready
        self.waiter = waiter
        self.turn_channel = turn_channel


class ListenerFeed:
    """A release feed's watch list and listener thread. Subclasses give ``_new_channel``, ``_connect``,
    ``_disconnect``, ``_send_changes``, ``_read``, ``_forget_subscriptions`` and ``listener_errors``.
    ``delivered`` counts the messages that woke a waiter, ``received`` every message read."""

    thread_name = "fastlease-feed"
    #: The errors that end the listener's connection (it connects again after a back-off).
    listener_errors: tuple[type[BaseException], ...] = (Exception,)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._channels: dict[Any, Any] = {}
        self._idents = itertools.count(1)
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        # Written under ``_io`` by whichever thread reads the connection (the listener or a waiting thread):
        self.delivered = 0
        self.received = 0  # the messages read, whether or not they woke a waiter of this client
        #: Held by the one thread doing the connection's I/O: the listener, or a waiting thread that reads
        #: in its stead (``wait_reading``).
        self._io = threading.Lock()
        #: The listener's connection, while it has one: made by the listener, dropped by the thread whose
        #: read failed (either), always under ``_io``.
        self._connection: Any = None
        self._readers = 0  # waiting threads that would read in the listener's stead (each counts itself, under _lock)
        #: The ident of the waiting thread doing the connection's I/O (set and cleared by it, under ``_io``).
        self.reading_thread: Optional[int] = None
        self._no_readers = threading.Condition(self._lock)
        #: The listener's pipe (read end, write end), while it runs (set and cleared by the listener, under
        #: ``_lock``): a waiting thread that would read writes a byte, so that the listener leaves its wait
        #: for messages at once and lets it read.
        self._poke: Optional[tuple[int, int]] = None
        #: The reconnection back-off (written under ``_io`` by the thread that lost or made a connection):
        #: the next one's length, and when the listener may connect again (monotonic seconds).
        self._backoff_s = RECONNECT_BACKOFF_S[0]
        self._retry_at = 0.0

    def _watch(self, name: Any, watcher: Any, waiter: Optional[str] = None, turn: Any = None,
               turn_name: Any = None) -> Watch:
        """Add ``watcher`` to channel ``name`` (and ``turn``, for a message that names ``waiter``) and start
        the listener if it is not running. With ``turn_name``, the channel where this client's turns on the
        key arrive, the watcher and turn are added to that channel too (subscribed after ``name``), and the
        watch is ready once it is: a waiter's turn comes there, while ``name`` has the messages for every
        waiter ("1") and the turns that a client of an earlier version publishes. Never waits."""
        waiter_id = None if waiter is None else waiter.encode()
        with self._lock:
            ident = next(self._idents)
            channel = self._add(name, ident, watcher, waiter_id, turn)
            was_ready = channel.ready.is_set()
            if turn_name is not None:
                channel = self._add(turn_name, ident, watcher, waiter_id, turn)
                was_ready = was_ready and channel.ready.is_set()
            if not self._stop.is_set() and (self._thread is None or not self._thread.is_alive()):
                self._thread = threading.Thread(target=self._listen, name=self.thread_name, daemon=True)
                self._thread.start()
        return Watch(name, ident, channel.ready, was_ready, waiter_id, turn_name)

    def _add(self, name: Any, ident: int, watcher: Any, waiter_id: Optional[bytes], turn: Any) -> Any:
        """Under the lock: add a watcher (and its turn) to channel ``name``, made if new; the channel."""
        channel = self._channels.get(name)
        if channel is None:
            channel = self._channels[name] = self._new_channel()
        channel.watchers[ident] = watcher
        if waiter_id is not None:
            channel.turns[waiter_id] = turn
        return channel

    def _confirmed(self, name: Any, turn_name: Any, confirmed: Callable[[Any], bool]) -> bool:
        """Whether channel ``name`` is subscribed and confirmed (by the feed's own test, ``confirmed``), and
        ``turn_name`` too while it has watchers (``subscribed`` of the Redis feeds, for tests and tools)."""
        with self._lock:
            channel, own = self._channels.get(name), self._channels.get(turn_name)
            return (channel is not None and confirmed(channel)
                    and (own is None or not own.watchers or confirmed(own)))

    def unwatch(self, watch: Watch) -> None:
        """End ``watch``: its ``wake`` is not called again. The channel stays subscribed ``LINGER_S`` more."""
        with self._lock:
            for name in (watch.channel, watch.turn_channel):
                channel = self._channels.get(name) if name is not None else None
                if channel is None:
                    continue
                if watch.waiter is not None:
                    channel.turns.pop(watch.waiter, None)
                if channel.watchers.pop(watch.ident, None) is not None and not channel.watchers:
                    channel.idle_since = time.monotonic()

    def close(self) -> None:
        """Stop the listener thread (joined for up to 5 s); waiters then rely on polling alone."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)

    def wake_at_expiry(self, name: Any, delay_s: float) -> None:
        """The lease watched on channel ``name`` expires on the server in ``delay_s``: wake its watchers
        then (on the listener thread, within a tick), since no release will be published for a lease that
        simply expires (its holder crashed). Like a message, only a hint to look again: a wake that comes
        early finds the lease still there, and the read that found it sets the next one."""
        with self._lock:
            channel = self._channels.get(name)
            if channel is not None and channel.watchers:
                channel.wake_at = time.monotonic() + delay_s

    def _wake_expired(self) -> None:
        now = time.monotonic()
        wakes: list[Callable[[], None]] = []
        with self._lock:
            for channel in self._channels.values():
                if channel.wake_at and channel.wake_at <= now:
                    channel.wake_at = 0.0
                    wakes.extend(channel.watchers.values())
        for wake in wakes:
            wake()

    @staticmethod
    def wakes_for(channel: WatchedChannel, payload: Any) -> list[Callable[[], None]]:
        """Under the lock: whom one message wakes. A message that names a waiter in the key's line wakes
        that waiter alone (none, if it waits in another process), told the key released where the message
        adds it after a space (a semaphore's slot); any other ("1") wakes every watcher."""
        if payload == b"1" or not isinstance(payload, bytes):
            return list(channel.watchers.values())
        waiter, freed = parse_turn(payload)
        turn = channel.turns.get(waiter)
        return [] if turn is None else [turn_wake(turn, freed)]

    def _wake_all(self, wakes: list[Callable[[], None]]) -> None:
        """Call the wakes of one message (outside the lock: a wake only sets events)."""
        self.received += 1
        if wakes:
            self.delivered += 1
        for wake in wakes:
            wake()

    # ---- reading on a waiting thread ---------------------------------------------------------------
    def wait_reading(self, ticket: threading.Event, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for ``ticket`` (a waiter's, in a key's line), doing the listener's work
        on this thread meanwhile when no other thread does it: a message that gives this waiter its turn
        then reaches it without a switch to another thread (the listener's wake-up of this one). Messages
        for other waiters are dispatched as the listener would. The listener, poked through its pipe, gives
        the connection up at once; several waiting threads of one client read a tick each in turn. A ticket
        set by another thread (a release in this process, ``cancel``) is seen within a listener tick.
        Returns whether the ticket is set. A lost connection is left to the listener to make again; an
        interruption on this thread (``KeyboardInterrupt``) closes the connection, then propagates."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self._readers += 1
            if self._poke is not None:
                try:
                    os.write(self._poke[1], b"\0")
                except OSError:  # (full: the listener has been poked already)
                    pass
        try:
            while not ticket.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                # (The listener, poked, lets go within microseconds; another waiting thread, after its tick.)
                if not self._io.acquire(timeout=min(remaining, LISTENER_TICK_S)):
                    continue
                read = False
                self.reading_thread = threading.get_ident()
                try:
                    connection = self._connection  # (None: the listener is to connect again)
                    while connection is not None and not self._stop.is_set() and remaining > 0:
                        read = self._step(connection, min(remaining, LISTENER_TICK_S))
                        if not read or ticket.is_set() or self._readers > 1:
                            break
                        remaining = deadline - time.monotonic()
                except BaseException:  # (KeyboardInterrupt, say: the connection may be left mid-message)
                    if self._connection is not None:
                        self._drop(self._connection)
                    raise
                finally:
                    self.reading_thread = None
                    self._io.release()
                if not read or self._readers > 1:  # (another waiting thread would read: its turn)
                    ticket.wait(max(0.0, min(deadline - time.monotonic(), LISTENER_TICK_S)))
            return True
        finally:
            with self._lock:
                self._readers -= 1
                if not self._readers:
                    self._no_readers.notify_all()

    def _wait_readable(self, sockets: list[Any], timeout_s: float) -> bool:
        """Under ``_io``: wait up to ``timeout_s`` for one of ``sockets`` (file descriptors or objects with
        ``fileno``) to be readable. A waiting thread's call to read in the listener's stead ends the wait
        early (False, unless a socket is readable too)."""
        poller = select.poll()
        for sock in sockets:
            poller.register(sock, select.POLLIN)
        poke = self._poke
        if poke is not None:
            poller.register(poke[0], select.POLLIN)
        events = poller.poll(max(0.0, timeout_s) * 1000)
        if poke is not None and any(fd == poke[0] for fd, _ in events):
            try:
                os.read(poke[0], 4096)
            except OSError:
                pass
        return any(poke is None or fd != poke[0] for fd, _ in events)

    def _step(self, connection: Any, timeout_s: float) -> bool:
        """Under ``_io``: one tick of the listener's work on ``connection``. On a listener error, the
        connection is dropped (the listener makes another) and False returned."""
        try:
            self._send_changes(connection)
            self._read(connection, timeout_s)
            self._wake_expired()
            self._backoff_s = RECONNECT_BACKOFF_S[0]
            return True
        except self.listener_errors:
            self._drop(connection)
            return False

    def _drop(self, connection: Any) -> None:
        """Under ``_io``: close ``connection``, which the listener then makes again (subscribed to nothing)
        after a back-off: 50 ms, doubled up to 1 s while each new connection fails before a tick of work."""
        self._back_off()
        self._connection = None
        with self._lock:
            self._forget_subscriptions()
        try:
            self._disconnect(connection)
        except self.listener_errors:
            pass

    # ---- the listener thread -----------------------------------------------------------------------
    def _listen(self) -> None:
        idle_since = time.monotonic()
        poke = os.pipe()
        for fd in poke:
            os.set_blocking(fd, False)
        with self._lock:
            self._poke = poke
        try:
            while not self._stop.is_set():
                with self._lock:  # a waiting thread reads in our stead: leave the connection to it
                    while self._readers and self._connection is not None and not self._stop.is_set():
                        self._no_readers.wait(LISTENER_TICK_S)
                with self._io:
                    stepped = self._connect_and_step()
                if not stepped:  # (the waiters poll meanwhile)
                    self._stop.wait(max(self._retry_at - time.monotonic(), LISTENER_TICK_S / 10))
                    continue
                with self._lock:
                    if self._channels:
                        idle_since = time.monotonic()
                    elif time.monotonic() - idle_since > LISTENER_IDLE_EXIT_S:
                        self._thread = None  # (a watch made from now on starts another listener)
                        return
        finally:
            self._close(poke)

    def _close(self, poke: tuple[int, int]) -> None:
        """The end of the listener whose pipe is ``poke``: the pipe closed, and the connection too unless a
        listener started since (after an idle exit) has taken both over, with their subscriptions."""
        with self._io:
            with self._lock:
                ours = self._poke is poke
                if ours:
                    self._poke = None
            if ours and self._connection is not None:
                self._drop(self._connection)
        for fd in poke:
            os.close(fd)

    def _back_off(self) -> None:
        """Under ``_io``: no new connection before the back-off has passed, and the next back-off longer."""
        self._retry_at = time.monotonic() + self._backoff_s
        self._backoff_s = min(self._backoff_s * 2, RECONNECT_BACKOFF_S[1])

    def _connect_and_step(self) -> bool:
        """Under ``_io``: connect if there is no connection (once the back-off has passed), then one tick;
        False on a listener error, or while the back-off lasts."""
        if self._connection is None:
            if time.monotonic() < self._retry_at:
                return False
            try:
                connection = self._connect()
            except self.listener_errors:
                self._back_off()
                return False
            self._connection = connection
            with self._lock:  # a new connection is subscribed to nothing yet
                self._forget_subscriptions()
        return self._step(self._connection, LISTENER_TICK_S)

    def _new_channel(self) -> Any:
        return WatchedChannel()

    def _connect(self) -> Any:
        raise NotImplementedError

    def _disconnect(self, connection: Any) -> None:
        raise NotImplementedError

    def _send_changes(self, connection: Any) -> None:
        raise NotImplementedError

    def _read(self, connection: Any, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for messages on ``connection``, and dispatch what arrived."""
        raise NotImplementedError

    def _forget_subscriptions(self) -> None:
        """Under the lock: the connection is new or gone, so no channel is subscribed on it."""
        raise NotImplementedError
