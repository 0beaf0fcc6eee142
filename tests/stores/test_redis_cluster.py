"""The Redis Cluster store and client on real three-node clusters: the key layout and its slots, 200 keys
held across the nodes, the URL form, the single-node client's refusal of a cluster node, MOVED/ASK/TRYAGAIN
during slot migrations, a node killed or paused, release wake-ups through sharded pub/sub, the DEBUG log and
the command line.

Beside this file: leases across processes (``test_redis_cluster_processes.py``) and the throwaway cluster
itself (``test_redis_cluster_server.py``). The store contract, the idempotency suite and the held-GIL
renewal tests run on the session's cluster elsewhere (``test_contract.py``, ``test_idempotency.py``,
``test_renewal_gil.py``); chaos and benchmarks too. Tests that only read or write keys use the session's
cluster (``redis_cluster_db`` empties it first); tests that migrate slots or pause a node share this
module's own cluster, each on a slot of its own; the test that kills a node has a cluster of its own.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import pytest
import redis
import redis.crc

from fastlease import SyncDistributedLock
from fastlease.exceptions import LockLost, LockNotAcquired, StoreError, StoreRequestRejected
from fastlease.redis import RedisClient
from fastlease.stores.base import Record
from fastlease.stores.redis.cluster import MAX_REDIRECTIONS, ClusterLayout, RedisClusterStore, key_slot
from fastlease.stores.redis.scripts import fence_key, lease_key
from fastlease.testing import NO_USAGE
from fastlease.testing.fixtures import start_or_skip
from fastlease.testing.redis_cluster import RedisClusterServer, RedisClusterUnavailable
from helpers.lock_waiter import Waiter
from helpers.waiting import wait_until

pytestmark = [pytest.mark.server, pytest.mark.posix]  # real redis-server nodes, signalled by PID

BOUND_S = 10.0  # bound for every wait on another thread's or process's state
T = 2.0  # timeout of a direct store request


# ---- fixtures and helpers ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def moving_cluster() -> Iterator[RedisClusterServer]:
    """This module's own cluster, for tests that migrate slots or pause a node (each on slots of its own,
    so they do not disturb one another); skips where a cluster cannot start, fails under CI=true."""
    server = RedisClusterServer()
    try:
        start_or_skip(server, RedisClusterUnavailable, "Redis Cluster")
        yield server
    finally:
        server.stop()


@pytest.fixture
def clients() -> Iterator[Callable[..., RedisClient]]:
    """Build RedisClients; all closed after the test."""
    made: list[RedisClient] = []

    def build(target: Any, **kwargs: Any) -> RedisClient:
        client = RedisClient(target, **kwargs)
        made.append(client)
        return client

    yield build
    for client in made:
        client.close()


def renewing_elsewhere(client: RedisClient) -> RedisClient:
    """``client`` once a renewal of a 1 s lease has been confirmed: its renewal process is running. Its
    start-up, which a loaded machine can stretch past a first lease's validity (that lease is then lost
    safely, as documented), is behind the test."""
    for _ in range(3):  # a lost warm-up lease: the process was slow to start, and is up for the next one
        guard = SyncDistributedLock(client, table="warm_up", key="warm-up", lease_duration=1)
        lease = guard.__enter__()
        wait_until(lambda lease=lease: not lease.is_valid() or lease.metrics.renewals >= 1, 3.0, "the first renewal")
        renewed = lease.is_valid() and lease.metrics.renewals >= 1
        try:
            guard.__exit__(None, None, None)
        except LockLost:
            pass
        if renewed:
            return client
    raise AssertionError("no renewal of a warm-up lease was confirmed")


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])  # nothing listens once the probe is closed


def key_on(server: RedisClusterServer, node: tuple[str, int], prefix: str, avoid: tuple[int, ...] = ()) -> str:
    """The first ``prefix-N`` whose slot the node owns now (and is not in ``avoid``)."""
    for number in range(10_000):
        key = f"{prefix}-{number}"
        if key_slot(key) not in avoid and server.node_for_slot(key_slot(key)) == node:
            return key
    raise AssertionError(f"no key {prefix}-N on {node}")


def other_node(server: RedisClusterServer, node: tuple[str, int]) -> tuple[str, int]:
    return next(candidate for candidate in server.nodes if candidate != node)


def slot_of(name: bytes) -> int:
    """The slot of a Redis key name, by redis-py's own CRC16 (hash tag rules included)."""
    return int(redis.crc.key_slot(name))


def owner_of(server: RedisClusterServer, name: bytes) -> Any:
    """The admin connection to the node that owns the slot of ``name`` now."""
    return server.admin(server.node_for_slot(slot_of(name)))


def stored(server: RedisClusterServer, name: bytes) -> dict[bytes, bytes]:
    """The hash ``name`` on the node that owns its slot now (read there, without redirection)."""
    return dict(owner_of(server, name).hgetall(name))


def fastlease_keys(server: RedisClusterServer) -> dict[tuple[str, int], set[bytes]]:
    """Every key on every node, by node."""
    return {node: set(server.admin(node).keys()) for node in server.nodes}


def asking(server: RedisClusterServer, node: tuple[str, int], *command: Any) -> Any:
    """``command`` on ``node`` after ASKING, on one connection: how a node importing a slot serves it."""
    pipe = server.admin(node).pipeline(transaction=False)
    pipe.execute_command("ASKING")
    pipe.execute_command(*command)
    return pipe.execute()[1]


def keys_in_slot(server: RedisClusterServer, node: tuple[str, int], slot: int) -> set[bytes]:
    """The keys of ``slot`` that ``node`` holds (during a migration, each key is on one of two nodes)."""
    return set(server.admin(node).execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100))


def rejected(server: RedisClusterServer, node: tuple[str, int], command: str) -> int:
    """How often the node refused ``command`` before running it (MOVED, ASK, TRYAGAIN, ...) since its last
    CONFIG RESETSTAT."""
    stats = server.admin(node).info("commandstats").get(f"cmdstat_{command}", {})
    return int(stats.get("rejected_calls", 0))


def woken_by_a_release(holder: RedisClient, waiter_client: RedisClient, key: str,
                       held: Optional[SyncDistributedLock] = None, waiter: Optional[Waiter] = None,
                       rounds: int = 3) -> float:
    """Release ``key`` to a waiter of ``waiter_client`` (first ``held``, whose ``waiter`` is waiting; then new
    holds of ``holder``), round after round until a release message woke the waiter, at most ``rounds``
    (a waiter's own poll can beat a message that a loaded machine delays); the handoff time of that round."""
    feed = waiter_client.store.release_feed
    for _ in range(rounds):
        before = feed.delivered
        if held is None or waiter is None:
            held = SyncDistributedLock(holder, table="locks", key=key, lease_duration=30)
            held.__enter__()
            waiter = Waiter(waiter_client, key)
        wait_until(lambda: feed.subscribed("locks", key), BOUND_S, "the waiter's subscription")
        # Waiting: it has its place in the key's line (a subscription may linger from a round before).
        def in_line(line: bytes = ClusterLayout.line("locks", key)) -> bool:
            return waiter_client.store.call(key, T, b"ZCARD", line) == 1

        wait_until(in_line, BOUND_S, "the waiter's place in line")
        released_at = time.monotonic()
        held.__exit__(None, None, None)
        waiter.join()
        if feed.delivered > before:
            assert waiter.acquired_at is not None
            return waiter.acquired_at - released_at
        held = waiter = None
    raise AssertionError(f"no release of {key!r} woke the waiter in {rounds} rounds")


def refused_within(client: RedisClient, key: str, wait_s: float) -> LockNotAcquired:
    """Try to acquire ``key``: it must not be acquired; the LockNotAcquired, raised within the wait budget."""
    started = time.monotonic()
    with pytest.raises(LockNotAcquired) as info:
        SyncDistributedLock(client, table="locks", key=key, lease_duration=1, wait_timeout=wait_s).__enter__()
    assert time.monotonic() - started < wait_s + 1.0
    return info.value


# ---- 1. the layout -----------------------------------------------------------------------------------
ODD_KEYS = ["plain", "user}1", "}", "{}", "}{", "{", "%", "%7D", "%25", "a{b}c", "{x}:locks:lease", "日本:🙂",
            "100%}{%7D"]


@pytest.mark.parametrize("key", ODD_KEYS)
def test_a_keys_lease_fence_and_record_are_all_on_its_slot_and_its_name_round_trips(
        redis_cluster_db, redis_cluster_server, clients, redis_cluster_url, key):
    server = redis_cluster_server
    client = clients(redis_cluster_url)
    store = client.store
    slot = key_slot(key)
    home = server.node_for_slot(slot)

    def check_names(expected: int) -> set[bytes]:
        names = fastlease_keys(server)
        assert {node for node, found in names.items() if found} == {home}, names  # all on the slot's node
        for name in names[home]:
            assert server.admin(home).execute_command("CLUSTER", "KEYSLOT", name) == slot, name  # the server says so
        assert len(names[home]) == expected, names
        return names[home]

    assert store.put_if_absent("locks", key, "o1", "v1", 10_000, T, NO_USAGE) == 1
    assert check_names(2) == {ClusterLayout.lease("locks", key), ClusterLayout.fence("locks", key)}
    assert [row["key"] for row in client.inspect("locks")] == [key]  # the escaped tag reads back as the key
    assert [row["key"] for row in client.inspect("locks", key)] == [key]
    # The record lives in another table than the lease, and one script still completes the call.
    record = Record("COMPLETED", "fingerprint", b"result", 0, "o1")
    assert store.finish_if_owner("locks", key, "records", record, 0, T) is True
    assert check_names(1) == {ClusterLayout.record("records", key)}
    assert store.read_record("records", key, T) == record
    assert client.inspect("locks") == []


def test_the_hash_tag_is_the_whole_key_so_keys_that_share_a_prefix_spread(redis_cluster_db, redis_cluster_server,
                                                                            clients, redis_cluster_url):
    client = clients(redis_cluster_url)
    admin = redis_cluster_server.admin(0)
    # The documented name: "}" written %7D, so that it cannot end the tag after "user".
    assert ClusterLayout.lease("locks", "user}1") == b"fastlease:{user%7D1}:locks:lease"
    slots = {}
    for key in ("user}1", "user}2"):
        with SyncDistributedLock(client, table="locks", key=key, lease_duration=5):
            slots[key] = admin.execute_command("CLUSTER", "KEYSLOT", ClusterLayout.lease("locks", key))
            assert slots[key] == key_slot(key)
    assert slots["user}1"] != slots["user}2"]
    assert slots["user}1"] != admin.execute_command("CLUSTER", "KEYSLOT", "user")  # not the prefix's slot


# ---- 2. many keys, every node, all renewed -----------------------------------------------------------
def test_two_hundred_keys_held_at_once_spread_over_every_node_and_are_all_renewed(
        redis_cluster_db, redis_cluster_server, clients, redis_cluster_url):
    server = redis_cluster_server
    client = renewing_elsewhere(clients(redis_cluster_url))
    keys = [f"job:{number}" for number in range(200)]
    guards = [SyncDistributedLock(client, table="locks", key=key, lease_duration=1) for key in keys]
    leases = [guard.__enter__() for guard in guards]
    try:
        first_versions = {key: stored(server, ClusterLayout.lease("locks", key))[b"version"] for key in keys}
        sizes = {node: len(server.admin(node).keys(b"fastlease:{*}:locks:*")) for node in server.nodes}
        assert all(size > 0 for size in sizes.values()) and sum(sizes.values()) == 400, sizes  # lease + fence each
        time.sleep(2.5)  # 2.5 lease periods of real time: what is tested is that renewals keep up meanwhile
        for key, lease in zip(keys, leases):
            lease.raise_if_lost()
            assert lease.is_valid(), key
            assert lease.metrics.renewals >= 3, (key, lease.metrics)
            assert stored(server, ClusterLayout.lease("locks", key))[b"version"] != first_versions[key], key
    finally:
        for guard in guards:
            guard.__exit__(None, None, None)
    assert sum(len(server.admin(node).keys(b"fastlease:{*}:locks:*")) for node in server.nodes) == 200  # fences


# ---- 3. the URL form and the client ------------------------------------------------------------------
def test_a_cluster_url_whose_first_node_is_down_reaches_the_cluster_through_the_others(
        redis_cluster_db, redis_cluster_server, clients):
    nodes = ",".join(f"{host}:{port}" for host, port in redis_cluster_server.nodes[1:])
    client = clients(f"redis+cluster://127.0.0.1:{closed_port()},{nodes}")
    assert isinstance(client.store, RedisClusterStore)
    with SyncDistributedLock(client, table="locks", key="reached", lease_duration=5) as lease:
        assert lease.fencing_token == 1
        assert stored(redis_cluster_server, ClusterLayout.lease("locks", "reached"))[b"owner"] == lease.owner.encode()


def test_a_tls_cluster_url_builds_ssl_connections_with_its_credentials_for_every_node(clients):
    client = clients("rediss+cluster://app:pw-secret@10.0.0.1:6379,10.0.0.2:6380?ssl_cert_reqs=none")
    store = client.store
    assert isinstance(store, RedisClusterStore)
    assert store.startup_nodes == [("10.0.0.1", 6379), ("10.0.0.2", 6380)]
    assert store.connection_class is redis.connection.SSLConnection
    for address in store.startup_nodes:
        connection = store.new_connection(address=address)
        assert isinstance(connection, redis.connection.SSLConnection)
        assert (connection.host, connection.port) == address
        assert (connection.username, connection.password) == ("app", "pw-secret")
        assert connection.cert_reqs == ssl.CERT_NONE
    assert store.renewal_config()[:2] == ("redis-cluster", "ssl")
    for text in (repr(client), store.describe(), repr(store)):
        assert "10.0.0.1:6379" in text and "pw-secret" not in text


def test_a_cluster_url_sends_nothing_until_the_first_lease_which_then_names_the_nodes(clients):
    port = closed_port()
    client = clients(f"redis+cluster://app:pw-secret@127.0.0.1:{port}")  # nobody listens: constructing is fine
    started = time.monotonic()
    with pytest.raises(LockNotAcquired) as info:
        SyncDistributedLock(client, table="locks", key="k", wait_timeout=0.3).__enter__()
    assert time.monotonic() - started < 2.0
    cause = info.value.__cause__
    assert isinstance(cause, StoreError) and not isinstance(cause, StoreRequestRejected)
    assert cause.maybe_committed is False
    assert f"127.0.0.1:{port}" in str(cause) and "CLUSTER SLOTS" in str(cause)
    for text in (str(info.value), str(cause), repr(client)):
        assert "pw-secret" not in text


@pytest.mark.parametrize("url, message", [
    ("redis+cluster://127.0.0.1:7000/1", "drop the /N path"),
    ("redis+cluster://127.0.0.1:7000,127.0.0.1:notaport", "bad node '127.0.0.1:notaport'"),
    ("redis+cluster://u:pw-secret@127.0.0.1:7000,:7001", "bad node ':7001'"),
    ("redis+cluster://127.0.0.1", "bad node '127.0.0.1'"),
    ("rediss+cluster://127.0.0.1:99999", "bad node '127.0.0.1:99999'"),
], ids=["database", "port", "host", "no-port", "port-range"])
def test_bad_cluster_urls_are_refused_naming_the_fix(url, message):
    with pytest.raises(ValueError, match="RedisClient") as info:
        RedisClient(url)
    assert message in str(info.value) and "pw-secret" not in str(info.value)
    if message == "drop the /N path":
        assert "only database 0" in str(info.value)
    else:
        assert "host:port" in str(info.value)


def test_a_redis_cluster_object_is_accepted_with_its_nodes(redis_cluster_db, redis_cluster_server, clients):
    client = clients(redis_cluster_db)
    store = client.store
    assert isinstance(store, RedisClusterStore)
    assert set(redis_cluster_server.nodes) <= set(store.startup_nodes)
    with SyncDistributedLock(client, table="locks", key="from-object", lease_duration=5) as lease:
        assert redis_cluster_db.hget(ClusterLayout.lease("locks", "from-object"), "owner") == lease.owner.encode()


#: What an application's ACL user needs on a cluster, as docs/operations.md lists it ("Access control"
#: for one server, then "Redis Cluster deployment"), plus SCAN for ``inspect``. Created on every node.
DOCUMENTED_ACL = ["resetkeys", "~fastlease:*", "resetchannels", "&fastlease:*", "-@all",
                  "+evalsha", "+script|load", "+hgetall", "+subscribe", "+unsubscribe",
                  "+exists", "+incr", "+hset", "+hget", "+hmget", "+pexpire", "+pttl", "+del", "+publish",
                  "+time", "+zadd", "+zcard", "+zrange", "+zrem", "+hdel",
                  "+cluster|slots", "+asking", "+ssubscribe", "+sunsubscribe", "+spublish", "+scan"]


def test_credentials_in_the_url_reach_every_node_and_the_documented_acl_is_enough(moving_cluster, clients):
    server = moving_cluster
    for node in server.nodes:
        server.admin(node).execute_command("ACL", "SETUSER", "orders-app", "on", ">orders-pw", *DOCUMENTED_ACL)
    try:
        nodes = ",".join(f"{host}:{port}" for host, port in server.nodes)
        holder = clients(f"redis+cluster://orders-app:orders-pw@{nodes}")
        waiter_client = clients(f"redis+cluster://orders-app:orders-pw@{nodes}")
        keys = [key_on(server, node, "acl") for node in server.nodes]  # a request to every node
        for key in keys:
            with SyncDistributedLock(holder, table="locks", key=key, lease_duration=5):
                assert [row["key"] for row in holder.inspect("locks")] == [key]
            woken_by_a_release(holder, waiter_client, key)  # SSUBSCRIBE and SPUBLISH allowed
        store = holder.store
        assert store.put_if_absent("locks", "acl-call", "o1", "v1", 5_000, T, NO_USAGE) == 1
        assert store.finish_if_owner("locks", "acl-call", "records", Record("COMPLETED", "f", b"r", 0, "o1"), 0, T)
        wrong = clients(f"redis+cluster://orders-app:wrong-pw@{nodes}")
        with pytest.raises(StoreRequestRejected, match="credentials") as info:
            SyncDistributedLock(wrong, table="locks", key="k", wait_timeout=5).__enter__()
        assert "wrong-pw" not in str(info.value)
    finally:
        for node in server.nodes:
            server.admin(node).execute_command("ACL", "DELUSER", "orders-app")
        server.flushall()


# ---- 4. the single-node client refuses a cluster node ------------------------------------------------
def test_the_single_node_client_refuses_a_cluster_node_and_writes_nothing(redis_cluster_db, redis_cluster_server,
                                                                           clients):
    server = redis_cluster_server
    # A key that holds a hash tag: its single-node lease and fence names share the tag's slot, so a cluster
    # node would run the single-node ACQUIRE on them; only the INFO check at connect keeps it from writing.
    # (Other keys' two names never share a slot: they differ in one fixed place, and CRC16 is linear.)
    key = "{shared}"
    assert slot_of(lease_key("locks", key)) == slot_of(fence_key("locks", key))
    host, port = server.node_for_slot(slot_of(lease_key("locks", key)))
    client = clients(f"redis://{host}:{port}/0")
    with pytest.raises(StoreRequestRejected, match="redis\\+cluster://") as info:
        SyncDistributedLock(client, table="locks", key=key, wait_timeout=5).__enter__()
    assert "Redis Cluster node" in str(info.value)
    assert fastlease_keys(server) == {node: set() for node in server.nodes}


def test_without_info_a_cluster_nodes_cluster_replies_still_name_the_cluster_url(moving_cluster, clients):
    """An ACL that refuses INFO: the node's CROSSSLOT or MOVED reply (redis-py takes the code off the
    message) must still be recognised as a cluster node's."""
    server = moving_cluster
    host, port = server.nodes[0]
    server.admin(0).execute_command("ACL", "SETUSER", "no-info", "on", ">pw", "~*", "&*", "+@all", "-info")
    try:
        client = clients(f"redis://no-info:pw@{host}:{port}/0")
        for key in ("k", "other"):  # the lease and fence names of each fall in different slots: CROSSSLOT
            assert slot_of(lease_key("locks", key)) != slot_of(fence_key("locks", key))
            with pytest.raises(StoreRequestRejected, match="redis\\+cluster://") as info:
                SyncDistributedLock(client, table="locks", key=key, wait_timeout=5).__enter__()
            assert "CROSSSLOT" in str(info.value)
            for name in (lease_key("locks", key), fence_key("locks", key)):
                assert not owner_of(server, name).exists(name)  # nothing written
        remote = next(f"r{number}" for number in range(10_000)
                      if server.node_for_slot(slot_of(lease_key("locks", f"r{number}"))) != (host, port))
        with pytest.raises(StoreRequestRejected, match="redis\\+cluster://") as info:  # a read: MOVED
            client.store.read("locks", remote, T, NO_USAGE)
        assert "MOVED" in str(info.value)
    finally:
        server.admin(0).execute_command("ACL", "DELUSER", "no-info")


# ---- 5. redirections ---------------------------------------------------------------------------------
def test_a_held_keys_slot_migrated_to_another_node_keeps_its_holder_and_refuses_contenders(moving_cluster,
                                                                                            clients):
    server = moving_cluster
    source = server.nodes[0]
    key = key_on(server, source, "migrated")
    slot, target = key_slot(key), other_node(server, source)
    url = server.url
    holder, contender = renewing_elsewhere(clients(url)), clients(url)
    guard = SyncDistributedLock(holder, table="locks", key=key, lease_duration=1)
    lease = guard.__enter__()
    assert contender.store.read("locks", key, T, NO_USAGE).owner == lease.owner  # its slot map says: source
    first = stored(server, ClusterLayout.lease("locks", key))[b"version"]
    wait_until(lambda: stored(server, ClusterLayout.lease("locks", key))[b"version"] != first, BOUND_S,
               "a renewal before the move (the renewer's slot map says: source)")
    server.admin(source).config_resetstat()
    assert server.migrate_slot(slot, target) == 2  # the lease and its fence
    moved_at = time.monotonic()
    version = stored(server, ClusterLayout.lease("locks", key))[b"version"]
    wait_until(lambda: stored(server, ClusterLayout.lease("locks", key)).get(b"version", version) != version, BOUND_S,
               "a renewal on the new node")
    assert rejected(server, source, "evalsha") >= 1  # the renewal went to the source first: MOVED, followed
    error = refused_within(contender, key, 0.3)
    assert error.__cause__ is None  # a clean "held", through the MOVED, not a store error
    time.sleep(max(0.0, moved_at + 1.5 - time.monotonic()))  # 1.5 leases after the move: renewals kept it
    lease.raise_if_lost()
    row = stored(server, ClusterLayout.lease("locks", key))
    assert row[b"owner"] == lease.owner.encode() and row[b"fence"] == b"1" and lease.fencing_token == 1
    assert server.admin(target).get(ClusterLayout.fence("locks", key)) == b"1"
    guard.__exit__(None, None, None)  # the holder's own store follows the MOVED too
    assert not server.admin(target).exists(ClusterLayout.lease("locks", key))
    with SyncDistributedLock(contender, table="locks", key=key, lease_duration=1) as after:
        assert after.fencing_token == 2  # the fence moved with the slot


def test_half_way_through_a_migration_holders_renew_and_release_and_nobody_acquires_twice(moving_cluster, clients):
    server = moving_cluster
    source = server.nodes[1]
    key = key_on(server, source, "half-way")
    slot, target = key_slot(key), other_node(server, source)
    fresh = next(f"fresh-{n}" for n in range(100_000) if key_slot(f"fresh-{n}") == slot)  # same slot, never used
    url = server.url
    holder, contender = renewing_elsewhere(clients(url)), clients(url)
    guard = SyncDistributedLock(holder, table="locks", key=key, lease_duration=1)
    lease = guard.__enter__()
    assert contender.store.read("locks", key, T, NO_USAGE).owner == lease.owner
    name = ClusterLayout.lease("locks", key)

    def version_on(node: tuple[str, int]) -> Optional[bytes]:
        return asking(server, node, "HGET", name, "version")

    def holding(name: bytes) -> list[tuple[str, int]]:
        return [node for node in (source, target) if name in keys_in_slot(server, node, slot)]

    def renewed_on(node: tuple[str, int], what: str) -> None:
        before = version_on(node)

        def changed() -> bool:
            lease.raise_if_lost()  # a lost lease's key expires: say so, rather than fail to find it
            return version_on(node) not in (before, None)

        wait_until(changed, 2.0, f"a renewal {what}")

    def refused(what: str) -> None:
        refused_within(contender, key, 0.3)
        assert contender.store.read("locks", key, T, NO_USAGE).owner == lease.owner, what  # reads follow ASK
        assert len(holding(name)) == 1, what

    server.begin_migration(slot, target)
    try:
        renewed_on(source, "on the source while the slot is migrating")
        refused("migrating, nothing moved")
        server.move_keys(slot, count=1)  # one of the two keys: a script on both answers TRYAGAIN
        moved_first = keys_in_slot(server, target, slot)
        assert len(moved_first) == 1 and len(keys_in_slot(server, source, slot)) == 1
        renewed_on(target if name in moved_first else source, "with the keys split between the nodes")
        refused("keys split")
        server.move_keys(slot)
        assert keys_in_slot(server, source, slot) == set() and len(keys_in_slot(server, target, slot)) == 2
        renewed_on(target, "through ASK")
        refused("every key moved")
        completion = Record("COMPLETED", "f", b"r", 0, lease.owner)  # FINISH names the record, not there yet
        with pytest.raises(StoreError, match="TRYAGAIN") as info:
            contender.store.finish_if_owner("locks", key, "records", completion, 0, T)
        assert not isinstance(info.value, StoreRequestRejected) and info.value.maybe_committed is False
        # A key never used in the slot: its script names two missing keys, TRYAGAIN until the slot has moved.
        early = Waiter(contender, fresh, wait_s=5, lease_s=1)
        guard.__exit__(None, None, None)  # RELEASE through ASK
        assert holding(name) == []
        refused_within(contender, key, 0.3)  # released, but ACQUIRE names a missing key: TRYAGAIN, no holder
        assert early.acquired_at is None
    finally:
        server.finish_migration(slot)
    early.join()
    assert early.token == 1
    with SyncDistributedLock(contender, table="locks", key=key, lease_duration=1) as after:
        assert after.fencing_token == 2  # the fence moved with the slot
    assert keys_in_slot(server, source, slot) == set()
    assert keys_in_slot(server, target, slot) == {ClusterLayout.fence("locks", name) for name in (key, fresh)}


def test_more_redirections_than_the_limit_fail_as_transient_and_unrun(moving_cluster):
    """An ``address_remap`` that sends every node's address to one node that serves none of the key's
    slot: each request there is answered MOVED to the real owner, which the remap turns back into the
    same node. The loop ends after MAX_REDIRECTIONS + 1 sends, as a transient error that did not run."""
    server = moving_cluster
    wrong = server.nodes[2]
    key = key_on(server, server.nodes[0], "looped")
    store = RedisClusterStore([server.nodes[0]], redis.connection.Connection, {}, address_remap=lambda _: wrong)
    try:
        server.admin(wrong).config_resetstat()
        started = time.monotonic()
        with pytest.raises(StoreError, match=f"redirected more than {MAX_REDIRECTIONS} times") as info:
            store.read("locks", key, T, NO_USAGE)
        assert time.monotonic() - started < T
        assert not isinstance(info.value, StoreRequestRejected) and info.value.maybe_committed is False
        assert rejected(server, wrong, "evalsha") == MAX_REDIRECTIONS + 1
    finally:
        store.close()


def test_redirections_read_from_redis_py_and_from_our_own_connections_text():
    from fastlease.stores.redis import wire
    from fastlease.stores.redis.cluster import redirection

    assert redirection(redis, redis.exceptions.MovedError("3999 10.0.0.2:7001")) == (False, 3999, "10.0.0.2", 7001)
    assert redirection(redis, redis.exceptions.AskError("17 :7002")) == (True, 17, "", 7002)
    assert redirection(wire.library, wire.ResponseError("MOVED 3999 10.0.0.2:7001")) == (False, 3999, "10.0.0.2", 7001)
    assert redirection(wire.library, wire.ResponseError("ASK 17 [::1]:7002")) == (True, 17, "[::1]", 7002)
    for other in ("TRYAGAIN Multiple keys request during rehashing of slot", "MOVED x 10.0.0.2:7001",
                  "MOVED 3999 10.0.0.2", "ERR unknown command"):
        assert redirection(wire.library, wire.ResponseError(other)) is None, other


def test_the_renewal_process_renews_on_a_cluster_without_importing_redis_py(redis_cluster_url, redis_cluster_db):
    client = RedisClient(redis_cluster_url)
    try:
        assert client.store.put_if_absent("locks", "k", "o1", "v1", 5_000, T, NO_USAGE)
        script = (
            "import sys\n"
            "from fastlease._renewal_process import build_store\n"
            "from fastlease.stores.base import NO_USAGE\n"
            f"store = build_store({client.store.renewal_config()!r}, None)\n"
            "assert store.update_version_if('locks', 'k', 'o1', 'v1', 'v2', 5.0, NO_USAGE) is True\n"
            "assert store.update_version_if('locks', 'k', 'o1', 'v1', 'v3', 5.0, NO_USAGE) is False\n"
            "print(store.read('locks', 'k', 5.0, NO_USAGE).version, 'redis' in sys.modules)\n")
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["v2", "False"]
        assert client.store.read("locks", "k", T, NO_USAGE).version == "v2"
    finally:
        client.close()


# ---- 6. a node down ----------------------------------------------------------------------------------
def test_a_killed_node_loses_its_keys_leases_at_the_end_of_validity_and_the_others_keep_working(
        make_redis_cluster, clients):
    server = make_redis_cluster()
    doomed, survivor, third = server.nodes  # the URL lists the doomed node first
    url = server.url
    threaded = clients(url, renewal="thread")  # renewals in this process
    delegated = renewing_elsewhere(clients(url))  # renewals in a renewal process
    contender = clients(url)
    lost: dict[str, tuple[float, str]] = {}

    def hold(client: RedisClient, key: str) -> tuple[SyncDistributedLock, Any]:
        guard = SyncDistributedLock(client, table="locks", key=key, lease_duration=1,
                                    on_lost=lambda error: lost.setdefault(key, (time.monotonic(), error.cause)))
        return guard, guard.__enter__()

    on_doomed = [hold(threaded, key_on(server, doomed, "doomed-a")),
                 hold(delegated, key_on(server, doomed, "doomed-b"))]
    elsewhere = [hold(threaded, key_on(server, third, "third-a")), hold(delegated, key_on(server, third, "third-b"))]
    # A slot that leaves the doomed node just before it dies: whoever still maps it there must fetch the
    # slot map again from a live node (as after a failover).
    moving = key_on(server, doomed, "moving", avoid=tuple(key_slot(lease.key) for _, lease in on_doomed))
    moving_lease = hold(delegated, moving)
    fresh = next(f"fresh-{n}" for n in range(100_000) if key_slot(f"fresh-{n}") == key_slot(moving))
    assert contender.store.read("locks", fresh, T, NO_USAGE) is None  # its map: the doomed node
    server.migrate_slot(key_slot(moving), survivor)
    killed_at = time.monotonic()
    server.kill_node(doomed)

    error = refused_within(contender, on_doomed[0][1].key, 1.5)  # never acquired while the node is down
    assert isinstance(error.__cause__, StoreError) and f"{doomed[0]}:{doomed[1]}" in str(error.__cause__)
    with SyncDistributedLock(contender, table="locks", key=fresh, lease_duration=1, wait_timeout=3) as taken:
        assert taken.fencing_token == 1  # the slot map fetched again, from a live node
    assert server.admin(survivor).exists(ClusterLayout.fence("locks", fresh))

    wait_until(lambda: len(lost) == 2, 3.0, "both leases on the killed node to be lost")
    for _, lease in on_doomed:
        lost_at, cause = lost[lease.key]
        # Its last renewal was at most a renewal interval (L/3) before the kill; validity ends 0.9 L after it.
        assert 0.9 - 1 / 3 - 0.05 <= lost_at - killed_at <= 0.9 + 0.3, (lease.key, lost_at - killed_at)
        assert not lease.is_valid()
        with pytest.raises(LockLost) as info:
            lease.raise_if_lost()
        assert info.value.cause == cause
    assert lost[on_doomed[0][1].key][1] == "unreachable"  # renewals failed: said so
    # Renewed by the renewal process: the holder may see its validity end before the report of the
    # renewal process's failures arrives, and say "expired" (an engine matter, see the report).
    assert lost[on_doomed[1][1].key][1] in ("unreachable", "expired")

    time.sleep(max(0.0, killed_at + 1.5 - time.monotonic()))  # longer than a lease since the kill
    for guard, lease in [*elsewhere, moving_lease]:
        lease.raise_if_lost()
        assert lease.is_valid() and lease.key not in lost
        guard.__exit__(None, None, None)
    assert not server.admin(survivor).exists(ClusterLayout.lease("locks", moving))


def test_a_paused_node_times_requests_out_and_a_late_acquisition_is_reconciled(moving_cluster, clients):
    server = moving_cluster
    index = 2
    node = server.nodes[index]
    key = key_on(server, node, "paused")
    client = clients(server.url, renewal="thread")
    warm = key_on(server, node, "warm", avoid=(key_slot(key),))
    with SyncDistributedLock(client, table="locks", key=warm, lease_duration=1):
        pass  # this thread is connected to the node and its scripts are loaded: the stall hits the request
    failures: list[tuple[float, StoreError]] = []
    failed = threading.Event()
    call = client.store.call

    def noting_failures(*args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        try:
            return call(*args, **kwargs)
        except StoreError as error:
            failures.append((time.monotonic() - started, error))
            failed.set()
            raise

    client.store.call = noting_failures  # type: ignore[method-assign]

    def resume_after_a_failure() -> None:
        failed.wait(BOUND_S)
        server.resume_node(index)  # well within the node timeout: the cluster never marks it failed

    server.pause_node(index)
    resumer = threading.Thread(target=resume_after_a_failure)
    resumer.start()
    try:
        # lease 1 s: each request gives up after L/3, long before the node is resumed
        with SyncDistributedLock(client, table="locks", key=key, lease_duration=1, wait_timeout=5) as lease:
            row = stored(server, ClusterLayout.lease("locks", key))
            assert row[b"owner"] == lease.owner.encode() and lease.fencing_token == 1  # one ACQUIRE ran, late
            assert lease.metrics.request_failures >= 1
    finally:
        failed.set()
        resumer.join(BOUND_S)
    waited, first = failures[0]
    assert first.maybe_committed is True and "timed out" in str(first)  # sent, unanswered: it may have run
    assert waited < 1 / 3 + 0.15
    assert server.admin(node).get(ClusterLayout.fence("locks", key)) == b"1"
    assert not server.admin(node).exists(ClusterLayout.lease("locks", key))  # released after
    server.wait_until_agreed()


# ---- 7. release wake-ups -----------------------------------------------------------------------------
def test_a_release_wakes_a_waiter_of_another_client_through_sharded_pub_sub(redis_cluster_db, redis_cluster_server,
                                                                            clients, redis_cluster_url):
    holder, waiter_client = clients(redis_cluster_url), clients(redis_cluster_url)
    feed = waiter_client.store.release_feed
    handoffs = []
    for key in ("hot-0", "hot-1", "hot-2"):  # three slots
        guard = SyncDistributedLock(holder, table="locks", key=key, lease_duration=30)
        guard.__enter__()
        waiter = Waiter(waiter_client, key)
        wait_until(lambda key=key: feed.subscribed("locks", key), BOUND_S, "the waiter's subscription")
        home = redis_cluster_server.node_for_slot(key_slot(key))
        channel = ClusterLayout.channel("locks", key)
        assert redis_cluster_server.admin(home).execute_command("PUBSUB", "SHARDNUMSUB", channel) == [channel, 1]
        handoffs.append(woken_by_a_release(holder, waiter_client, key, held=guard, waiter=waiter))
    assert feed.delivered == 3
    # A waiter that only polls waits 62-188 ms (the poll interval, 125 ms, jittered) after a release.
    assert statistics.median(handoffs) < 0.05, handoffs


def test_after_its_slot_moves_the_feed_subscribes_on_the_new_node(moving_cluster, clients):
    server = moving_cluster
    source = server.nodes[0]
    key = key_on(server, source, "feed-moves")
    target = other_node(server, source)
    channel = ClusterLayout.channel("locks", key)
    holder, waiter_client = clients(server.url), clients(server.url)
    feed = waiter_client.store.release_feed
    guard = SyncDistributedLock(holder, table="locks", key=key, lease_duration=30)
    guard.__enter__()
    waiter = Waiter(waiter_client, key)
    wait_until(lambda: feed.subscribed("locks", key), BOUND_S, "the waiter's subscription")
    server.migrate_slot(key_slot(key), target)  # the source ends our subscription (sunsubscribe)
    wait_until(lambda: server.admin(target).execute_command("PUBSUB", "SHARDNUMSUB", channel)[1] == 1, BOUND_S,
               "the subscription on the new node")
    wait_until(lambda: feed.subscribed("locks", key), BOUND_S, "the new node's confirmation")
    assert server.admin(source).execute_command("PUBSUB", "SHARDNUMSUB", channel)[1] == 0
    assert feed.delivered == 0
    woken_by_a_release(holder, waiter_client, key, held=guard, waiter=waiter)
    assert waiter.token == 2 and feed.delivered == 1


def test_a_subscription_answered_moved_is_sent_again_where_the_slot_went(moving_cluster, clients):
    """A slot map fetched from a node that has not heard of a move yet sends SSUBSCRIBE to the old owner,
    which answers MOVED. That is a redirection, not a server without sharded pub/sub: the feed subscribes
    again where the slot went. The stale map is set by hand (no test can time a lagging node's reply), and
    the feed is watched directly: a lock's own attempt would follow the MOVED first and mend the map."""
    server = moving_cluster
    source = server.nodes[1]
    key = key_on(server, source, "stale-map")
    slot, target = key_slot(key), other_node(server, source)
    channel = ClusterLayout.channel("locks", key)
    holder, listener = clients(server.url), clients(server.url)
    store = listener.store
    server.migrate_slot(slot, target, keys=False)
    assert store.read("locks", key, T, NO_USAGE) is None  # its slot map fetched: the slot is the target's
    store._slots[slot] = source  # as a map from a lagging node would have it
    woken = threading.Event()
    watch = store.release_feed.watch("locks", key, woken.set)
    try:
        wait_until(lambda: server.admin(target).execute_command("PUBSUB", "SHARDNUMSUB", channel)[1] == 1, BOUND_S,
                   "the subscription on the slot's node")
        wait_until(lambda: store.release_feed.subscribed("locks", key), BOUND_S, "its confirmation")
        assert store.release_feed.unsupported is False
        with SyncDistributedLock(holder, table="locks", key=key, lease_duration=5):
            pass
        assert woken.wait(BOUND_S), "the release did not wake the watcher"
        assert store.release_feed.delivered == 1
    finally:
        store.release_feed.unwatch(watch)


def test_without_wake_on_release_nothing_is_subscribed_anywhere(redis_cluster_db, redis_cluster_server, clients,
                                                                redis_cluster_url):
    server = redis_cluster_server
    holder, waiter_client = clients(redis_cluster_url), clients(redis_cluster_url, wake_on_release=False)
    channel = ClusterLayout.channel("locks", "hot")
    with SyncDistributedLock(holder, table="locks", key="hot", lease_duration=30):
        waiter = Waiter(waiter_client, "hot")
        wait_until(lambda: stored(server, ClusterLayout.lease("locks", "hot")).get(b"waiting") == b"1", BOUND_S,
                   "the waiter's mark")
        for node in server.nodes:
            assert server.admin(node).execute_command("PUBSUB", "SHARDNUMSUB", channel) == [channel, 0]
            assert server.admin(node).execute_command("PUBSUB", "SHARDCHANNELS") == []
    waiter.join()
    assert waiter.token == 2 and waiter_client.store.release_feed.delivered == 0


# ---- 8. the DEBUG log --------------------------------------------------------------------------------
def test_the_debug_log_names_each_cluster_request_by_its_script_without_data(redis_cluster_db, clients,
                                                                            redis_cluster_url, caplog):
    import logging

    store = clients(redis_cluster_url).store
    caplog.set_level(logging.DEBUG, logger="fastlease.stores")
    assert store.put_if_absent("locks", "logged", "owner-1", "version-1", 5_000, T, NO_USAGE) == 1
    assert store.update_version_if("locks", "logged", "owner-1", "version-1", "version-2", T, NO_USAGE) is True
    assert store.read("locks", "logged", T, NO_USAGE) is not None
    record = Record("COMPLETED", "fingerprint", b"private-result", 0, "owner-1")
    assert store.finish_if_owner("locks", "logged", "records", record, 0, T) is True
    lines = [entry.getMessage() for entry in caplog.records if entry.name.startswith("fastlease.stores")]
    for expected in ("ACQUIRE 'logged' -> 1", "RENEW 'logged' -> 1", "OBSERVE 'logged' -> ok",
                     "FINISH 'logged' -> 1"):
        assert expected in lines, lines
    assert not [line for line in lines if "private-result" in line or "owner-1" in line or "version-" in line]


# ---- 9. the command line -----------------------------------------------------------------------------
def fastlease(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fastlease", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=60, env=dict(os.environ))


def test_status_list_and_release_on_the_cluster(tmp_path, redis_cluster_db, clients, redis_cluster_url):
    client = clients(redis_cluster_url)
    key = "a}{b%7D:日本"
    options = ["--table", "locks", "--store", "redis", "--url", redis_cluster_url]
    guard = SyncDistributedLock(client, table="locks", key=key, lease_duration=30)
    lease = guard.__enter__()
    other = SyncDistributedLock(client, table="locks", key="second", lease_duration=30)
    other.__enter__()
    status = fastlease("status", key, *options, cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    assert status.stdout.startswith(f"{key}: held by {lease.owner}, lease 30 s, protocol 1, fencing token 1")
    listed = json.loads(fastlease("list", "--json", *options, cwd=tmp_path).stdout)
    assert sorted(row["key"] for row in listed) == sorted([key, "second"])
    forced = fastlease("release", key, "--force", *options, cwd=tmp_path)
    assert forced.returncode == 0 and f"removed {key}" in forced.stdout, forced
    assert [row["key"] for row in client.inspect("locks")] == ["second"]
    with pytest.raises(LockLost):
        guard.__exit__(None, None, None)
    other.__exit__(None, None, None)
