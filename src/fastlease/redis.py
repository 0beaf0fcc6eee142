"""The Redis client: leases on a Redis server, with fencing tokens and release wake-ups."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Union

from .client import LeaseClient
from .stores.redis import RedisStore, load_redis

if TYPE_CHECKING:
    import redis

    from ._engine import Clock

__all__ = ["RedisClient"]


class RedisClient(LeaseClient):
    """A lease client on a Redis server.

    ``RedisClient("redis://127.0.0.1:6379/0")`` or ``RedisClient(redis.Redis(...))`` (its connection
    pool's settings are used: address, database, credentials, TLS, timeouts). The lock table is a
    namespace in the key names; nothing needs creating. Nothing is sent until the first lease.

    ``lease.fencing_token`` is a per-key counter that strictly increases with every acquisition and
    takeover: pass it to the resource you protect and have it refuse writes with a lower token. There
    is no ``check_in``: Redis has no transaction that can join your other writes.
    """

    store: RedisStore

    def __init__(self, redis_or_url: Union[str, redis.Redis], *, clock: Optional[Clock] = None,
                 wake_on_release: bool = True, **engine: Any) -> None:
        redis = load_redis()
        if isinstance(redis_or_url, str):
            try:
                client = redis.Redis.from_url(redis_or_url)
            except ValueError as error:
                raise ValueError(f"RedisClient: bad Redis URL {_safe_url(redis_or_url)!r}: {error}") from None
        elif isinstance(redis_or_url, redis.Redis):
            client = redis_or_url
        elif type(redis_or_url).__module__.startswith("redis.asyncio"):
            raise TypeError(
                f"RedisClient takes a sync redis.Redis client (or a redis:// URL), got {type(redis_or_url).__name__} "
                "from redis.asyncio: fastlease's async API (DistributedLock, async decorators) runs the sync client "
                "on worker threads, so one client serves both. Pass redis.Redis(...) with the same settings"
            )
        else:
            raise TypeError(
                "RedisClient takes a redis:// URL or a redis.Redis client, got "
                f"{type(redis_or_url).__name__}" + (" (Redis Cluster is not supported)"
                                                    if "Cluster" in type(redis_or_url).__name__ else "")
            )
        if type(wake_on_release) is not bool:
            raise TypeError(f"wake_on_release must be a bool, got {wake_on_release!r}")
        self.redis = client
        self.store = RedisStore(client.connection_pool)
        super().__init__(self.store, clock=clock, **engine)
        self.engine.release_feed = self.store.release_feed if wake_on_release else None

    def __repr__(self) -> str:
        return f"RedisClient({self.store.describe()})"

    def _observation_scope(self) -> str:
        return f"redis:{self.store.describe()}"

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


def _safe_url(url: str) -> str:
    """The URL without its password, for messages."""
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest:
        credentials, _, host = rest.rpartition("@")
        return f"{scheme}://{credentials.split(':', 1)[0]}:***@{host}" if ":" in credentials else url
    return url
