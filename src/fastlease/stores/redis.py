"""Redis store: the same leases on a Redis server, through redis-py (``pip install fastlease[redis]``).

**Layout.** For lock table ``T`` and key ``K`` (the table name cannot contain ``:``, so namespaces never
collide whatever ``K`` holds):

* ``fastlease:T:lease:K``, a hash: ``owner``, ``version``, ``lease_ms``, ``protocol`` (1), ``fence``,
  and ``waiting`` ("1") once a contender has marked it. Its PX is the holder's ``lease_ms``, reset by
  every write of the holder (acquire, takeover, renew), so a crashed holder's lease disappears by
  expiry, before any contender's observation wait ends. Safe, because ownership ends at 90% of the
  lease counted from before the write: the key always outlives the holder's own validity, as long as
  the server's clock does not run more than 10% fast over a lease (see the failure model).
* ``fastlease:T:fence:K``, a counter that never expires: every acquisition and takeover INCRs it in
  the same script and stores the result in the hash, so fencing tokens strictly increase per key,
  across release, takeover and expiry. (It survives a server restart only with persistence on.)
* ``fastlease:T:released:K``, the pub/sub channel that release publishes on (see ``RedisReleaseFeed``).

**Requests.** Each protocol step is one Lua script (``EVALSHA``; on ``NOSCRIPT`` the script is loaded
and sent again, which is safe because NOSCRIPT means it did not run) or one ``HGETALL`` (of a record). Every key
and value travels in KEYS and ARGV, never inside the script text, so a key made of quotes, braces or
Lua is only bytes. Requests go out on a connection of the calling thread, made with the settings of
the client's connection pool (address, database, credentials, TLS), with no automatic retry: a
request that may have run is reported as such (``StoreError.maybe_committed``) and the engine
reconciles it by a read, exactly as on DynamoDB.

A Redis Cluster has a store of its own, ``fastlease.stores.redis_cluster`` (the same scripts, on keys
that share one hash tag); this one refuses a cluster node, whose keys would be laid out otherwise.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref

from ..exceptions import MalformedLockRow, StoreError, StoreRequestRejected
from . import _resp
from ._digest import constructor
from ._release_feed import LINGER_S, LISTENER_TICK_S, ListenerFeed, Watch, WatchedChannel
from ._resp import pack_command as _pack
from .base import NO_USAGE, LockRow, Record, UsageMeter, check_table, outcome_for_log

# typing and hashlib are not imported at run time: the renewal process imports this module, and
# each would cost it memory (hashlib loads OpenSSL, about 3.5 MiB). redis-py is optional: imported
# when a client is made.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

_log = logging.getLogger("fastlease.stores.redis")
_sha1 = constructor("sha1")  # EVALSHA's name of a script, without loading OpenSSL (see _digest)

__all__ = ["RedisStore", "RedisReleaseFeed", "PREFIX"]

PREFIX = "fastlease"

# ---------------------------------------------------------------------------------------------
# The scripts. Each one is the whole of one protocol step, atomic on the server. They check
# everything before their first write (a script that fails halfway is not rolled back), and
# compare owner and version as exact byte strings.
# ---------------------------------------------------------------------------------------------

#: Acquire. KEYS: lease, fence. ARGV: owner, version, lease_ms.
#: Creates the lease only if the key is absent (held or merely not yet expired: untouched) and
#: returns the new fencing token, or 0.
ACQUIRE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local fence = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'version', ARGV[2], 'lease_ms', ARGV[3],
           'protocol', '1', 'fence', fence)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return fence
"""

#: Takeover. KEYS: lease, fence. ARGV: expected owner, expected version, owner, version, lease_ms.
#: Replaces the whole lease (no waiting mark, a fresh PX) only if it holds exactly the expected
#: owner and version; returns the new fencing token, or 0.
TAKE_OVER = """
local seen = redis.call('HMGET', KEYS[1], 'owner', 'version')
if seen[1] ~= ARGV[1] or seen[2] ~= ARGV[2] then return 0 end
local fence = redis.call('INCR', KEYS[2])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'owner', ARGV[3], 'version', ARGV[4], 'lease_ms', ARGV[5],
           'protocol', '1', 'fence', fence)
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return fence
"""

#: Renew. KEYS: lease. ARGV: owner, version, new version.
#: Sets the new version and resets PX to the stored lease_ms, only if the lease holds exactly
#: (owner, version) and its lease_ms is a plain positive integer; returns 1, or 0.
RENEW = """
local seen = redis.call('HMGET', KEYS[1], 'owner', 'version', 'lease_ms')
if seen[1] ~= ARGV[1] or seen[2] ~= ARGV[2] then return 0 end
if not seen[3] or not string.match(seen[3], '^[1-9][0-9]?[0-9]?[0-9]?[0-9]?[0-9]?[0-9]?[0-9]?$') then
  return 0
end
redis.call('HSET', KEYS[1], 'version', ARGV[3])
redis.call('PEXPIRE', KEYS[1], seen[3])
return 1
"""

#: Mark waiting. KEYS: lease. ARGV: owner, version.
#: Sets the turn-taking hint once per hold, only on exactly (owner, version). The PX is left alone:
#: a contender's write must never keep a crashed holder's lease alive.
MARK_WAITING = """
local seen = redis.call('HMGET', KEYS[1], 'owner', 'version', 'waiting')
if seen[1] ~= ARGV[1] or seen[2] ~= ARGV[2] or seen[3] then return 0 end
redis.call('HSET', KEYS[1], 'waiting', '1')
return 1
"""

#: Release. KEYS: lease. ARGV: owner, channel.
#: Deletes the lease only if ``owner`` holds it (whatever its version) and then publishes a wake-up
#: on the channel. Returns 0 if absent or held by another, else 1, or 2 if the deleted lease carried
#: the waiting mark (all the engine reads of the old row).
RELEASE = """
local seen = redis.call('HMGET', KEYS[1], 'owner', 'waiting')
if seen[1] ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], '1')
if seen[2] == '1' then return 2 end
return 1
"""

#: Finish an idempotent call. KEYS: lease, record, fence. ARGV: owner, state, fingerprint, result,
#: expires_at_ms, px (0: no expiry), channel. Only while ``owner`` holds the lease: replaces the
#: record, deletes the lease and the key's fencing counter, and publishes the release; returns 1, or 0.
#: The counter goes too because idempotency keys are mostly used once and nothing reads an idempotent
#: call's token: kept, every key ever used would leave a counter that never expires.
FINISH = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[2], 'state', ARGV[2], 'fingerprint', ARGV[3], 'result', ARGV[4],
           'expires_at_ms', ARGV[5], 'owner', ARGV[1])
if ARGV[6] ~= '0' then redis.call('PEXPIRE', KEYS[2], ARGV[6]) end
redis.call('DEL', KEYS[1], KEYS[3])
redis.call('PUBLISH', ARGV[7], '1')
return 1
"""

#: Observe. KEYS: lease. The lease's fields (an empty list when absent) and its PTTL in ms (-2 when
#: absent): a waiter on a key whose holder crashed learns when the lease will expire, since nobody
#: will publish a release for it.
OBSERVE = """
return {redis.call('HGETALL', KEYS[1]), redis.call('PTTL', KEYS[1])}
"""

SCRIPTS = {"ACQUIRE": ACQUIRE, "TAKE_OVER": TAKE_OVER, "RENEW": RENEW, "MARK_WAITING": MARK_WAITING,
           "RELEASE": RELEASE, "FINISH": FINISH, "OBSERVE": OBSERVE}


class _Script:
    """A script and its SHA1, the name EVALSHA runs it by."""

    __slots__ = ("name", "source", "sha")

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source.encode()
        self.sha = _sha1(self.source).hexdigest().encode()


class ScriptSet:
    """The seven scripts as one store sends them. ``publish`` replaces the call that RELEASE and FINISH
    wake waiters with (``redis.call('PUBLISH',``); the cluster store's publishes on a shard channel of the
    script's own slot. Nothing else differs."""

    __slots__ = ("acquire", "take_over", "renew", "mark_waiting", "release", "finish", "observe", "all")

    def __init__(self, publish: str = "redis.call('PUBLISH',") -> None:
        sources = {name: source.replace("redis.call('PUBLISH',", publish) for name, source in SCRIPTS.items()}
        self.all = tuple(_Script(name, source) for name, source in sources.items())
        (self.acquire, self.take_over, self.renew, self.mark_waiting, self.release, self.finish,
         self.observe) = self.all


NODE_SCRIPTS = ScriptSet()
#: On a cluster: SPUBLISH (sharded pub/sub), under pcall, so that a server without it (before Redis 7)
#: still releases, and its waiters poll. The wake-up is the last command, so nothing is left half done.
CLUSTER_SCRIPTS = ScriptSet("redis.pcall('SPUBLISH',")
#: How DEBUG lines name a script sent by EVALSHA (of either set).
_SCRIPT_NAMES = {script.sha: script.name for script in NODE_SCRIPTS.all + CLUSTER_SCRIPTS.all}

#: Bound for socket reads and connects when the client's settings leave them unbounded; a request's
#: own timeout (``timeout_s``) is applied to waiting for its reply.
MAX_SOCKET_TIMEOUT_S = 5.0

#: Error replies by their first word. Transient: the command did not run, and waiting may fix it.
#: Everything else that is not listed (NOPERM, NOAUTH, ERR ...) is refused for good.
_TRANSIENT_REPLIES = frozenset({"BUSY", "LOADING", "READONLY", "MASTERDOWN", "TRYAGAIN", "OOM", "CLUSTERDOWN"})


#: Error replies that only a server in cluster mode gives.
_CLUSTER_REPLIES = frozenset({"MOVED", "ASK", "CROSSSLOT"})


def reply_code(redis: Any, error: Exception) -> str:
    """The code of an error reply (``TRYAGAIN``, ``MOVED``, ``NOPERM``, ...). redis-py's parser takes the
    code off the message of each reply it has an exception class for (``TRYAGAIN Multiple keys request
    during rehashing of slot`` arrives as ``TryAgainError("Multiple keys request ...")``), so for those the
    class says it; for the others, the message's first word."""
    exceptions = redis.exceptions
    # Subclasses before their bases: MovedError is an AskError, MasterDownError a ClusterDownError.
    for kind, code in ((exceptions.MovedError, "MOVED"), (exceptions.AskError, "ASK"),
                       (exceptions.MasterDownError, "MASTERDOWN"), (exceptions.ClusterDownError, "CLUSTERDOWN"),
                       (exceptions.TryAgainError, "TRYAGAIN"), (exceptions.ClusterCrossSlotError, "CROSSSLOT"),
                       (exceptions.ReadOnlyError, "READONLY"), (exceptions.OutOfMemoryError, "OOM"),
                       (exceptions.NoPermissionError, "NOPERM")):
        if isinstance(error, kind):
            return code
    return str(error).split(" ", 1)[0]


def _cluster_node_message(where: str, reply: str) -> str:
    return (f"the Redis server at {where} is a Redis Cluster node ({reply}): connect with "
            "RedisClient('redis+cluster://host:port'), or pass a redis.cluster.RedisCluster")


#: Connection settings the store sets itself on every connection (see ``RedisStore.new_connection``),
#: or redis-py's own defaults objects: not given to the renewal process, which makes its own.
_RENEWAL_RESET_SETTINGS = frozenset({"retry", "retry_on_error", "retry_on_timeout", "decode_responses",
                                     "himport_registry", "driver_info"})


def lease_key(table: str, key: str) -> bytes:
    """The Redis key of the lease on ``key`` in lock table ``table``."""
    return f"{PREFIX}:{table}:lease:".encode() + key.encode("utf-8")


def fence_key(table: str, key: str) -> bytes:
    """The Redis key of the fencing counter of ``key`` in lock table ``table`` (it never expires; an
    idempotent call's completion deletes it)."""
    return f"{PREFIX}:{table}:fence:".encode() + key.encode("utf-8")


def record_key(table: str, key: str) -> bytes:
    """The Redis key of the idempotency record of ``key`` in record table ``table``."""
    return f"{PREFIX}:{table}:record:".encode() + key.encode("utf-8")


def release_channel(table: str, key: str) -> bytes:
    """The pub/sub channel that releases of ``key`` in lock table ``table`` are published on."""
    return f"{PREFIX}:{table}:released:".encode() + key.encode("utf-8")


class NodeLayout:
    """Where a single-node store keeps a key's lease, fencing counter, idempotency record and release
    channel: the functions above. The cluster store has its own (``redis_cluster.ClusterLayout``)."""

    lease = staticmethod(lease_key)
    fence = staticmethod(fence_key)
    record = staticmethod(record_key)
    channel = staticmethod(release_channel)


def _text(value: Any) -> Any:
    return value.decode("utf-8") if isinstance(value, bytes) else value


def _fields(reply: Any) -> dict[str, Any]:
    """HGETALL's reply (a flat list in RESP2, a map in RESP3) as a dict of str -> bytes or str."""
    if isinstance(reply, dict):
        return {_text(name): value for name, value in reply.items()}
    return {_text(reply[i]): reply[i + 1] for i in range(0, len(reply) - 1, 2)}


def _integer(value: Any) -> Any:
    """A stored decimal integer as an int; anything else is returned as it is, so that the engine's
    row check names it and fails closed."""
    text = _text(value)
    if isinstance(text, str) and text.isascii() and text.isdigit() and len(text) <= 20:
        return int(text)
    return text


def _row(reply: Any, key: str) -> Optional[LockRow]:
    fields = _fields(reply)
    if not fields:
        return None
    try:
        owner, version = _text(fields.get("owner")), _text(fields.get("version"))
    except UnicodeDecodeError as error:
        raise MalformedLockRow(f"lock row for {key!r} has an owner or version that is not UTF-8", key=key) from error
    waiting = fields.get("waiting")
    flag: Any = False if waiting is None else (True if _text(waiting) == "1" else _text(waiting))
    fence = fields.get("fence")
    return LockRow(
        owner, version, _integer(fields.get("lease_ms")), _integer(fields.get("protocol")), flag,
        None if fence is None else _integer(fence),
    )


def load_redis() -> Any:
    """The redis-py package (an optional dependency), or ImportError naming the extra to install."""
    try:
        import redis
        import redis.backoff
        import redis.cluster
        import redis.retry
    except ImportError as error:
        raise ImportError("the Redis store needs redis-py: pip install 'fastlease[redis]'") from error
    return redis


class RedisStore:
    """The LockStore adapter for one Redis server: one script per protocol step (one HGETALL per record read)."""

    blocking = True
    layout: Any = NodeLayout
    scripts = NODE_SCRIPTS

    def __init__(self, connection_pool: Any) -> None:
        # redis-py, or, in the renewal process, ``_resp.library``: the stand-in of our own connection
        # (``_resp.ConnectionPool``), which has the members of redis-py's that this store uses.
        self._redis = getattr(connection_pool, "library", None) or load_redis()
        # The pool's settings only: requests never check connections out of it (see new_connection).
        self.connection_class = connection_pool.connection_class
        self.connection_kwargs = connection_pool.connection_kwargs
        self._local = threading.local()  # this thread's connection
        self._connections: "weakref.WeakSet[Any]" = weakref.WeakSet()  # every one made, for close()
        self._connections_lock = threading.Lock()
        self._closed = False
        #: What a request raises on NOSCRIPT (the script did not run): see run_script.
        self.no_script: Any = self._redis.exceptions.NoScriptError
        # Waiters are woken by it; the renewal process, whose store has our own connection, never waits.
        own = self._redis is _resp.library
        self.release_feed: Optional[ListenerFeed] = None if own else RedisReleaseFeed(self)

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
        if redis is not _resp.library:  # (ours never retries, and speaks RESP2 with replies as bytes)
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
        otherwise (``fastlease.stores.redis_cluster``), and a client of each layout could hold one key at
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
            raise StoreRequestRejected(_cluster_node_message(self.describe(), "INFO says cluster_enabled:1"))

    def call(self, key: str, timeout_s: float, *command: Any) -> Any:
        """Send one command and read its reply within ``timeout_s``. Errors become StoreError (with
        ``maybe_committed`` when the command may have run), StoreRequestRejected, or MalformedLockRow
        (WRONGTYPE: the key holds something that is not a lease). Logged at DEBUG: the command (a
        script by its name), the key and the outcome."""
        if not _log.isEnabledFor(logging.DEBUG):
            return self._call(key, timeout_s, command)
        name = _SCRIPT_NAMES.get(command[1], "EVALSHA") if command[0] == b"EVALSHA" else _text(command[0])
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
        if code in _CLUSTER_REPLIES:
            return StoreRequestRejected(_cluster_node_message(self.describe(), text), key=key)
        if code in _TRANSIENT_REPLIES:
            return StoreError(f"Redis could not run the request on {key!r} now: {text}", key=key)
        return StoreRequestRejected(f"Redis refused the request on {key!r} ({self.describe()}): {text}", key=key)

    def run_script(
        self, script: _Script, key: str, timeout_s: float, keys: tuple[bytes, ...], args: tuple[Any, ...]
    ) -> object:
        """EVALSHA; on NOSCRIPT (the script did not run) SCRIPT LOAD and EVALSHA once more. A second
        NOSCRIPT (a SCRIPT FLUSH in between, or on a cluster, the slot moved to a node without it) is a
        transient StoreError: nothing ran, and the engine tries again."""
        command = (b"EVALSHA", script.sha, len(keys), *keys, *args)
        try:
            return self.call(key, timeout_s, *command)
        except self.no_script as missing:
            loaded = _text(self.load_script(script, key, timeout_s, missing))
        if loaded != script.sha.decode():
            raise StoreRequestRejected(f"Redis loaded script {script.name} as {loaded!r}, not its SHA1", key=key)
        try:
            return self.call(key, timeout_s, *command)
        except self.no_script:
            raise StoreError(f"Redis lost script {script.name} right after loading it (SCRIPT FLUSH, or a slot "
                             f"that moved); it did not run on {key!r}", key=key) from None

    def load_script(self, script: _Script, key: str, timeout_s: float, missing: Exception) -> Any:
        """SCRIPT LOAD where the NOSCRIPT reply ``missing`` came from (here: the server); its reply, the SHA1."""
        return self.call(key, timeout_s, b"SCRIPT", b"LOAD", script.source)

    # ---- the LockStore operations --------------------------------------------------------------
    def put_if_absent(
        self, table: str, key: str, owner: str, version: str, lease_ms: int, timeout_s: float, usage: UsageMeter
    ) -> int:
        """The ACQUIRE script: create the lease (PX ``lease_ms``) if the key is absent. The new fencing
        token from the key's counter, else False."""
        keys = (self.layout.lease(table, key), self.layout.fence(table, key))
        return _token(self.run_script(self.scripts.acquire, key, timeout_s, keys, (owner, version, lease_ms)), key)

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
    ) -> int:
        """The TAKE_OVER script: replace the whole lease only if it holds exactly (expected_owner,
        expected_version). The new fencing token, else False."""
        keys = (self.layout.lease(table, key), self.layout.fence(table, key))
        args = (expected_owner, expected_version, owner, version, lease_ms)
        return _token(self.run_script(self.scripts.take_over, key, timeout_s, keys, args), key)

    def update_version_if(
        self, table: str, key: str, owner: str, version: str, new_version: str, timeout_s: float, usage: UsageMeter
    ) -> bool:
        """The RENEW script: a new version and a fresh PX, only on exactly (owner, version); True if it ran."""
        lease = (self.layout.lease(table, key),)
        return self.run_script(self.scripts.renew, key, timeout_s, lease, (owner, version, new_version)) == 1

    def mark_waiting(
        self, table: str, key: str, owner: str, version: str, timeout_s: float, usage: UsageMeter
    ) -> bool:
        """The MARK_WAITING script: set the hint once per hold, only on exactly (owner, version); True if it
        did. The PX is left alone."""
        lease = (self.layout.lease(table, key),)
        return self.run_script(self.scripts.mark_waiting, key, timeout_s, lease, (owner, version)) == 1

    def delete_if_owner(
        self, table: str, key: str, owner: str, timeout_s: float, usage: UsageMeter
    ) -> Optional[LockRow]:
        """The RELEASE script: delete the lease only if ``owner`` holds it, and publish the release. A row
        that carries only the old ``waiting`` hint (all the contract requires), else None."""
        reply = self.run_script(self.scripts.release, key, timeout_s, (self.layout.lease(table, key),),
                                (owner, self.layout.channel(table, key)))
        if not reply:
            return None
        return LockRow(owner, "", 0, 0, reply == 2)  # the store contract: only the hint is read

    def read(self, table: str, key: str, timeout_s: float, usage: UsageMeter) -> Optional[LockRow]:
        """The OBSERVE script: the row, or None if the key is absent. Fields are returned as stored for
        ``check_row`` to judge; an owner or version that is not UTF-8 raises MalformedLockRow. The lease's
        PTTL goes to the release feed, which wakes this client's waiters on the key when it expires: a
        crashed holder is taken over at its lease's end, not at the next poll."""
        reply = self.run_script(self.scripts.observe, key, timeout_s, (self.layout.lease(table, key),), ())
        if not isinstance(reply, list) or len(reply) != 2:
            raise MalformedLockRow(f"Redis OBSERVE of {key!r} gave {reply!r:.100}, not [fields, pttl]", key=key)
        row = _row(reply[0], key)
        ttl_ms = reply[1]
        if row is not None and type(ttl_ms) is int and ttl_ms > 0 and self.release_feed is not None:
            self.release_feed.wake_at_expiry(self.layout.channel(table, key), ttl_ms / 1000)
        return row

    # ---- idempotency records ------------------------------------------------------------------
    max_result_bytes = 100_000_000  # Redis takes values up to 512 MB; this keeps a reply reasonable

    def read_record(self, table: str, key: str, timeout_s: float) -> Optional[Record]:
        """HGETALL of the record of ``key`` in record table ``table``: the Record, or None.
        MalformedLockRow if a field is missing or mistyped."""
        fields = _fields(self.call(key, timeout_s, b"HGETALL", self.layout.record(table, key)))
        if not fields:
            return None
        expires = _integer(fields.get("expires_at_ms"))
        state, fingerprint, owner = (_text(fields.get(name)) for name in ("state", "fingerprint", "owner"))
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
        on the server's clock), delete the lease and its fencing counter, and publish the release. False
        if that owner does not hold it."""
        px = 0
        if record.expires_at_ms:
            px = max(1, record.expires_at_ms - now_ms)  # native expiry: the time left, not a clock reading
        layout = self.layout
        keys = (layout.lease(lock_table, key), layout.record(table, key), layout.fence(lock_table, key))
        args = (record.owner, record.state, record.fingerprint, record.result, record.expires_at_ms, px,
                layout.channel(lock_table, key))
        return self.run_script(self.scripts.finish, key, timeout_s, keys, args) == 1

    # ---- the renewal process (fastlease._renewal_link) -------------------------------------------------
    def renewal_config(self) -> Any:
        """The pool's connection settings for another process (address or unix socket, db, username
        and password, TLS and its options, timeouts), or why they cannot be given there: a setting
        that is a live object (a credential provider, a connect callback, an SSL context, ...)."""
        portable = self.portable_settings()
        return portable if isinstance(portable, str) else ("redis", *portable)

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
                defaults = _constructor_defaults(kind)
            if name in defaults and value is defaults[name]:
                continue  # the connection class's own default (redis-py 8's socket_keepalive_options sentinel)
            try:
                pickle.loads(pickle.dumps(value))
            except Exception:  # noqa: BLE001 - any failure means: not reproducible
                return f"the Redis setting {name}={type(value).__name__} cannot be given to another process"
            return f"the Redis setting {name}={type(value).__name__} is an object, not a plain value"
        return known[kind], settings

    @classmethod
    def from_renewal_config(cls, config: Any) -> RedisStore:
        """A store with the connection settings ``renewal_config()`` gave (in the renewal process): on
        our own connection (``_resp``) when it honours every setting, which spares the renewal process
        redis-py's memory; else on redis-py's."""
        kind, settings = config[1], config[2]
        if _resp.honours(settings):
            return cls(_resp.ConnectionPool(kind, settings))
        redis = load_redis()
        return cls(redis.ConnectionPool(connection_class=connection_kind(kind), **settings))

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
                if _text(cursor) in ("0", 0):
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


def _constructor_defaults(kind: Any) -> dict[str, Any]:
    """The default of each keyword of a redis-py connection class's constructor, along its MRO."""
    defaults: dict[str, Any] = {}
    for cls in reversed(kind.__mro__):
        init = cls.__dict__.get("__init__")
        code = getattr(init, "__code__", None)
        if code is None:
            continue
        names = code.co_varnames[:code.co_argcount]
        defaults.update(zip(names[len(names) - len(init.__defaults__ or ()):], init.__defaults__ or ()))
        defaults.update(init.__kwdefaults__ or {})
    return defaults


def connection_kind(name: str) -> Any:
    """The redis-py connection class that ``portable_settings`` named."""
    connection = load_redis().connection
    return {"tcp": connection.Connection, "ssl": connection.SSLConnection,
            "unix": connection.UnixDomainSocketConnection}[name]


def _token(reply: object, key: str) -> int:
    """A script's fencing token reply: 0 (not applied) -> False, else the token."""
    if type(reply) is not int or reply < 0:
        raise MalformedLockRow(f"Redis fencing counter of {key!r} gave {reply!r}, not a positive int", key=key)
    return reply if reply else False


# ---------------------------------------------------------------------------------------------
# Wake-up on release
# ---------------------------------------------------------------------------------------------
def pubsub_event(reply: Any) -> tuple[str, bytes]:
    """(kind, channel) of a pub/sub reply (``message``, ``subscribe``, ...; ``smessage``, ``ssubscribe``, ...
    on a cluster), or ("", b"") for anything else, which matches no channel."""
    if not isinstance(reply, list) or len(reply) != 3:
        return "", b""
    name = reply[1]
    return _text(reply[0]), name.encode("utf-8") if isinstance(name, str) else name


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

    def watch(self, table: str, key: str, wake: Callable[[], None]) -> Watch:
        """Call ``wake()`` (on the listener thread; it must be quick and never raise) whenever the
        key is released, until ``unwatch``. Never raises and never waits."""
        return self._watch(release_channel(table, key), wake)

    def subscribed(self, table: str, key: str) -> bool:
        """True once the server has confirmed our subscription to ``key``'s releases."""
        with self._lock:
            channel = self._channels.get(release_channel(table, key))
            return channel is not None and channel.subscribed and channel.ready.is_set()

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

    def _read(self, connection: Any) -> None:
        if connection.can_read(timeout=LISTENER_TICK_S):
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
        kind, name = pubsub_event(reply)
        with self._lock:
            channel = self._channels.get(name)
            if channel is None:
                return
            if kind == "message":
                wakes = list(channel.watchers.values())
            else:  # "subscribe" / "unsubscribe": the server confirms one of our commands
                channel.outstanding = max(0, channel.outstanding - 1)
                if channel.outstanding == 0 and channel.subscribed:
                    channel.ready.set()
                return
        self._wake_all(wakes)


