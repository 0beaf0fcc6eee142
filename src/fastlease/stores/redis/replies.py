"""Redis replies as the stores read them (a lease row, a fencing token, an error's code), and redis-py,
loaded when a client is made (an optional dependency)."""

from __future__ import annotations

from ...exceptions import MalformedLockRow
from ..base import HANDED_OVER, NOT_DELETED, LockRow

# typing is not imported at run time: the renewal process imports this module (see _typing.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional

#: Error replies by their first word. Transient: the command did not run, and waiting may fix it.
#: Everything else that is not listed (NOPERM, NOAUTH, ERR ...) is refused for good.
TRANSIENT_REPLIES = frozenset({"BUSY", "LOADING", "READONLY", "MASTERDOWN", "TRYAGAIN", "OOM", "CLUSTERDOWN"})


#: Error replies that only a server in cluster mode gives.
CLUSTER_REPLIES = frozenset({"MOVED", "ASK", "CROSSSLOT"})


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


def cluster_node_message(where: str, reply: str) -> str:
    return (f"the Redis server at {where} is a Redis Cluster node ({reply}): connect with "
            "RedisClient('redis+cluster://host:port'), or pass a redis.cluster.RedisCluster")


#: Connection settings the store sets itself on every connection (see ``RedisStore.new_connection``),


def as_text(value: Any) -> Any:
    return value.decode("utf-8") if isinstance(value, bytes) else value


def hash_fields(reply: Any) -> dict[str, Any]:
    """HGETALL's reply (a flat list in RESP2, a map in RESP3) as a dict of str -> bytes or str."""
    if isinstance(reply, dict):
        return {as_text(name): value for name, value in reply.items()}
    return {as_text(reply[i]): reply[i + 1] for i in range(0, len(reply) - 1, 2)}


def stored_integer(value: Any) -> Any:
    """A stored decimal integer as an int; anything else is returned as it is, so that the engine's
    row check names it and fails closed."""
    text = as_text(value)
    if isinstance(text, str) and text.isascii() and text.isdigit() and len(text) <= 20:
        return int(text)
    return text


def lock_row(reply: Any, key: str) -> Optional[LockRow]:
    fields = hash_fields(reply)
    if not fields:
        return None
    try:
        owner, version = as_text(fields.get("owner")), as_text(fields.get("version"))
    except UnicodeDecodeError as error:
        raise MalformedLockRow(f"lock row for {key!r} has an owner or version that is not UTF-8", key=key) from error
    waiting = fields.get("waiting")
    flag: Any = False if waiting is None else (True if as_text(waiting) == "1" else as_text(waiting))
    fence = fields.get("fence")
    return LockRow(
        owner, version, stored_integer(fields.get("lease_ms")), stored_integer(fields.get("protocol")), flag,
        None if fence is None else stored_integer(fence),
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



def constructor_defaults(kind: Any) -> dict[str, Any]:
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


def fencing_token(reply: object, key: str) -> Optional[int]:
    """A script's fencing token reply: 0 (not applied) -> None, else the token."""
    if type(reply) is not int or reply < 0:
        raise MalformedLockRow(f"Redis fencing counter of {key!r} gave {reply!r}, not a positive int", key=key)
    return reply if reply else None


def deletion(reply: object, key: str) -> int:
    """The RELEASE script's reply, which is already the store's answer (``NOT_DELETED``, ``DELETED``,
    ``DELETED_WITH_WAITERS`` or ``HANDED_OVER``); anything else means the script on the server is not ours."""
    if type(reply) is not int or not NOT_DELETED <= reply <= HANDED_OVER:
        raise MalformedLockRow(f"Redis RELEASE of {key!r} gave {reply!r:.100}, not 0, 1, 2 or 3", key=key)
    return reply



def pubsub_event(reply: Any) -> tuple[str, bytes, Any]:
    """(kind, channel, payload) of a pub/sub reply (``message``, ``subscribe``, ...; ``smessage``,
    ``ssubscribe``, ... on a cluster), or ("", b"", None) for anything else, which matches no channel. A
    message's payload is the waiter it names, or b"1"."""
    if not isinstance(reply, list) or len(reply) != 3:
        return "", b"", None
    name = reply[1]
    return as_text(reply[0]), name.encode("utf-8") if isinstance(name, str) else name, reply[2]

