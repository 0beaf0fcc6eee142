"""The Redis store on a real redis-server (started by the test session): the engine through the public
API, expiry, fencing, the wake-up on release, faults, and real processes.

The store contract itself runs in ``test_contract.py``.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from fastlease import SyncDistributedLock
from fastlease.exceptions import LockNotAcquired, MalformedLockRow, StoreError, StoreRequestRejected
from fastlease.redis import RedisClient
from fastlease.stores.redis.replies import hash_fields
from fastlease.stores.redis.scripts import fence_key, lease_key
from fastlease.testing import NO_USAGE
from helpers import mp_workers
from helpers.lock_waiter import Waiter
from helpers.processes import JOIN_S, Children, kill_and_reap, receive, run_contenders
from helpers.waiting import wait_until

CONTENDERS = 16
ROUNDS = 8
BOUND_S = 20.0  # bound for every wait in these tests


@pytest.fixture
def make_redis(core, redis_url, redis_db):
    clients = []

    def build(target: Any = None, **kwargs: Any) -> RedisClient:
        client = RedisClient(target if target is not None else redis_url, _engine_module=core, **kwargs)
        clients.append(client)
        return client

    yield build
    for client in clients:
        client.close()


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])  # nothing listens once the probe is closed


@contextlib.contextmanager
def stalled_server(redis_url: str, seconds: float) -> Iterator[socket.socket]:
    """The session's redis-server asleep for ``seconds`` (DEBUG SLEEP on a connection of its own, which
    is yielded: its ``+OK`` arrives when the server wakes). Returns once a PING goes unanswered."""
    staller = socket.create_connection(("127.0.0.1", int(redis_url.rsplit(":", 1)[1].split("/")[0])), timeout=10)
    try:
        staller.sendall(b"DEBUG SLEEP %g\r\n" % seconds)
        probe = socket.create_connection(staller.getpeername(), timeout=0.05)
        with probe:
            probe.sendall(b"PING\r\n")
            with pytest.raises(socket.timeout):
                probe.recv(16)
        yield staller
    finally:
        staller.close()


# ---- the row, its expiry and its fencing counter -------------------------------------------------
def test_a_hold_costs_two_requests_sets_px_and_keeps_the_fence_counter(make_redis, redis_db):
    client = make_redis()
    with SyncDistributedLock(client, table="locks", key="import:daily", lease_duration=10) as lease:
        stored = redis_db.hgetall(lease_key("locks", "import:daily"))
        assert stored == {b"owner": lease.owner.encode(), b"version": stored[b"version"], b"lease_ms": b"10000",
                          b"protocol": b"1", b"fence": b"1"}
        assert 0 < redis_db.pttl(lease_key("locks", "import:daily")) <= 10_000
        assert redis_db.pttl(fence_key("locks", "import:daily")) == -1  # the counter never expires
        assert lease.fencing_token == 1
    assert (lease.metrics.write_requests, lease.metrics.read_requests) == (2, 0)
    assert redis_db.exists(lease_key("locks", "import:daily")) == 0
    assert redis_db.get(fence_key("locks", "import:daily")) == b"1"
    with SyncDistributedLock(client, table="locks", key="import:daily") as again:
        assert again.fencing_token == 2


def test_renewal_resets_px_and_a_waiting_mark_leaves_it_alone(make_redis, redis_db):
    store = make_redis().store
    name = lease_key("locks", "k")
    assert store.put_if_absent("locks", "k", "o1", "v1", 10_000, 5.0, NO_USAGE) == 1
    redis_db.pexpire(name, 3_000)  # as if most of the lease had passed
    assert store.mark_waiting("locks", "k", "o1", "v1", 5.0, NO_USAGE) is True
    assert 0 < redis_db.pttl(name) <= 3_000  # a contender never keeps the holder's key alive
    assert store.update_version_if("locks", "k", "o1", "v1", "v2", 5.0, NO_USAGE) is True
    assert 3_000 < redis_db.pttl(name) <= 10_000  # the holder's renewal gives a whole lease again
    assert store.update_version_if("locks", "k", "o1", "v1", "v3", 5.0, NO_USAGE) is False


def test_fencing_tokens_strictly_increase_across_release_expiry_and_takeover(make_redis, redis_db):
    client = make_redis()
    store = client.store
    tokens = []
    with SyncDistributedLock(client, table="locks", key="k") as lease:  # released
        tokens.append(lease.fencing_token)
    tokens.append(store.put_if_absent("locks", "k", "crashed", "v", 200, 5.0, NO_USAGE))  # never renewed
    wait_until(lambda: redis_db.exists(lease_key("locks", "k")) == 0, BOUND_S, "the crashed holder's key to expire")
    with SyncDistributedLock(client, table="locks", key="k") as lease:  # after expiry
        tokens.append(lease.fencing_token)
    # A holder whose key cannot expire (PERSIST) is taken over by observation after its lease.
    tokens.append(store.put_if_absent("locks", "k", "stuck", "v", 300, 5.0, NO_USAGE))
    redis_db.persist(lease_key("locks", "k"))
    with SyncDistributedLock(client, table="locks", key="k", lease_duration=1, wait_timeout=10) as lease:
        tokens.append(lease.fencing_token)
        assert lease.metrics.read_requests >= 1  # it had to wait: a takeover, not a fresh key
    assert tokens == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("key", [
    "k'\"\n\r\t;--", "{a}}{", "]] redis.call('FLUSHALL') --[[", "'); redis.call('DEL', KEYS[1]); --",
    "*", "fastlease:locks:lease:other", "nul\x00inside", "日本:🙂", "x" * 2048,
])
def test_injection_shaped_keys_are_only_bytes(make_redis, redis_db, key):
    redis_db.set("canary", "alive")
    client = make_redis()
    with SyncDistributedLock(client, table="locks", key=key) as lease:
        assert redis_db.hget(lease_key("locks", key), "owner") == lease.owner.encode()
        assert set(redis_db.keys()) == {b"canary", lease_key("locks", key), fence_key("locks", key)}
        assert [row["key"] for row in client.inspect("locks")] == [key]
    assert set(redis_db.keys()) == {b"canary", fence_key("locks", key)}
    assert redis_db.get("canary") == b"alive"


@pytest.mark.parametrize("table", ["a:b", "x*", "ta ble", "t{}", "ab"])
def test_table_names_that_could_leave_their_namespace_are_refused_before_any_request(make_redis, table):
    client = make_redis(f"redis://127.0.0.1:{closed_port()}/0")  # any request would fail differently
    with pytest.raises(ValueError, match="table must be"):
        SyncDistributedLock(client, table=table, key="k").__enter__()


# ---- malformed rows fail closed --------------------------------------------------------------------
@pytest.mark.parametrize("fields, message", [
    ({"owner": "o", "version": "v", "lease_ms": "abc", "protocol": "1"}, "lease_ms"),
    ({"owner": "o", "version": "v", "lease_ms": "999999999999", "protocol": "1"}, "lease_ms"),
    ({"owner": "o", "version": "v", "lease_ms": "1000", "protocol": "2"}, "protocol"),
    ({"version": "v", "lease_ms": "1000", "protocol": "1"}, "owner"),
    ({"owner": "o", "version": "v", "lease_ms": "1000", "protocol": "1", "waiting": "yes"}, "waiting"),
    ({"owner": "o", "version": "v", "lease_ms": "1000", "protocol": "1", "fence": "-3"}, "fencing token"),
])
def test_malformed_rows_are_refused_and_never_taken_over(make_redis, redis_db, fields, message):
    name = lease_key("locks", "bad")
    redis_db.hset(name, mapping=fields)
    client = make_redis()
    with pytest.raises(MalformedLockRow, match=message):
        SyncDistributedLock(client, table="locks", key="bad", lease_duration=0.2, wait_timeout=1).__enter__()
    assert redis_db.hgetall(name) == {k.encode(): v.encode() for k, v in fields.items()}


def test_a_key_holding_another_type_is_malformed_and_left_alone(make_redis, redis_db):
    redis_db.set(lease_key("locks", "str"), "someone else's value")
    with pytest.raises(MalformedLockRow, match="not a lease"):
        SyncDistributedLock(make_redis(), table="locks", key="str", wait_timeout=1).__enter__()
    assert redis_db.get(lease_key("locks", "str")) == b"someone else's value"


# ---- errors ------------------------------------------------------------------------------------------
def test_an_unreachable_server_is_a_store_error_and_construction_sends_nothing(make_redis):
    port = closed_port()
    client = make_redis(f"redis://:hunter2@127.0.0.1:{port}/0")  # constructing connects to nothing
    with pytest.raises(LockNotAcquired) as info:
        SyncDistributedLock(client, table="locks", key="k", wait_timeout=0.3).__enter__()
    cause = info.value.__cause__
    assert isinstance(cause, StoreError) and cause.maybe_committed is False
    assert f"127.0.0.1:{port}" in str(cause) and "hunter2" not in str(cause) and "hunter2" not in repr(client)


def test_scripts_flushed_from_the_server_are_loaded_again(make_redis, redis_db):
    client = make_redis()
    with SyncDistributedLock(client, table="locks", key="k"):
        redis_db.script_flush()  # NOSCRIPT on the release: it did not run, so it is loaded and sent again
    assert redis_db.exists(lease_key("locks", "k")) == 0
    redis_db.script_flush()
    with SyncDistributedLock(client, table="locks", key="k") as lease:
        assert lease.fencing_token == 2


def test_a_user_without_permission_is_refused_not_retried(make_redis, redis_db, redis_url):
    redis_db.execute_command("ACL", "SETUSER", "reader", "on", ">s3cret-pw", "~*", "+@read", "+@connection")
    try:
        client = make_redis(redis_url.replace("redis://", "redis://reader:s3cret-pw@"))
        started = time.monotonic()
        with pytest.raises(StoreRequestRejected, match="NOPERM|permission") as info:
            SyncDistributedLock(client, table="locks", key="k", wait_timeout=10).__enter__()
        assert time.monotonic() - started < 5  # refused at once, not retried for the wait budget
        assert "s3cret-pw" not in str(info.value)
        bad = make_redis(redis_url.replace("redis://", "redis://reader:wrong-pw@"))
        with pytest.raises(StoreRequestRejected, match="credentials") as info:
            SyncDistributedLock(bad, table="locks", key="k", wait_timeout=10).__enter__()
        assert "wrong-pw" not in str(info.value)
    finally:
        redis_db.execute_command("ACL", "DELUSER", "reader")


def test_a_write_that_commits_after_its_timeout_is_reconciled(make_redis, redis_db, redis_url):
    """A stalled server (DEBUG SLEEP) runs our acquisition after the client gave up on it: a late
    commit. The engine reconciles by reading, finds its own row, and holds it."""
    client = make_redis()
    with SyncDistributedLock(client, table="locks", key="warm-up"):
        pass  # connected: the stall below hits the acquisition's script, not the connect
    with stalled_server(redis_url, 1.0) as staller:
        # lease 0.6 s: each request gives up after 0.2 s, long before the server wakes.
        with SyncDistributedLock(client, table="locks", key="late", lease_duration=0.6, wait_timeout=10) as lease:
            assert redis_db.hget(lease_key("locks", "late"), "owner") == lease.owner.encode()
            assert lease.metrics.request_failures >= 1
            assert lease.fencing_token == int(redis_db.hget(lease_key("locks", "late"), "fence"))
        assert staller.recv(16).startswith(b"+OK")
    assert redis_db.exists(lease_key("locks", "late")) == 0  # nothing left behind


def test_check_in_points_to_fencing_tokens(make_redis):
    with SyncDistributedLock(make_redis(), table="locks", key="k") as lease:
        with pytest.raises(TypeError, match="fencing_token"):
            lease.check_in(object())


def test_bad_constructor_arguments_are_clear(core):
    with pytest.raises(TypeError, match=r"redis\+cluster:// URL, a redis.Redis or a redis.cluster.RedisCluster"):
        RedisClient(42, _engine_module=core)
    with pytest.raises(ValueError, match="bad Redis URL") as info:
        RedisClient("http://user:pw-secret@127.0.0.1/0", _engine_module=core)
    assert "pw-secret" not in str(info.value)
    with pytest.raises(TypeError, match="wake_on_release"):
        RedisClient("redis://127.0.0.1:1/0", wake_on_release="yes", _engine_module=core)


def test_an_asyncio_redis_client_is_refused_with_the_reason(core):
    # Before: "... got Redis", which reads as if a redis.Redis had been refused.
    import redis.asyncio

    async_client = redis.asyncio.Redis.from_url("redis://127.0.0.1:1/0")
    with pytest.raises(TypeError) as info:
        RedisClient(async_client, _engine_module=core)
    message = str(info.value)
    assert "from redis.asyncio" in message and "runs the sync client on worker threads" in message
    assert "Pass redis.Redis(...)" in message


# ---- wake-up on release --------------------------------------------------------------------------
def test_a_release_wakes_a_waiter_of_another_client_through_the_feed(make_redis):
    holder, waiter_client = make_redis(), make_redis()
    feed = waiter_client.store.release_feed
    with SyncDistributedLock(holder, table="locks", key="hot", lease_duration=30):
        waiter = Waiter(waiter_client, "hot")
        wait_until(lambda: feed.subscribed("locks", "hot"), BOUND_S, "the waiter's subscription")
        assert feed.delivered == 0
    waiter.join()
    assert waiter.token == 2 and feed.delivered == 1


def test_a_lost_release_message_only_leaves_the_waiter_to_its_poll(make_redis, redis_db):
    holder, waiter_client = make_redis(), make_redis()
    feed = waiter_client.store.release_feed
    guard = SyncDistributedLock(holder, table="locks", key="hot", lease_duration=30)
    guard.__enter__()
    waiter = Waiter(waiter_client, "hot")
    wait_until(lambda: feed.subscribed("locks", "hot"), BOUND_S, "the waiter's subscription")
    redis_db.delete(lease_key("locks", "hot"))  # gone without a message, as when one is lost
    waiter.join()
    assert waiter.token == 2 and feed.delivered == 0
    holder.close()


def test_the_feed_resubscribes_after_its_connection_is_killed(make_redis, redis_db):
    holder, waiter_client = make_redis(), make_redis()
    feed = waiter_client.store.release_feed
    with SyncDistributedLock(holder, table="locks", key="hot", lease_duration=30):
        waiter = Waiter(waiter_client, "hot")
        wait_until(lambda: feed.subscribed("locks", "hot"), BOUND_S, "the waiter's subscription")
        assert redis_db.execute_command("CLIENT", "KILL", "TYPE", "pubsub") == 1
        wait_until(lambda: not feed.subscribed("locks", "hot"), BOUND_S, "the feed to notice")
        wait_until(lambda: feed.subscribed("locks", "hot"), BOUND_S, "the feed to subscribe again")
    waiter.join()
    assert feed.delivered == 1


@pytest.mark.parametrize("pttl_ms", [0, 40])
def test_a_read_of_a_held_lease_wakes_its_watchers_when_it_expires_even_in_its_last_millisecond(make_redis, pttl_ms):
    """Nothing is published when a crashed holder's lease expires, so a read that finds the lease sets a
    wake-up at its PTTL. Redis answers PTTL 0 for a lease read in the very millisecond it expires (a key
    counts as expired only once the time is past its expiry); such a read must wake the watchers too, at
    the listener's next tick, or the next holder waits up to a poll more."""
    holder, waiter_client = make_redis(), make_redis()
    store, feed = waiter_client.store, waiter_client.store.release_feed
    woken = threading.Event()
    with SyncDistributedLock(holder, table="locks", key="hot", lease_duration=30):
        watch = feed.watch("locks", "hot", woken.set)
        try:
            wait_until(lambda: feed.subscribed("locks", "hot"), BOUND_S, "the watch's subscription")
            fields, _ = store.run_script(store.scripts.observe, "hot", 1.0, store.names("locks", "hot")[:1], ())
            row = store._observed("locks", "hot", [fields, pttl_ms])  # as in its last ms, or 40 ms before it
            assert row is not None and row[0] == hash_fields(fields)["owner"].decode()
            assert woken.wait(BOUND_S), f"a read that gave PTTL {pttl_ms} woke nobody at the lease's expiry"
        finally:
            feed.unwatch(watch)


def test_without_wake_on_release_nothing_subscribes(make_redis, redis_db):
    holder, waiter_client = make_redis(), make_redis(wake_on_release=False)
    with SyncDistributedLock(holder, table="locks", key="hot", lease_duration=30):
        waiter = Waiter(waiter_client, "hot")
        wait_until(lambda: redis_db.hget(lease_key("locks", "hot"), "waiting") == b"1", BOUND_S, "the waiter's mark")
        assert redis_db.pubsub_numsub(b"fastlease:locks:released:hot") == [(b"fastlease:locks:released:hot", 0)]
    waiter.join()
    assert waiter.token == 2


# ---- real processes --------------------------------------------------------------------------------
def test_sixteen_processes_never_hold_a_key_at_the_same_time(children: Children, redis_url, redis_db) -> None:
    holds = run_contenders(children, redis_url, "locks", "hot", CONTENDERS, ROUNDS, True, 2.0)
    assert len(holds) == CONTENDERS * ROUNDS
    holds.sort()  # CLOCK_MONOTONIC is system-wide on Linux: intervals of all processes compare
    overlaps = [(a, b) for a, b in zip(holds, holds[1:]) if b[0] <= a[1]]
    assert not overlaps, f"{len(overlaps)} overlapping holds, e.g. {overlaps[:3]}"
    assert sum(1 for a, b in zip(holds, holds[1:]) if a[3] != b[3]) >= CONTENDERS
    assert redis_db.exists(lease_key("locks", "hot")) == 0  # every hold released
    assert redis_db.get(fence_key("locks", "hot")) == str(CONTENDERS * ROUNDS).encode()


def test_a_sigkilled_holder_is_recovered_by_expiry_within_its_remaining_ttl(children, redis_url, redis_db):
    child = children.start(mp_workers.hold_until_killed, redis_url, "locks", "killed", 2.0, "fastlease", True)
    _, pid, child_owner = receive(child, "held")
    assert redis_db.hget(lease_key("locks", "killed"), "owner") == child_owner.encode()
    kill_and_reap(child)
    remaining_s = redis_db.pttl(lease_key("locks", "killed")) / 1000
    assert 0 < remaining_s <= 2.0
    client = RedisClient(redis_url)
    try:
        started = time.monotonic()
        with SyncDistributedLock(client, table="locks", key="killed", lease_duration=2.0, wait_timeout=10) as lease:
            waited = time.monotonic() - started
            assert lease.fencing_token == 2
        # Expiry, then the wake-up its read set for it (the listener's 10 ms tick), one read and one write:
        # without the wake-up, the next poll comes up to 1.5 poll intervals (0.19 s) after the expiry.
        assert waited <= remaining_s + 0.05, f"recovered {waited:.3f} s after the kill, TTL was {remaining_s:.3f} s"
    finally:
        client.close()
    child.proc.join(JOIN_S)


def test_ci_makes_a_missing_redis_server_a_failure_not_a_skip(tmp_path):
    test = "tests/stores/test_redis.py::test_check_in_points_to_fencing_tokens"
    root = Path(__file__).resolve().parents[2]
    outcomes = {}
    for ci in ("true", ""):
        env = {**os.environ, "REDIS_SERVER": str(tmp_path / "no-such-redis-server"), "CI": ci}
        result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test, "-rs"],
                                cwd=root, env=env, capture_output=True, text=True, timeout=120)
        outcomes[ci] = (result.returncode, result.stdout)
    assert outcomes["true"][0] != 0 and "CI=true: the Redis tests must run" in outcomes["true"][1]
    assert outcomes[""][0] == 0 and "skipped" in outcomes[""][1]


@pytest.mark.server  # starts a redis-server of its own
def test_a_server_down_while_waiting_is_retried_within_the_wait_budget(core):
    from fastlease.testing.redis_server import RedisServer

    port = closed_port()
    client = RedisClient(f"redis://127.0.0.1:{port}/0", _engine_module=core)
    failed = threading.Event()
    call = client.store.call

    def noting_failures(*args: Any, **kwargs: Any) -> Any:
        try:
            return call(*args, **kwargs)
        except StoreError:
            failed.set()
            raise

    client.store.call = noting_failures  # type: ignore[method-assign]
    server = RedisServer()
    try:
        waiter = Waiter(client, "k")
        assert failed.wait(BOUND_S), "the first request did not fail"
        server.start(port=port)  # the server comes (back) while the waiter is within its budget
        waiter.join()
        assert waiter.token == 1
    finally:
        client.close()
        server.stop()


def test_the_async_api_runs_on_redis(make_redis, redis_db):
    import asyncio

    from fastlease import DistributedLock

    async def main() -> int:
        async with DistributedLock(make_redis(), table="locks", key="async") as lease:
            assert redis_db.exists(lease_key("locks", "async")) == 1
            return int(lease.fencing_token)

    assert asyncio.run(main()) == 1
    assert redis_db.exists(lease_key("locks", "async")) == 0


@pytest.mark.parametrize("protocol", [2, 3])
def test_a_client_with_its_own_protocol_and_decoding_works_the_same(make_redis, redis_db, redis_url, protocol):
    import redis

    from fastlease.stores.redis.scripts import release_channel, turn_channel

    user_client = redis.Redis.from_url(redis_url, protocol=protocol, decode_responses=True)
    client, other = make_redis(user_client), make_redis()
    # The release's message, seen by a subscriber of our own to the waiter's client's turn channel: the
    # waiter's feed may not be what wakes it (a poll of its own can find its turn in the half millisecond
    # before the message arrives).
    probe = redis_db.pubsub()
    probe.subscribe(turn_channel(release_channel("locks", "é:k"), other.store.client_token))
    wait_until(lambda: probe.get_message(timeout=0.1), BOUND_S, "our subscription's confirmation")
    with SyncDistributedLock(client, table="locks", key="é:k") as lease:
        [row] = client.inspect("locks")
        assert isinstance(row.pop("version"), str)
        assert row == {"key": "é:k", "owner": lease.owner, "lease_ms": 30_000, "protocol": 1, "waiting": False,
                       "fence": 1}
        waiter = Waiter(other, "é:k")
        wait_until(lambda: other.store.release_feed.subscribed("locks", "é:k"), BOUND_S,
                   "the waiter's subscription")
    waiter.join()
    message = wait_until(lambda: probe.get_message(timeout=0.1), BOUND_S, "the release's message")
    assert message["type"] == "message", message
    assert message["data"].startswith(other.store.client_token.encode() + b"~"), message  # it names the waiter
    assert waiter.token == 2 and other.store.release_feed.delivered <= 1
    probe.close()
    user_client.close()


# ---- the renewal process's store: our own RESP connection, no redis-py ------------------------------
def _renewal_store(client: RedisClient) -> Any:
    """The store the renewal process builds from ``client``'s settings."""
    from fastlease.stores.redis.store import RedisStore

    return RedisStore.from_renewal_config(client.store.renewal_config())


def test_the_renewal_process_renews_on_redis_without_importing_redis_py(make_redis, redis_db, redis_url):
    client = make_redis()
    assert client.store.put_if_absent("locks", "k", "o1", "v1", 5_000, 5.0, NO_USAGE)
    script = textwrap.dedent(f"""
        import sys
        from fastlease._renewal_process import build_store
        from fastlease.stores.base import NO_USAGE
        store = build_store({client.store.renewal_config()!r}, None)
        assert store.update_version_if("locks", "k", "o1", "v1", "v2", 5.0, NO_USAGE) is True
        assert store.update_version_if("locks", "k", "o1", "v1", "v3", 5.0, NO_USAGE) is False
        print(store.read("locks", "k", 5.0, NO_USAGE).version, "redis" in sys.modules, "hashlib" in sys.modules)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["v2", "False", "False"]
    assert 0 < redis_db.pttl(lease_key("locks", "k")) <= 5_000  # RENEW reset the PX


def test_the_renewal_connection_logs_in_selects_the_database_and_names_refused_credentials(
        make_redis, redis_db, redis_url):
    redis_db.execute_command("ACL", "SETUSER", "renewer", "on", ">renew-pw", "~*", "+@all")
    try:
        url = redis_url.replace("redis://", "redis://renewer:renew-pw@").rsplit("/", 1)[0] + "/3"
        client = make_redis(url)
        store = _renewal_store(client)
        try:
            assert store.put_if_absent("locks", "k", "o1", "v1", 5_000, 5.0, NO_USAGE) == 1
            assert store.update_version_if("locks", "k", "o1", "v1", "v2", 5.0, NO_USAGE) is True
            import redis

            db3 = redis.Redis.from_url(redis_url.rsplit("/", 1)[0] + "/3")
            try:
                assert db3.hget(lease_key("locks", "k"), "version") == b"v2"  # in database 3, as the URL says
                db3.flushdb()
            finally:
                db3.close()
        finally:
            store.close()
        wrong = _renewal_store(make_redis(url.replace("renew-pw", "wrong-pw")))
        try:
            with pytest.raises(StoreRequestRejected, match="credentials") as info:
                wrong.read("locks", "k", 5.0, NO_USAGE)
            assert "wrong-pw" not in str(info.value)
        finally:
            wrong.close()
    finally:
        redis_db.execute_command("ACL", "DELUSER", "renewer")


def test_a_renewal_reply_that_comes_after_its_timeout_is_never_read_as_another_request_s(
        make_redis, redis_db, redis_url):
    """The stale-reply hazard of a reused connection: a RENEW that times out may still be answered. Its
    connection is dropped, so the late reply ("1", applied) is never taken for the next request's."""
    client = make_redis()
    store = _renewal_store(client)
    try:
        assert store.put_if_absent("locks", "k", "o1", "v1", 5_000, 5.0, NO_USAGE)
        assert store.read("locks", "k", 5.0, NO_USAGE).version == "v1"  # connected, scripts loaded
        with stalled_server(redis_url, 0.6) as staller:
            with pytest.raises(StoreError) as info:
                store.update_version_if("locks", "k", "o1", "v1", "v2", 0.1, NO_USAGE)
            assert info.value.maybe_committed
            # The next request, on the same thread, sees the row as it is now (renewed once the server
            # woke), not the timed-out RENEW's late reply.
            assert store.update_version_if("locks", "k", "o1", "v1", "v3", 5.0, NO_USAGE) is False
            assert store.read("locks", "k", 5.0, NO_USAGE).version == "v2"
            assert staller.recv(16).startswith(b"+OK")
    finally:
        store.close()


def test_settings_our_connection_does_not_know_renew_through_redis_py(redis_url):
    from fastlease.stores.redis import wire as _resp
    from fastlease.stores.redis.store import RedisStore

    host_port = redis_url.split("//", 1)[1].split("/", 1)[0]
    host, port = host_port.rsplit(":", 1)
    ours = RedisStore.from_renewal_config(("redis", "tcp", {"host": host, "port": int(port), "db": 0}))
    theirs = RedisStore.from_renewal_config(("redis", "tcp", {"host": host, "port": int(port), "db": 0,
                                                               "socket_keepalive_options": {}}))
    try:
        assert ours._redis is _resp.library and ours.release_feed is None
        assert theirs._redis is not _resp.library and type(theirs.new_connection()).__module__.startswith("redis.")
        for store in (ours, theirs):
            assert store.read("locks", "absent", 5.0, NO_USAGE) is None
    finally:
        ours.close()
        theirs.close()


def test_a_redis_py_client_object_is_renewed_by_the_renewal_process_on_our_connection(redis_url, redis_db):
    """redis-py 8 gives every TCP connection a sentinel object as its socket_keepalive_options default:
    taken for a live setting, it kept a ``RedisClient(redis.Redis(...))``'s renewals in the holder,
    where a held GIL stops them."""
    import redis

    from fastlease.stores.redis import wire as _resp

    host, port = redis_url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    client = RedisClient(redis.Redis(host=host, port=int(port), db=0, client_name="orders"))
    try:
        config = client.store.renewal_config()
        assert isinstance(config, tuple) and _resp.honours(config[2]), config
        with SyncDistributedLock(client, table="locks", key="object", lease_duration=1.0) as lease:
            wait_until(lambda: lease.metrics.renewals >= 1, BOUND_S, "a renewal reported by the renewal process")
            assert client.engine.link.pid is not None and client.engine.link.renewing == 1
            # The holder's connection and the renewal process's both carry the client's name.
            assert [entry["name"] for entry in redis_db.client_list()].count("orders") >= 2
    finally:
        client.close()
