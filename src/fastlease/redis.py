"""The Redis client: leases on a Redis server, with fencing tokens and release wake-ups."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Union

from .client import LeaseClient
from .stores.redis.cluster import RedisClusterStore
from .stores.redis.replies import load_redis
from .stores.redis.store import RedisStore

if TYPE_CHECKING:
    import redis

    from ._engine import Clock

__all__ = ["RedisClient"]


class RedisClient(LeaseClient):
    """A lease client on a Redis server.

    ``RedisClient("redis://127.0.0.1:6379/0")`` or ``RedisClient(redis.Redis(...))`` (its connection
    pool's settings are used: address, database, credentials, TLS, timeouts). The lock table is a
    namespace in the key names; nothing needs creating. Nothing is sent until the first lease.

    On a Redis Cluster: ``RedisClient("redis+cluster://host:port,host:port")`` (``rediss+cluster://``
    with TLS; any one reachable node is enough, more make the start independent of one node) or
    ``RedisClient(redis.cluster.RedisCluster(...))`` (its nodes and connection settings are used). Keys
    are then laid out with a hash tag (``docs/protocol.md``), and every request goes to its slot's node.

    ``lease.fencing_token`` is a per-key counter that strictly increases with every acquisition and
    takeover: pass it to the resource you protect and have it refuse writes with a lower token. There
    is no ``check_in``: Redis has no transaction that can join your other writes.
    """

    store: RedisStore

    def __init__(self, redis_or_url: Union[str, redis.Redis], *, clock: Optional[Clock] = None,
                 wake_on_release: bool = True, **engine: Any) -> None:
        redis = load_redis()
        self.store: RedisStore
        if isinstance(redis_or_url, str) and redis_or_url.split("://", 1)[0] in CLUSTER_SCHEMES:
            self.redis = None
            self.store = _cluster_store_from_url(redis_or_url)
        elif isinstance(redis_or_url, str):
            try:
                self.redis = redis.Redis.from_url(redis_or_url)
            except ValueError as error:
                raise ValueError(f"RedisClient: bad Redis URL {_safe_url(redis_or_url)!r}: {error}; a Redis "
                                 "Cluster takes redis+cluster://host:port[,host:port...] (rediss+cluster:// with "
                                 "TLS)") from None
            self.store = RedisStore(self.redis.connection_pool)
        elif isinstance(redis_or_url, redis.Redis):
            self.redis = redis_or_url
            self.store = RedisStore(redis_or_url.connection_pool)
        elif isinstance(redis_or_url, redis.cluster.RedisCluster):
            self.redis = redis_or_url
            self.store = _cluster_store_from_client(redis_or_url)
        elif type(redis_or_url).__module__.startswith("redis.asyncio"):
            raise TypeError(
                f"RedisClient takes a sync redis.Redis or redis.cluster.RedisCluster client (or a redis:// URL), got "
                f"{type(redis_or_url).__name__} from redis.asyncio: fastlease's async API (DistributedLock, async "
                "decorators) runs the sync client on worker threads, so one client serves both. Pass redis.Redis(...) "
                "(or redis.cluster.RedisCluster(...)) with the same settings"
            )
        else:
            raise TypeError(
                "RedisClient takes a redis:// or redis+cluster:// URL, a redis.Redis or a redis.cluster.RedisCluster, "
                f"got {type(redis_or_url).__name__}"
            )
        if type(wake_on_release) is not bool:
            raise TypeError(f"wake_on_release must be a bool, got {wake_on_release!r}")
        super().__init__(self.store, clock=clock, **engine)
        self.engine.release_feed = self.store.release_feed if wake_on_release else None
        # Waiters queue in the store's line of waiters per key, each woken alone on its turn by the feed.
        self.engine.line = self.store if wake_on_release else None

    def __repr__(self) -> str:
        return f"RedisClient({self.store.describe()})"

    def _observation_scope(self) -> str:
        return f"redis:{self.store.describe()}"  # "redis:cluster host:port,..." on a cluster

    def inspect(self, table: str, key: Optional[str] = None) -> list[dict[str, Any]]:
        return self.store.inspect(table, key)

    def _check_in(self, lease: Any, transaction: Any) -> None:
        raise TypeError(
            "RedisClient has no check_in: Redis has no transaction that can join your other writes. "
            "Pass lease.fencing_token to the resource you write and have it refuse lower tokens"
        )

    def close(self) -> None:
        super().close()
        self.store.close()


#: URL schemes that select a Redis Cluster (TCP, and TLS).
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def _cluster_store_from_url(url: str) -> RedisClusterStore:
    """``redis+cluster://[user:password@]host:port[,host:port...][/0][?option=value...]``: the nodes to
    start from, and the settings of every connection (as redis-py parses them from a redis:// URL).
    Nothing is sent: the slot map is fetched on the first request."""
    from urllib.parse import urlsplit

    redis = load_redis()
    scheme, _, rest = url.partition("://")
    parts = urlsplit(f"{CLUSTER_SCHEMES[scheme]}://{rest}")
    credentials, _, hosts = parts.netloc.rpartition("@")
    nodes = []
    for node in hosts.split(","):
        host, colon, port = node.rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"RedisClient: bad node {node!r} in Redis Cluster URL {_safe_url(url)!r}: write each "
                             "as host:port, separated by commas (redis+cluster://10.0.0.1:6379,10.0.0.2:6379)")
        nodes.append((host.strip("[]"), int(port)))
    first = f"{CLUSTER_SCHEMES[scheme]}://{credentials + '@' if credentials else ''}{hosts.split(',')[0]}"
    try:
        settings = redis.connection.parse_url(first + parts.path + (f"?{parts.query}" if parts.query else ""))
    except ValueError as error:
        raise ValueError(f"RedisClient: bad Redis URL {_safe_url(url)!r}: {error}") from None
    if settings.pop("db", 0) not in (0, None):
        raise ValueError(f"RedisClient: Redis Cluster has only database 0, and {_safe_url(url)!r} names another: "
                         "drop the /N path (use a lock table name to keep namespaces apart)")
    connection_class = settings.pop("connection_class", redis.connection.Connection)
    return RedisClusterStore(nodes, connection_class, settings)


def _cluster_store_from_client(client: Any) -> RedisClusterStore:
    """The nodes and connection settings of a redis-py RedisCluster (one of its node pools)."""
    nodes = client.get_nodes()
    pool = next(node.redis_connection.connection_pool for node in nodes if node.redis_connection is not None)
    primaries = [(node.host, node.port) for node in nodes if node.server_type == "primary"]
    startup = [(node.host, node.port) for node in client.nodes_manager.startup_nodes.values()]
    return RedisClusterStore(list(dict.fromkeys(primaries + startup)), pool.connection_class, pool.connection_kwargs,
                             address_remap=client.nodes_manager.address_remap)


def _safe_url(url: str) -> str:
    """The URL without its password, for messages."""
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest:
        credentials, _, host = rest.rpartition("@")
        return f"{scheme}://{credentials.split(':', 1)[0]}:***@{host}" if ":" in credentials else url
    return url
