"""The Redis locks fastlease is compared with, behind one shape: ``GUARDS[name](redis_client, key)`` is a
context manager that holds the lock, or raises ``NotAcquired`` after a 5 s wait. Lease 30 s everywhere.

* ``redis-py``: redis-py's own ``Lock`` (SET NX PX; blocking acquire polls every 0.1 s, its default);
* ``redis_lock``: python-redis-lock 4.0.1 (SET NX EX; waiters block on a signal list, woken by BLPOP);
* ``article``: the seed article's hand-written lock, made synchronous: SET NX PX, polling every 50 ms,
  and a Lua compare-and-delete on release (EVAL, as the article writes it).

On a Redis Cluster the peer is redis-py's ``Lock`` on a ``redis.cluster.RedisCluster``
(:func:`cluster_client`), with redis-py's cluster defaults: the same guard, the same calls.
"""

from __future__ import annotations

import time
import uuid
from contextlib import contextmanager
from typing import Any, Callable, Iterator

LEASE_S = 30
WAIT_S = 5.0


def cluster_client(url: str) -> Any:
    """A ``redis.cluster.RedisCluster`` on the nodes of a ``redis+cluster://host:port,host:port`` URL
    (what ``fastlease.testing.redis_cluster.RedisClusterServer.url`` gives)."""
    from redis.cluster import ClusterNode, RedisCluster

    scheme, _, nodes = url.partition("://")
    if scheme != "redis+cluster" or not nodes:
        raise ValueError(f"expected a redis+cluster://host:port[,host:port...] URL, got {url!r}")
    startup = [ClusterNode(host, int(port)) for host, _, port in (node.rpartition(":") for node in nodes.split(","))]
    return RedisCluster(startup_nodes=startup)


class NotAcquired(Exception):
    """The lock was not acquired within WAIT_S."""


@contextmanager
def redis_py_lock(client: Any, key: str) -> Iterator[None]:
    import redis.exceptions

    lock = client.lock(f"redis-py:{key}", timeout=LEASE_S, blocking_timeout=WAIT_S)
    try:
        acquired = lock.acquire()
    except redis.exceptions.LockError as error:
        raise NotAcquired(str(error)) from error
    if not acquired:
        raise NotAcquired(key)
    try:
        yield
    finally:
        lock.release()


@contextmanager
def python_redis_lock(client: Any, key: str) -> Iterator[None]:
    import redis_lock

    lock = redis_lock.Lock(client, f"redis_lock:{key}", expire=LEASE_S)
    if not lock.acquire(blocking=True, timeout=WAIT_S):
        raise NotAcquired(key)
    try:
        yield
    finally:
        lock.release()


_ARTICLE_RELEASE = """
    if redis.call('get', KEYS[1]) == ARGV[1] then
        return redis.call('del', KEYS[1])
    else
        return 0
    end
"""


@contextmanager
def article_lock(client: Any, key: str) -> Iterator[None]:
    name, value = f"lock:{key}", str(uuid.uuid4())
    deadline = time.monotonic() + WAIT_S
    while not client.set(name, value, nx=True, px=LEASE_S * 1000):
        if time.monotonic() > deadline:
            raise NotAcquired(key)
        time.sleep(0.05)
    try:
        yield
    finally:
        client.eval(_ARTICLE_RELEASE, 1, name, value)


#: How many holders the hand-built semaphore admits (bench/semaphore.py's limit).
SEMAPHORE_LIMIT = 3


@contextmanager
def redis_py_semaphore(client: Any, key: str) -> Iterator[None]:
    """A semaphore built by hand from SEMAPHORE_LIMIT redis-py ``Lock``s, as users of redis-py build one:
    try each lock without blocking, and sleep redis-py's own 0.1 s between rounds."""
    locks = [client.lock(f"redis-py-semaphore:{key}:{slot}", timeout=LEASE_S) for slot in range(SEMAPHORE_LIMIT)]
    deadline = time.monotonic() + WAIT_S
    while True:
        held = next((lock for lock in locks if lock.acquire(blocking=False)), None)
        if held is not None:
            break
        if time.monotonic() > deadline:
            raise NotAcquired(key)
        time.sleep(0.1)
    try:
        yield
    finally:
        held.release()


GUARDS: dict[str, Callable[[Any, str], Any]] = {
    "redis-py-semaphore": redis_py_semaphore,
    "redis-py": redis_py_lock,
    "redis_lock": python_redis_lock,
    "article": article_lock,
}
