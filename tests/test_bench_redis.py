"""bench/redis_cycle.py counts round trips for real: each reply the cycling thread reads from a redis-py
connection, so a request more or less shows in the count. Checked on the Redis Cluster rows: fastlease's
cluster store and redis-py's ``Lock`` on a ``redis.cluster.RedisCluster``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import redis_cycle  # noqa: E402
import redis_peers  # noqa: E402

from fastlease.redis import RedisClient  # noqa: E402

WARM_UP_CYCLES = 10  # connections, the slot map, the scripts' first load
COUNTED_CYCLES = 20


def counted(cycle: Callable[[], None]) -> float:
    for _ in range(WARM_UP_CYCLES):
        cycle()
    return redis_cycle.round_trips(cycle, COUNTED_CYCLES)


def test_a_cluster_cycle_is_two_round_trips_for_fastlease_and_redis_py_lock(redis_cluster_url: str) -> None:
    client = RedisClient(redis_cluster_url, _engine_module=redis_cycle.compiled)
    peer = redis_peers.cluster_client(redis_cluster_url)
    try:
        assert counted(redis_cycle.fastlease_cycle(client, "counted")) == 2.0
        lock_cycle = redis_cycle.peer_cycle("redis-py", peer)
        assert counted(lock_cycle) == 2.0

        def with_a_third_request() -> None:
            lock_cycle()
            peer.get("counted-extra")  # one key: one node, one round trip

        assert counted(with_a_third_request) == 3.0
    finally:
        client.close()
        peer.close()


def test_the_cluster_peer_takes_only_a_cluster_url() -> None:
    with pytest.raises(ValueError, match="redis\\+cluster://host:port"):
        redis_peers.cluster_client("redis://127.0.0.1:6379/0")
