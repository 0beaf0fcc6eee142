"""Redis store: the same leases on a Redis server, through redis-py (``pip install fastlease[redis]``).
Where keys live and the scripts are in ``scripts``; the replies are read in ``replies``.

**Requests.** Each protocol step is one Lua script (``EVALSHA``; on ``NOSCRIPT`` the script is loaded
and sent again, which is safe because NOSCRIPT means it did not run) or one ``HGETALL`` (of a record). Every key
and value travels in KEYS and ARGV, never inside the script text, so a key made of quotes, braces or
Lua is only bytes. Requests go out on a connection of the calling thread, made with the settings of
the client's connection pool (address, database, credentials, TLS), with no automatic retry: a
request that may have run is reported as such (``StoreError.maybe_committed``) and the engine
reconciles it by a read, exactly as on DynamoDB.

A Redis Cluster has a store of its own, ``fastlease.stores.redis.cluster`` (the same scripts, on keys
that share one hash tag); this one refuses a cluster node, whose keys would be laid out otherwise.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref

from ...exceptions import MalformedLockRow, StoreError, StoreRequestRejected
from ..base import NO_USAGE, LockRow, Offer, Record, UsageMeter, check_table, outcome_for_log
from . import wire
from .feed import RedisReleaseFeed
from .replies import (
    CLUSTER_REPLIES,
    TRANSIENT_REPLIES,
    as_text,
    cluster_node_message,
    connection_kind,
    constructor_defaults,
    deletion,
    fencing_token,
    hash_fields,
    load_redis,
    lock_row,
    reply_code,
    stored_integer,
)
from .scripts import ALIVE_MS, NODE_SCRIPTS, PREFIX, SCRIPT_NAMES, NodeLayout, Script, lease_key, turn_channel
from .wire import pack_command as _pack

# typing is not imported at run time: the renewal process imports this module, and it would cost it
# memory. redis-py is optional: imported when a client is made.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional, Sequence

    from .._release_feed import ListenerFeed

_log = logging.getLogger("fastlease.stores.redis")

__all__ = ["RedisStore", "RedisReleaseFeed", "PREFIX"]

#: Bound for socket reads and connects when the client's settings leave them unbounded; a request's
#: own timeout (``timeout_s``) is applied to waiting for its reply.
MAX_SOCKET_TIMEOUT_S = 5.0

#: How many keys' Redis names a store keeps built (``RedisStore.names``); past that it starts again.
NAMES_KEPT = 1024

#: Connection settings the store sets itself on every connection (see ``RedisStore.new_connection``),
#: or redis-py's own defaults objects: not given to the renewal process, which makes its own.
_RENEWAL_RESET_SETTINGS = frozenset({"retry", "retry_on_error", "retry_on_timeout", "decode_responses",
                                     "himport_registry", "driver_info"})


class _TryAgain(StoreError):
    """TRYAGAIN: a slot being migrated refused a script that names a key it does not have (say, a line of
    waiters, absent most of the time). Nothing ran; the steps that touch a line try without it."""


class ConnectionSettings:
    """What RedisStore reads of a connection pool: the connection class, its settings, and the library
    whose exceptions the connections raise (None: redis-py). The cluster has one per node."""

    def __init__(self, connection_class: Any, connection_kwargs: dict[str, Any], library: Any = None) -> None:
        self.connection_class = connection_class
        self.connection_kwargs = connection_kwargs
        self.library = library


def renewal_transport(kind: str, settings: dict[str, Any]) -> tuple[Any, Any]:
    """(connection class, library) the renewal process connects with, for ``portable_settings()``'s kind
    and settings: our own (``wire``) when it honours every setting, which spares the renewal process
    redis-py's import and memory; else redis-py's (imported now)."""
    if wire.honours(settings):
        return wire.ConnectionPool(kind, settings).connection_class, wire.library
    load_redis()
    return connection_kind(kind), None


class RedisStore:
    """The LockStore adapter for one Redis server: one script per protocol step (one HGETALL per record read)."""

    kind = "redis"  # in stores.registry
    blocking = True
    layout: Any = NodeLayout
    scripts = NODE_SCRIPTS
    #: One server holds every key, so a script may name a slot's lease and its semaphore's line together.
    shared_lines = True
    #: A release hands the lease over to the head of the line where its last read offered to take it.
    hands_over = True

    def __init__(self, connection_pool: Any) -> None:
        # redis-py, or, in the renewal process, ``wire.library``: the stand-in of our own connection
        # (``wire.ConnectionPool``), which has the members of redis-py's that this store uses.
        self._redis = getattr(connection_pool, "library", None) or load_redis()
        # The pool's settings only: requests never check connections out of it (see new_connection).
        self.connection_class = connection_pool.connection_class
        self.connection_kwargs = connection_pool.connection_kwargs
        self._local = threading.local()  # this thread's connection
        self._connections: "weakref.WeakSet[Any]" = weakref.WeakSet()  # every one made, for close()
        self._connections_lock = threading.Lock()
        self._closed = False
        self._names: dict[tuple[str, str], tuple[bytes, bytes, bytes, bytes, bytes]] = {}
        #: Starts the ids of this store's waiters in a line ("<token>~<id>"): their turns come on its own turn
        #: channel (scripts.TURN_CHANNEL), read by this client alone, not by every client waiting for the key.
        self.client_token = os.urandom(8).hex()
        #: What a request raises on NOSCRIPT (the script did not run): see run_script.
        self.no_script: Any = self._redis.exceptions.NoScriptError
        # Waiters are woken by it; the renewal process, whose store has our own connection, never waits.
        own = self._redis is wire.library
        self.release_feed: Optional[ListenerFeed] = None if own else self.new_release_feed()

    def new_release_feed(self) -> ListenerFeed:
        """The feed that wakes this store's waiters (the cluster store's is sharded)."""
        return RedisReleaseFeed(self)

    def __repr__(self) -> str:
        return f"RedisStore({self.describe()})"

    def describe(self) -> str:
        """Where the server is, for messages and the CLI (never credentials)."""
        kwargs = self.connection_kwargs
        if "path" in kwargs:
            return f"unix://{kwargs['path']}/{kwargs.get('db', 0)}"
        return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"

    # ---- transport ---------------------------------------------------------------------------------
    def new_connection(self, resp2: bool = False) -> Any:
        """A connection with the pool's settings, owned by the caller (not checked out of the pool).

        Three settings are ours: replies as bytes, no retry (redis-py would resend a command that may have run, turning
        "maybe applied" into a wrong answer; the engine reconciles instead), and socket timeouts that
        are never unbounded, so that no request can hang.
        """
        return self.connection_with(dict(self.connection_kwargs), resp2)

    def connection_with(self, kwargs: dict[str, Any], resp2: bool) -> Any:
        """A connection of our class with these settings and ours (see new_connection)."""
        redis = self._redis
        for name in ("socket_timeout", "socket_connect_timeout"):
            if kwargs.get(name) is None:
                kwargs[name] = MAX_SOCKET_TIMEOUT_S
        if redis is not wire.library:  # (ours never retries, and speaks RESP2 with replies as bytes)
            self._own_settings_on_redis_py(kwargs, resp2)
        connection = self.connection_class(**kwargs)
        with self._connections_lock:
            self._connections.add(connection)
        return connection

    def _own_settings_on_redis_py(self, kwargs: dict[str, Any], resp2: bool) -> None:
        redis = self._redis
        kwargs["retry"] = redis.retry.Retry(redis.backoff.NoBackoff(), 0)
        kwargs["decode_responses"] = False  # replies as bytes: we decode them, always as UTF-8
        kwargs.pop("retry_on_error", None)
        kwargs.pop("retry_on_timeout", None)
        if resp2:
            # Pub/sub messages as plain replies (arrays), whatever protocol the client speaks (RESP3
            # sends them as pushes, which redis-py may route elsewhere). redis-py's maintenance
            # notifications need RESP3; a listener does without them.
            kwargs["protocol"] = 2
            for name in [name for name in kwargs if name.startswith("maint_notifications")]:
                del kwargs[name]

    def _connection(self) -> Any:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            if self._closed:
                raise StoreError("the Redis client is closed")
            connection = self._local.connection = self.new_connection()
            connection.register_connect_callback(self._refuse_cluster_node)
        return connection

    def _refuse_cluster_node(self, connection: Any) -> None:
        """Run by redis-py after each (re)connect: refuse a server in cluster mode. Its keys are laid out
        otherwise (``fastlease.stores.redis.cluster``), and a client of each layout could hold one key at
        once. One ``INFO cluster`` per connection; a server that refuses INFO (an ACL without
        ``@dangerous``) is taken at its word, and a cluster node would still refuse nearly every request
        with CROSSSLOT or MOVED, which is reported the same way."""
        connection.send_command(b"INFO", b"cluster", check_health=False)
        try:
            reply = connection.read_response()
        except self._redis.exceptions.ResponseError:
            return
        if isinstance(reply, bytes) and b"cluster_enabled:1" in reply:
            connection.disconnect()
            raise StoreRequestRejected(cluster_node_message(self.describe(), "INFO says cluster_enabled:1"))

    def call(self, key: str, timeout_s: float, *command: Any) -> Any:
        """Send one command and read its reply within ``timeout_s``. Errors become StoreError (with
        ``maybe_committed`` when the command may have run), StoreRequestRejected, or MalformedLockRow
        (WRONGTYPE: the key holds something that is not a lease). Logged at DEBUG: the command (a
        script by its name), the key and the outcome."""
        if not _log.isEnabledFor(logging.DEBUG):
            return self._call(key, timeout_s, command)
        name = SCRIPT_NAMES.get(command[1], "EVALSHA") if command[0] == b"EVALSHA" else as_text(command[0])
        try:
            reply = self._call(key, timeout_s, command)
        except Exception as error:
            _log.debug("%s %r -> %s", name, key, outcome_for_log(error))
            raise
        _log.debug("%s %r -> %s", name, key, outcome_for_log(reply))
        return reply

    def _call(self, key: str, timeout_s: float, command: tuple[Any, ...]) -> Any:
        return self.exchange(self._connection(), key, timeout_s, (_pack(command),))

    def exchange(self, connection: Any, key: str, timeout_s: float, packed: tuple[bytes, ...]) -> Any:
        """Send the packed commands on ``connection`` and return the last one's reply, all within
        ``timeout_s`` (the cluster store sends ASKING before a command; only the command's reply matters)."""
        redis = self._redis
        sent = False
        unread = len(packed)  # replies still due: a connection left with one would hand it to the next request
        # Taken by the next (re)connect only: its handshake (redis-py sends CLIENT SETINFO and, with
        # credentials, AUTH) is then bounded by this request's timeout too.
        connection.socket_connect_timeout = connection.socket_timeout = min(timeout_s, MAX_SOCKET_TIMEOUT_S)
        try:
            connection.connect()  # no-op when connected; failing here, nothing was sent
            sent = True
            connection.send_packed_command(packed, check_health=False)
            deadline = time.monotonic() + timeout_s
            for _ in packed:
                unread -= 1
                if not connection.can_read(timeout=max(0.0, deadline - time.monotonic())):
                    connection.disconnect()  # its reply may still come: never read it as another's
                    raise StoreError(
                        f"Redis request on {key!r} timed out after {timeout_s:.3g}s (it may have run)",
                        key=key, maybe_committed=True,
                    )
                reply = connection.read_response()
            return reply
        except redis.exceptions.AuthenticationError as error:
            raise StoreRequestRejected(f"Redis refused the credentials ({self.describe()}): {error}",
                                       key=key) from error
        except redis.exceptions.ResponseError as error:
            if unread:
                connection.disconnect()
            if isinstance(error, redis.exceptions.NoScriptError):
                raise  # not run: run_script loads the script and sends it again
            raise self._classify_reply(error, key) from error
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as error:
            connection.disconnect()
            raise StoreError(
                f"Redis request on {key!r} failed ({self.describe()}): {type(error).__name__}: {error}",
                key=key, maybe_committed=sent,
            ) from error

    def _classify_reply(self, error: Exception, key: str) -> Exception:
        code = reply_code(self._redis, error)
        text = str(error)
        if not text.startswith(code):
            text = f"{code} {text}"  # as the server sent it
        if code == "WRONGTYPE":
            return MalformedLockRow(f"Redis key of {key!r} holds something that is not a lease: {text}", key=key)
        if code in CLUSTER_REPLIES:
            return StoreRequestRejected(cluster_node_message(self.describe(), text), key=key)
        if code == "TRYAGAIN":
            return _TryAgain(f"Redis could not run the request on {key!r} now: {text}", key=key)
        if code in TRANSIENT_REPLIES:
            return StoreError(f"Redis could not run the request on {key!r} now: {text}", key=key)
        return StoreRequestRejected(f"Redis refused the request on {key!r} ({self.describe()}): {text}", key=key)

    def run_script(
        self, script: Script, key: str, timeout_s: float, keys: tuple[bytes, ...], args: tuple[Any, ...]
    ) -> object:
        """EVALSHA; on NOSCRIPT (the script did not run) SCRIPT LOAD and EVALSHA once more. A second
        NOSCRIPT (a SCRIPT FLUSH in between, or on a cluster, the slot moved to a node without it) is a
        transient StoreError: nothing ran, and the engine tries again."""
        command = (b"EVALSHA", script.sha, len(keys), *keys, *args)
        try:
            return self.call(key, timeout_s, *command)
        except self.no_script as missing:
            loaded = as_text(self.load_script(script, key, timeout_s, missing))
        if loaded != script.sha.decode():
            raise StoreRequestRejected(f"Redis loaded script {script.name} as {loaded!r}, not its SHA1", key=key)
        try:
            return self.call(key, timeout_s, *command)
        except self.no_script:
            raise StoreError(f"Redis lost script {script.name} right after loading it (SCRIPT FLUSH, or a slot "
                             f"that moved); it did not run on {key!r}", key=key) from None

    def load_script(self, script: Script, key: str, timeout_s: float, missing: Exception) -> Any:
        """SCRIPT LOAD where the NOSCRIPT reply ``missing`` came from (here: the server); its reply, the SHA1."""
        return self.call(key, timeout_s, b"SCRIPT", b"LOAD", script.source)

    def names(self, table: str, key: str) -> tuple[bytes, bytes, bytes, bytes, bytes]:
        """The Redis names of ``key`` in lock table ``table``: (lease, fence, line, alive, channel), built
        once per key: a request that names its line would otherwise spend a tenth of its client CPU on them."""
        names = self._names.get((table, key))
        if names is None:
            layout = self.layout
            names = (layout.lease(table, key), layout.fence(table, key), layout.line(table, key),
                     layout.alive(table, key), layout.channel(table, key))
            if len(self._names) >= NAMES_KEPT:
                self._names.clear()
            self._names[(table, key)] = names
        return names

    # ---- the LockStore operations --------------------------------------------------------------
    def put_if_absent(
        self, table: str, key: str, owner: str, version: str, lease_ms: int, timeout_s: float, usage: UsageMeter
    ) -> Optional[int]:
        """The ACQUIRE script: create the lease (PX ``lease_ms``) if the key is absent and nobody waits
        in line for it. The new fencing token from the key's counter, else None."""
        return self.put_in_turn(table, key, owner, version, lease_ms, "", timeout_s, usage)

    def put_in_turn(
        self, table: str, key: str, owner: str, version: str, lease_ms: int, waiter: str, timeout_s: float,
        usage: UsageMeter, line_key: Optional[str] = None,
    ) -> Optional[int]:
        """The ACQUIRE script for ``waiter`` (a place in the line, or "" for none): create the lease if the
        key is absent and it is the waiter's turn in the line of ``line_key`` (None: the key's own): nobody
        in it, or ``waiter`` first among the live, leaving the line in the same step. A semaphore's line
        (``line_key`` given) then wakes its next waiter: another slot may be free. The new fencing token,
        else None."""
        keys, waiter = self.names(table, key)[:4], self.line_id(waiter)
        if line_key is None:
            reply = self.run_script(self.scripts.acquire, key, timeout_s, keys, (owner, version, lease_ms, waiter))
        else:  # a semaphore's slot: its line, and the channel that passes the turn on
            _, _, line, alive, turns = self.names(table, line_key)
            reply = self.run_script(self.scripts.acquire, key, timeout_s, (*keys[:2], line, alive),
                                    (owner, version, lease_ms, waiter, turns))
        return fencing_token(reply, key)

    def replace_if(
        self,
        table: str,
        key: str,
        expected_owner: str,
        expected_version: str,
        owner: str,
        version: str,
        lease_ms: int,
        timeout_s: float,
        usage: UsageMeter,
    ) -> Optional[int]:
        """The TAKE_OVER script: replace the whole lease only if it holds exactly (expected_owner,
        expected_version). The new fencing token, else None."""
        keys = self.names(table, key)[:2]
        args = (expected_owner, expected_version, owner, version, lease_ms)
        return fencing_token(self.run_script(self.scripts.take_over, key, timeout_s, keys, args), key)

    def update_version_if(
        self, table: str, key: str, owner: str, version: str, new_version: str, timeout_s: float, usage: UsageMeter,
        lease_ms: int = 0,
    ) -> bool:
        """The RENEW script: a new version and a fresh PX, only on exactly (owner, version); True if it ran."""
        lease = self.names(table, key)[:1]
        return self.run_script(self.scripts.renew, key, timeout_s, lease, (owner, version, new_version)) == 1

    def mark_waiting(self, table: str, key: str, owner: str, version: str, timeout_s: float, usage: UsageMeter) -> bool:
        """The MARK_WAITING script: set the hint once per hold, only on exactly (owner, version); True if it
        did. The PX is left alone."""
        lease = self.names(table, key)[:1]
        return self.run_script(self.scripts.mark_waiting, key, timeout_s, lease, (owner, version)) == 1

    def delete_if_owner(
        self, table: str, key: str, owner: str, timeout_s: float, usage: UsageMeter
    ) -> int:
        """The RELEASE script: delete the lease only if ``owner`` holds it, and publish the release (to the next
        waiter in line, or to all) or hand it over to the line's head. Its reply is the store's answer:
        ``NOT_DELETED``, ``DELETED``, ``DELETED_WITH_WAITERS`` or ``HANDED_OVER``. On a slot being migrated
        (TRYAGAIN: nothing ran), the script again on the lease key alone, which wakes every waiter."""
        lease, fence, line, alive, channel = self.names(table, key)
        keys, args = (lease, line, alive, fence), (owner, channel)
        try:
            reply = self.run_script(self.scripts.release, key, timeout_s, keys, args)
        except _TryAgain:  # a migrating slot: release without the line, waking every waiter ("1")
            reply = self.run_script(self.scripts.release, key, timeout_s, keys[:1], args)
        return deletion(reply, key)

    def read(self, table: str, key: str, timeout_s: float, usage: UsageMeter) -> Optional[LockRow]:
        """The OBSERVE script: the row, or None if the key is absent. Fields are returned as stored for
        ``check_row`` to judge; an owner or version that is not UTF-8 raises MalformedLockRow. The lease's
        PTTL goes to the release feed, which wakes this client's waiters on the key when it expires: a
        crashed holder is taken over at its lease's end, not at the next poll."""
        reply = self.run_script(self.scripts.observe, key, timeout_s, self.names(table, key)[:1], ())
        return self._observed(table, key, reply)

    def read_in_line(
        self, table: str, key: str, waiter: str, timeout_s: float, usage: UsageMeter, line_key: Optional[str] = None,
        offer: Optional[Offer] = None,
    ) -> tuple[Optional[LockRow], bool]:
        """The OBSERVE_IN_LINE script: as ``read``, and ``waiter`` joins the line of ``line_key`` (None: the
        key's own; at its end, if not in it) and keeps its place for ``ALIVE_MS`` more, leaving its ``offer``
        for the release to hand the lease over (unless the lease is in the offer's owner already). The row,
        and whether the key is free and the turn is ``waiter``'s. On a slot being migrated, whose node refuses
        a script that names a missing key with TRYAGAIN, a plain read (the line is then not kept)."""
        keys = self._lease_and_line(table, key, line_key)
        waiter = self.line_id(waiter)
        args: tuple[Any, ...] = (waiter, ALIVE_MS) if offer is None else (waiter, ALIVE_MS, *offer)
        try:
            reply = self.run_script(self.scripts.observe_in_line, key, timeout_s, keys, args)
        except _TryAgain:  # a migrating slot: a plain read, the turn not known
            return self.read(table, key, timeout_s, usage), False
        if not isinstance(reply, list) or len(reply) != 3:
            raise MalformedLockRow(f"Redis OBSERVE_IN_LINE of {key!r} gave {reply!r:.100}, not [fields, pttl, turn]",
                                   key=key)
        return self._observed(table, key, reply[:2]), reply[2] == 1

    def read_all_in_line(
        self, table: str, keys: Sequence[str], waiter: str, timeout_s: float, usage: UsageMeter, line_key: str
    ) -> tuple[list[Optional[LockRow]], int]:
        """The OBSERVE_ALL_IN_LINE script: ``read_in_line`` of every one of ``keys`` (a semaphore's slots) in
        one request, the place kept once, in ``line_key``'s line. The rows, and the index of the first free
        key if the turn is ``waiter``'s, else -1. For a semaphore, on one node only (``shared_lines``)."""
        _, _, line, alive, _ = self.names(table, line_key)
        names = (line, alive, *[self.names(table, key)[0] for key in keys])
        args = (self.line_id(waiter), ALIVE_MS)
        reply = self.run_script(self.scripts.observe_all_in_line, line_key, timeout_s, names, args)
        if not isinstance(reply, list) or len(reply) != 1 + 2 * len(keys) or type(reply[0]) is not int:
            raise MalformedLockRow(f"Redis OBSERVE_ALL_IN_LINE of {line_key!r} gave {reply!r:.100}, not [free, "
                                   f"then fields and pttl of each of {len(keys)} keys]", key=line_key)
        rows = [self._observed(table, key, reply[1 + 2 * n:3 + 2 * n]) for n, key in enumerate(keys)]
        return rows, reply[0]

    def leave_line(
        self, table: str, key: str, waiter: str, timeout_s: float, line_key: Optional[str] = None,
        offered_owner: Optional[str] = None,
    ) -> None:
        """The LEAVE_LINE script: ``waiter`` gives up its place in the line of ``line_key`` (None: the key's
        own) and its offer, and a lease handed over to it meanwhile (in ``offered_owner``) is deleted; if it
        had the turn (or that lease) and the key is free, the next waiter in line is woken on the line's
        channel."""
        channel = self.names(table, key if line_key is None else line_key)[4]
        waiter = self.line_id(waiter)
        args = (waiter, channel) if offered_owner is None else (waiter, channel, offered_owner)
        self.run_script(self.scripts.leave_line, key, timeout_s, self._lease_and_line(table, key, line_key), args)

    def free_in_line(
        self, table: str, key: str, owner: str, line_key: str, timeout_s: float, usage: UsageMeter
    ) -> int:
        """The RELEASE script as ``delete_if_owner``, the head woken being that of ``line_key``'s line, on
        that key's channel, told which key is free (with nobody in line, every waiter on ``key``'s). For a
        semaphore's slots, on one node only (``shared_lines``)."""
        if line_key == key:
            return self.delete_if_owner(table, key, owner, timeout_s, usage)
        lease, _, _, _, channel = self.names(table, key)
        _, _, line, alive, turns = self.names(table, line_key)
        reply = self.run_script(self.scripts.release, key, timeout_s, (lease, line, alive),
                                (owner, channel, turns, key.encode("utf-8")))
        return deletion(reply, key)

    def release_channels(self, table: str, key: str) -> tuple[bytes, bytes]:
        """``key``'s release channel and this client's turn channel of it: what our feed watches for a waiter."""
        channel = self.names(table, key)[4]
        return channel, turn_channel(channel, self.client_token)

    def line_id(self, waiter: str) -> str:
        """The id of ``waiter`` (the engine's token, or "" for none) in a key's line: see ``client_token``."""
        return f"{self.client_token}~{waiter}" if waiter else ""

    def _lease_and_line(self, table: str, key: str, line_key: Optional[str]) -> tuple[bytes, bytes, bytes]:
        """The Redis names of ``key``'s lease and of the line of ``line_key`` (None: the key's own)."""
        lease, _, line, alive, _ = self.names(table, key)
        if line_key is not None:
            line, alive = self.names(table, line_key)[2:4]
        return lease, line, alive

    def _observed(self, table: str, key: str, reply: Any) -> Optional[LockRow]:
        if not isinstance(reply, list) or len(reply) != 2:
            raise MalformedLockRow(f"Redis OBSERVE of {key!r} gave {reply!r:.100}, not [fields, pttl]", key=key)
        row = lock_row(reply[0], key)
        ttl_ms = reply[1]
        # (PTTL 0: the lease expires within this millisecond; Redis counts a key expired only once the time
        # is past its expiry. The wake then comes at the listener's next tick, not a poll later.)
        if row is not None and type(ttl_ms) is int and ttl_ms >= 0 and self.release_feed is not None:
            self.release_feed.wake_at_expiry(self.names(table, key)[4], ttl_ms / 1000)
        return row

    # ---- idempotency records ------------------------------------------------------------------
    max_result_bytes = 100_000_000  # Redis takes values up to 512 MB; this keeps a reply reasonable

    def read_record(self, table: str, key: str, timeout_s: float) -> Optional[Record]:
        """HGETALL of the record of ``key`` in record table ``table``: the Record, or None.
        MalformedLockRow if a field is missing or mistyped."""
        fields = hash_fields(self.call(key, timeout_s, b"HGETALL", self.layout.record(table, key)))
        if not fields:
            return None
        expires = stored_integer(fields.get("expires_at_ms"))
        state, fingerprint, owner = (as_text(fields.get(name)) for name in ("state", "fingerprint", "owner"))
        result = fields.get("result")
        if type(expires) is not int or not all(isinstance(text, str) for text in (state, fingerprint, owner)) \
                or not isinstance(result, bytes):
            raise MalformedLockRow(f"idempotency record of {key!r} in {table!r} is malformed", key=key)
        return Record(state, fingerprint, result, expires, owner)

    def finish_if_owner(
        self, lock_table: str, key: str, table: str, record: Record, now_ms: int, timeout_s: float
    ) -> bool:
        """The FINISH script: only while ``record.owner`` holds the lease on ``key`` in ``lock_table``,
        replace the record (its PX, the time left until ``expires_at_ms`` at the caller's ``now_ms``, runs
        on the server's clock), delete the lease, its fencing counter and its line, and publish the release. False
        if that owner does not hold it."""
        px = 0
        if record.expires_at_ms:
            px = max(1, record.expires_at_ms - now_ms)  # native expiry: the time left, not a clock reading
        layout = self.layout
        keys = (layout.lease(lock_table, key), layout.record(table, key), layout.fence(lock_table, key),
                layout.line(lock_table, key), layout.alive(lock_table, key))
        args = (record.owner, record.state, record.fingerprint, record.result, record.expires_at_ms, px,
                layout.channel(lock_table, key))
        return self.run_script(self.scripts.finish, key, timeout_s, keys, args) == 1

    # ---- the renewal process (fastlease._renewal_link) -------------------------------------------------
    def renewal_config(self) -> Any:
        """The pool's connection settings for another process (address or unix socket, db, username
        and password, TLS and its options, timeouts), or why they cannot be given there: a setting
        that is a live object (a credential provider, a connect callback, an SSL context, ...)."""
        portable = self.portable_settings()
        return portable if isinstance(portable, str) else (self.kind, *portable)

    def portable_settings(self) -> Any:
        """(connection kind, plain settings) that another process can connect with, or why not (a str)."""
        import pickle

        kind = self.connection_class
        redis = self._redis
        known = {redis.connection.Connection: "tcp", redis.connection.SSLConnection: "ssl",
                 redis.connection.UnixDomainSocketConnection: "unix"}
        if kind not in known:
            return f"the Redis connection class {kind.__name__} cannot be reproduced in another process"
        settings = {}
        defaults: Optional[dict[str, Any]] = None
        for name, value in self.connection_kwargs.items():
            if name in _RENEWAL_RESET_SETTINGS or name.startswith(("maint_notifications", "orig_")):
                continue  # replaced by new_connection(), or redis-py's own bookkeeping
            if value is None or isinstance(value, (str, bytes, int, float, bool)):
                settings[name] = value
                continue
            if defaults is None:
                defaults = constructor_defaults(kind)
            if name in defaults and value is defaults[name]:
                continue  # the connection class's own default (redis-py 8's socket_keepalive_options sentinel)
            try:
                pickle.loads(pickle.dumps(value))
            except Exception:  # noqa: BLE001 - any failure means: not reproducible
                return f"the Redis setting {name}={type(value).__name__} cannot be given to another process"
            return f"the Redis setting {name}={type(value).__name__} is an object, not a plain value"
        return known[kind], settings

    @classmethod
    def from_renewal_config(cls, config: Any, credentials: Any = None) -> RedisStore:
        """A store with the connection settings ``renewal_config()`` gave (in the renewal process): on
        our own connection (``wire``) when it honours every setting, which spares the renewal process
        redis-py's memory; else on redis-py's."""
        connection_class, library = renewal_transport(config[1], config[2])
        return cls(ConnectionSettings(connection_class, config[2], library))

    def inspect(self, table: str, key: Optional[str]) -> list[dict[str, Any]]:
        """Held leases of ``table`` (or only ``key``'s), as stored. SCAN, then one HGETALL each."""
        check_table(table)  # the engine's rule: no ':' or glob character can reach the SCAN pattern
        timeout_s = 5.0
        if key is not None:
            keys = [key]
        else:
            prefix = lease_key(table, "")
            keys, cursor = [], b"0"
            while True:  # SCAN ends when the cursor comes back to 0
                cursor, found = self.call(table, timeout_s, b"SCAN", cursor, b"MATCH", prefix + b"*", b"COUNT", 1000)
                keys.extend(name[len(prefix):].decode("utf-8", "backslashreplace") for name in found)
                if as_text(cursor) in ("0", 0):
                    break
        rows = []
        for name in sorted(set(keys)):
            try:
                row = self.read(table, name, timeout_s, NO_USAGE)
            except MalformedLockRow as error:
                rows.append({"key": name, "owner": None, "version": None, "lease_ms": None, "protocol": None,
                             "waiting": None, "fence": None, "malformed": str(error)})
                continue
            if row is not None:
                rows.append({"key": name, **row._asdict()})
        return rows

    def close(self) -> None:
        """Close every connection this store made (in any thread) and stop the release feed."""
        self._closed = True
        if self.release_feed is not None:
            self.release_feed.close()
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            connection.disconnect()
