"""The throwaway Redis Cluster (``fastlease.testing.redis_cluster``): it starts and converges, its slots
are spread over its nodes, a real slot migration moves keys (whole or half-way), its node faults do
what they say, stop() leaves nothing behind, and its fixtures fail rather than skip under CI=true.

Every check here asks the nodes themselves, through connections of its own (plain ``redis.Redis`` per
node, or redis-py's ``RedisCluster``), not through the object under test."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Callable

import pytest
import redis
import redis.backoff
import redis.crc
import redis.retry
from redis.cluster import RedisCluster
from redis.exceptions import AskError, MovedError

from fastlease.testing._process import GUARD_GRACE_S
from fastlease.testing.redis_cluster import (
    CLUSTER_SLOTS,
    Node,
    RedisClusterServer,
    RedisClusterUnavailable,
    redis_cli_path,
)

pytestmark = [pytest.mark.server, pytest.mark.posix]  # starts redis-server nodes; signals them by PID

BOUND_S = 30.0  # every wait on a subprocess here

MakeCluster = Callable[..., RedisClusterServer]


def plain(node: Node, socket_timeout: float = 5.0) -> redis.Redis:
    """A plain (not cluster-aware) connection to one node: it follows no redirection, and it resends
    nothing (redis-py's default retries a timed-out command, with backoff)."""
    return redis.Redis(host=node[0], port=node[1], socket_timeout=socket_timeout,
                       retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0))


def own_slots(node: Node) -> set[int]:
    """The slots ``node`` says it owns: the ranges of its ``myself`` line of CLUSTER NODES."""
    client = plain(node)
    try:
        lines = client.execute_command("CLUSTER", "NODES").decode().splitlines()
    finally:
        client.close()
    (myself,) = [line.split() for line in lines if "myself" in line.split()[2]]
    slots: set[int] = set()
    for field in myself[8:]:
        first, _, last = field.partition("-")
        slots.update(range(int(first), int(last or first) + 1))
    return slots


def keys_in_one_slot(tag: str, count: int) -> tuple[int, list[bytes]]:
    """``count`` keys that share the hash tag ``tag``, and their one slot."""
    names = [f"{{{tag}}}:{n}".encode() for n in range(count)]
    return redis.crc.key_slot(names[0]), names


def is_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


# --- the session's cluster --------------------------------------------------------------------------------

def test_every_node_says_cluster_state_ok(redis_cluster_server: RedisClusterServer, redis_cluster_url: str) -> None:
    nodes = redis_cluster_server.nodes
    assert len(nodes) == 3 and len({port for _, port in nodes}) == 3
    assert redis_cluster_url == "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for _, port in nodes)
    for node in nodes:
        client = plain(node)
        try:
            info = dict(line.split(":", 1) for line in client.execute_command("CLUSTER", "INFO").decode().split())
            assert client.info("server")["process_id"] in redis_cluster_server.node_pids
        finally:
            client.close()
        assert (info["cluster_state"], info["cluster_known_nodes"], info["cluster_size"]) == ("ok", "3", "3"), info
        assert info["cluster_slots_assigned"] == info["cluster_slots_ok"] == str(CLUSTER_SLOTS), info


def test_the_nodes_own_disjoint_slot_ranges_covering_every_slot(redis_cluster_server: RedisClusterServer) -> None:
    owned = {node: own_slots(node) for node in redis_cluster_server.nodes}
    assert all(owned.values()), f"a node owns no slot: {owned.keys()}"
    assert sum(len(slots) for slots in owned.values()) == CLUSTER_SLOTS  # so no slot is owned twice...
    assert set().union(*owned.values()) == set(range(CLUSTER_SLOTS))  # ...and none is left out
    for node, slots in owned.items():
        for slot in (min(slots), max(slots)):
            assert redis_cluster_server.node_for_slot(slot) == node


def test_a_key_written_through_redis_cluster_is_on_its_slots_node(redis_cluster_server: RedisClusterServer) -> None:
    host, port = redis_cluster_server.nodes[0]
    cluster = RedisCluster.from_url(f"redis://{host}:{port}")
    try:
        # Keys of every node: the client follows the slot map to each.
        names = [f"cluster-server-test:{n}" for n in range(30)]
        for name in names:
            cluster.set(name, name)
        assert [cluster.get(name) for name in names] == [name.encode() for name in names]
        owners = {redis_cluster_server.node_for_slot(redis.crc.key_slot(name.encode())) for name in names}
        assert owners == set(redis_cluster_server.nodes)
        name = names[0]
        owner = plain(redis_cluster_server.node_for_slot(redis.crc.key_slot(name.encode())))
        try:
            assert owner.get(name) == name.encode()
        finally:
            owner.close()
        cluster.delete(*names)
    finally:
        cluster.close()


@pytest.mark.parametrize("run", ["first", "second"])
def test_redis_cluster_db_empties_every_primary(
    redis_cluster_db: RedisCluster, redis_cluster_server: RedisClusterServer, run: str
) -> None:
    # Both runs leave keys on every node: whichever runs second fails unless the fixture emptied them all.
    for node in redis_cluster_server.nodes:
        client = plain(node)
        try:
            assert client.dbsize() == 0, f"left on {node} by an earlier test"
        finally:
            client.close()
    for n in range(30):
        redis_cluster_db.set(f"leftover:{run}:{n}", n)


def test_bad_arguments_are_refused_naming_the_value(redis_cluster_server: RedisClusterServer) -> None:
    owner = redis_cluster_server.node_for_slot(0)
    with pytest.raises(ValueError, match="slot must be an int from 0 to 16383, not 16384"):
        redis_cluster_server.node_for_slot(CLUSTER_SLOTS)
    with pytest.raises(ValueError, match=r"\('127.0.0.1', 1\) is not a node of this cluster"):
        redis_cluster_server.begin_migration(0, to=("127.0.0.1", 1))
    with pytest.raises(ValueError, match="slot 0 already lives on node"):
        redis_cluster_server.begin_migration(0, to=owner)
    with pytest.raises(ValueError, match=r"no migration of slot 0 is in progress: call begin_migration\(0, to\)"):
        redis_cluster_server.move_keys(0)
    with pytest.raises(ValueError, match="nodes must be an int of at least 3"):
        RedisClusterServer().start(nodes=2)
    assert redis_cluster_server.node_for_slot(0) == owner  # nothing was changed on the way


# --- slot migrations, on clusters of their own ----------------------------------------------------------

def test_migrate_slot_moves_the_slot_with_its_keys(make_redis_cluster: MakeCluster) -> None:
    server = make_redis_cluster()
    slot, names = keys_in_one_slot("migrated", 150)  # more than one MIGRATE batch
    source = server.node_for_slot(slot)
    target = next(node for node in server.nodes if node != source)
    writer = plain(source)
    try:
        for name in names:
            writer.set(name, name)
    finally:
        writer.close()

    assert server.migrate_slot(slot, to=target) == len(names)

    on_target, on_source = plain(target), plain(source)
    try:
        assert on_target.mget(names[:50]) == names[:50] and on_target.get(names[-1]) == names[-1]
        assert on_target.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == len(names)
        with pytest.raises(MovedError) as moved:
            on_source.get(names[0])
        assert (moved.value.slot_id, moved.value.node_addr) == (slot, target)
    finally:
        on_target.close()
        on_source.close()
    for node in server.nodes:  # every node's own map says so, not only the one node_for_slot asks
        assert (slot in own_slots(node)) == (node == target)
    host, port = server.nodes[0]
    cluster = RedisCluster(host=host, port=port)
    try:
        assert cluster.get(names[7]) == names[7]
    finally:
        cluster.close()


def test_a_half_way_migration_leaves_the_source_answering_ask(make_redis_cluster: MakeCluster) -> None:
    server = make_redis_cluster()
    slot, names = keys_in_one_slot("half-way", 2)
    source = server.node_for_slot(slot)
    target = next(node for node in server.nodes if node != source)
    on_source, on_target = plain(source), plain(target)
    try:
        for name in names:
            on_source.set(name, name)
        server.begin_migration(slot, to=target)
        assert server.move_keys(slot, count=1) == 1
        (moved,) = on_target.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 10)
        (kept,) = [name for name in names if name != moved]

        with pytest.raises(AskError) as asked:
            on_source.get(moved)
        assert type(asked.value) is AskError and (asked.value.slot_id, asked.value.node_addr) == (slot, target)
        assert on_source.get(kept) == kept  # a key not moved yet is still served by the source
        with pytest.raises(MovedError):
            on_target.get(moved)  # without ASKING the target still sends clients to the owner
        asking = on_target.pipeline(transaction=False)  # one connection: ASKING covers the next command
        assert asking.execute_command("ASKING").get(moved).execute() == [True, moved]
        assert server.node_for_slot(slot) == source  # the source owns the slot until the migration ends

        assert server.finish_migration(slot) == 1  # the key left behind
        assert server.node_for_slot(slot) == target
        assert on_target.mget(names) == names
        with pytest.raises(MovedError):
            on_source.get(kept)
    finally:
        on_source.close()
        on_target.close()


# --- faults and stop ---------------------------------------------------------------------------------------

def test_stop_ends_every_node_paused_or_killed_and_removes_their_directories(make_redis_cluster: MakeCluster) -> None:
    server = make_redis_cluster()
    pids, node_pids, directories = server.pids, server.node_pids, server.directories
    assert len(pids) == len(node_pids) == len(directories) == 3
    assert all(os.path.exists(os.path.join(directory, "nodes.conf")) for directory in directories)
    paused, _, serving = server.nodes
    serving_slots = own_slots(serving)
    name = next(name for name in (f"k{n}" for n in range(10_000)) if redis.crc.key_slot(name.encode()) in serving_slots)

    server.pause_node(0)
    stalled = plain(paused, socket_timeout=0.2)
    try:
        with pytest.raises(redis.TimeoutError):
            stalled.ping()
        server.resume_node(0)
        stalled.connection_pool.disconnect()  # its connection still has the unanswered PING's reply
        assert stalled.ping()
    finally:
        stalled.close()
    server.pause_node(0)  # left paused: stop() must still end it, without waiting out the guard's grace

    server.kill_node(1)
    assert is_gone(node_pids[1]) and is_gone(pids[1]), "kill_node returned before the node was gone"
    still = plain(serving)
    try:
        assert still.set(name, "served") and still.get(name) == b"served"  # the third node serves its slots
    finally:
        still.close()

    started = time.monotonic()
    server.stop()
    elapsed = time.monotonic() - started
    running = [pid for pid in pids + node_pids if not is_gone(pid)]
    assert not running, f"still running after stop(): {running}"
    assert not any(os.path.exists(directory) for directory in directories)
    # A paused node would ignore the SIGTERM, and its guard would SIGKILL it only after GUARD_GRACE_S.
    assert elapsed < GUARD_GRACE_S, f"stop() took {elapsed:.1f} s: the paused node was not resumed first"
    assert not server.running()
    server.stop()  # idempotent


# --- when it cannot start --------------------------------------------------------------------------------

def executable(path: Path, script: str) -> str:
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    return str(path)


def test_a_missing_redis_server_or_redis_cli_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_SERVER", str(tmp_path / "no-such-redis-server"))
    with pytest.raises(RedisClusterUnavailable, match="redis-server is not installed"):
        RedisClusterServer().start()
    monkeypatch.delenv("REDIS_SERVER")
    monkeypatch.setenv("REDIS_CLI", str(tmp_path / "no-such-redis-cli"))
    with pytest.raises(RedisClusterUnavailable, match=r"redis-cli is not installed \(apt-get install -y redis-tools"):
        RedisClusterServer().start()


def test_a_node_that_cannot_start_is_reported_with_its_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    failing = executable(tmp_path / "redis-server", "echo 'FATAL CONFIG FILE ERROR'; exit 1\n")
    monkeypatch.setenv("REDIS_SERVER", failing)
    monkeypatch.setenv("REDIS_CLI", executable(tmp_path / "redis-cli", "exit 0\n"))
    server = RedisClusterServer()
    with pytest.raises(RedisClusterUnavailable) as raised:
        server.start(timeout_s=BOUND_S)
    assert "cluster node 0 did not start" in str(raised.value) and "FATAL CONFIG FILE ERROR" in str(raised.value)
    assert not any(os.path.exists(directory) for directory in server.directories)


def test_a_cluster_that_cannot_be_joined_is_reported_with_redis_clis_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REDIS_CLI", executable(tmp_path / "redis-cli", "echo \"refused to join $*\"; exit 1\n"))
    server = RedisClusterServer()
    try:
        with pytest.raises(RedisClusterUnavailable) as raised:
            server.start(timeout_s=BOUND_S)
        message = str(raised.value)
        assert "redis-cli --cluster create failed (exit status 1)" in message
        assert "refused to join --cluster create 127.0.0.1:" in message and "--cluster-replicas 0" in message
        # The nodes it had started are stopped by their PIDs, and their directories removed.
        running = [pid for pid in server.pids if not is_gone(pid)]
        assert len(server.pids) == 3 and not running, f"left running: {running}"
        assert not any(os.path.exists(directory) for directory in server.directories)
    finally:
        server.stop()


def test_redis_cli_is_looked_for_in_redis_cli_then_beside_redis_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("REDIS_SERVER", executable(bin_dir / "redis-server", "exit 0\n"))
    beside = executable(bin_dir / "redis-cli", "exit 0\n")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert redis_cli_path() == beside
    monkeypatch.setenv("REDIS_CLI", str(tmp_path / "missing"))
    assert redis_cli_path() is None  # a REDIS_CLI that is not there is not silently replaced
    configured = executable(tmp_path / "my-redis-cli", "exit 0\n")
    monkeypatch.setenv("REDIS_CLI", configured)
    assert redis_cli_path() == configured


CLUSTER_USER_TEST = textwrap.dedent(
    """
    def test_uses_the_cluster(fastlease_redis_cluster_url):
        assert fastlease_redis_cluster_url.startswith("redis+cluster://")
    """
)


def test_the_cluster_fixture_skips_locally_and_fails_under_ci_without_redis_server(tmp_path: Path) -> None:
    (tmp_path / "test_user.py").write_text(CLUSTER_USER_TEST)
    missing = str(tmp_path / "no-such-redis-server")

    def run(ci: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            # Without hypothesis's plugin, whose import is most of a pytest start-up here.
            [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "no:hypothesispytest",
             "-p", "fastlease.testing", str(tmp_path / "test_user.py")],
            cwd=tmp_path, env={**os.environ, "REDIS_SERVER": missing, "CI": ci}, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )

    runs = {ci: run(ci) for ci in ("", "true")}  # side by side: each is a pytest start-up
    outcomes = {}
    for ci, proc in runs.items():
        try:
            output, _ = proc.communicate(timeout=BOUND_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=BOUND_S)
        outcomes[ci] = (proc.returncode, output)
    local_status, local = outcomes[""]
    assert local_status == 0 and "1 skipped" in local and "redis-server is not installed" in local, local
    ci_status, ci = outcomes["true"]
    assert ci_status != 0, ci
    assert "CI=true: the Redis Cluster tests must run, but redis-server is not installed" in ci, ci
