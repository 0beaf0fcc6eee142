"""The bounded chaos run of ``make test`` (about 90 s over the six stores; ``make chaos`` runs long ones),
plus tests that the checker and the fault proxy can fail, so a clean run means something."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from helpers.waiting import wait_until

from . import election_drill, gil_drill, semaphore_drill, workload
from .harness import RECOVERY_BOUND_S, _check, run
from .proxy import FaultProxy

#: Seconds of faults per store. The Redis Cluster's run also starts three nodes (about 3 s).
#: Seconds of each store's election drill.
ELECTION_SECONDS = 10.0
#: Seconds of each store's semaphore drill.
SEMAPHORE_SECONDS = 10.0
SECONDS = {"memory": 10.0, "sqlite": 14.0, "redis": 14.0, "redis-cluster": 9.0, "dynamodb": 16.0, "postgres": 14.0}


#: The drills' stores: their workers are processes (SIGKILL, SIGSTOP), and all but SQLite need a server.
PROCESS_STORES = [
    pytest.param("sqlite", marks=pytest.mark.posix),
    pytest.param("redis", marks=[pytest.mark.server, pytest.mark.posix]),
    pytest.param("redis-cluster", marks=[pytest.mark.server, pytest.mark.posix]),
    pytest.param("dynamodb", marks=[pytest.mark.server, pytest.mark.posix]),
    pytest.param("postgres", marks=[pytest.mark.server, pytest.mark.posix]),
]


def need_server(store: str, request: pytest.FixtureRequest) -> None:
    """Start the session's server for ``store``: skips (or fails under CI=true) without it."""
    fixture = {"redis": "redis_url", "redis-cluster": "redis_cluster_url", "postgres": "postgres_dsn"}.get(store)
    if fixture is not None:
        request.getfixturevalue(fixture)


# Workers are processes (SIGKILL, SIGSTOP) except on memory; DynamoDB, Redis, the Redis Cluster and
# PostgreSQL run their own servers.
@pytest.mark.slow
@pytest.mark.parametrize("store", [pytest.param("memory"), *PROCESS_STORES])
def test_mutual_exclusion_holds_under_faults(store, request):
    need_server(store, request)
    lines: list[str] = []
    report = run(store, SECONDS[store], say=lines.append)
    print(report.line())
    assert report["commits"] > 20, report
    assert report["kills"] + report["pauses"] + report["injected"] + report["clock_jumps"] >= 3, report
    assert (report["lost_updates"], report["double_commits"], report["stale_commits"]) == (0, 0, 0), report.line()
    assert report["worst_recovery_s"] <= RECOVERY_BOUND_S, report.line()


@pytest.mark.slow
@pytest.mark.parametrize("store", PROCESS_STORES)
def test_no_two_leaders_at_once_and_terms_rise_under_kills_and_pauses(store, request):
    need_server(store, request)
    lines: list[str] = []
    report = election_drill.run(store, ELECTION_SECONDS, say=lines.append)
    print(election_drill.line(report))
    assert report["kills"] + report["pauses"] >= 2 and report["terms"] >= 3, report
    assert (report["overlaps"], report["decreasing"]) == ([], 0), election_drill.line(report)
    assert report["worst_failover_s"] <= election_drill.FAILOVER_BOUND_S, election_drill.line(report)


def test_the_election_checker_catches_overlaps_old_terms_and_no_successor():
    clean = [("elected", 1, 0.0), ("valid", 1, 0.9), ("ending", 1, 0.5), ("elected", 2, 0.6), ("valid", 2, 1.5)]
    assert election_drill.check(clean, [])["overlaps"] == []  # the ending cuts term 1's claim at 0.5
    overlap = [("elected", 1, 0.0), ("valid", 1, 0.9), ("elected", 2, 0.6)]  # killed: its claim stands
    assert election_drill.check(overlap, [])["overlaps"] == [(1, 2, pytest.approx(0.3))]
    backwards = [("elected", 2, 0.0), ("ending", 2, 0.1), ("elected", 1, 0.2)]
    assert election_drill.check(backwards, [])["decreasing"] == 1
    twice = [("elected", 1, 0.0), ("ending", 1, 0.1), ("elected", 1, 0.2)]
    assert election_drill.check(twice, [])["decreasing"] >= 1
    assert election_drill.check(clean, [(0.55, "kill_leader")])["worst_failover_s"] == pytest.approx(0.05)
    assert election_drill.check(clean, [(0.7, "kill_leader")])["worst_failover_s"] == float("inf")


def test_the_checker_catches_each_violation():
    clean = [(1, "a", 1), (2, "a", 1), (3, "b", 2)]
    assert _check("x", 0, 3, clean, [], [], 0, 0, 0, 0, {})["lost_updates"] == 0
    lost = _check("x", 0, 2, clean, [], [], 0, 0, 0, 0, {})  # two writers read the same value
    assert lost["lost_updates"] > 0
    double = _check("x", 0, 3, [(1, "a", 1), (2, "a", 1), (2, "b", 2)], [], [], 0, 0, 0, 0, {})
    assert double["double_commits"] == 1
    stale = _check("x", 0, 3, [(1, "a", 1), (2, "b", 2), (3, "a", 1)], [], [], 0, 0, 0, 0, {})
    assert stale["stale_commits"] >= 1  # "a" committed again after "b" took over, with an older token
    unrecovered = _check("x", 0, 1, [(1, "a", 1)], [(10.0, "a")], [(11.0, "kill_holder", "a")], 1, 0, 0, 0, {})
    assert unrecovered["worst_recovery_s"] == float("inf")


# The interleaving of a CI failure (redis, seed 2181978610: a double commit): the old holder (token 1)
# reads v and is paused past its lease; the new holder (token 2) reads v; the old holder's late write
# lands before the new holder's. With only the write fenced, both wrote v+1. The fenced read refuses it.
def test_the_fenced_read_refuses_a_paused_holders_late_write_in_memory():
    target = workload.MemoryTarget()
    old = target.read(1)
    new = target.read(2)
    assert (old, new) == (0, 0)
    assert target.write(old + 1, 1, "old") is False  # the new holder's read was seen: refused
    assert target.write(new + 1, 2, "new") is True
    assert target.read(1) is None  # an old holder's read is refused too
    assert (target.value, target.commits) == (1, [(1, "new", 2)])


def test_the_fenced_read_refuses_a_paused_holders_late_write_on_redis(redis_db):
    keys = ("chaos:counter", "chaos:max_token")

    def write(value, token, owner):
        return redis_db.eval(workload.FENCED_INCREMENT, 3, *keys, "chaos:commits", value, token, owner)

    old = redis_db.eval(workload.FENCED_READ, 2, *keys, 1)
    new = redis_db.eval(workload.FENCED_READ, 2, *keys, 2)
    assert (old, new) == (0, 0)
    assert write(old + 1, 1, "old") == 0  # refused
    assert write(new + 1, 2, "new") == 1
    assert redis_db.eval(workload.FENCED_READ, 2, *keys, 1) is None
    assert redis_db.eval(workload.FENCED_READ, 2, *keys, 2) == 1
    assert redis_db.lrange("chaos:commits", 0, -1) == [b"1|new|2"]


def test_the_proxy_loses_responses_delays_commits_and_partitions(redis_url, redis_db):
    import redis

    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    proxy = FaultProxy("127.0.0.1", port)
    proxied = None
    try:
        proxy_port = proxy.start()
        proxied = redis.Redis(port=proxy_port, socket_timeout=0.3, retry=None)
        proxied.set("k", "0")
        proxy.set_fault("lost_response")
        with pytest.raises(redis.exceptions.ConnectionError):
            proxied.set("k", "lost")
        assert redis_db.get("k") == b"lost"  # applied; only the answer was lost
        assert proxied.ping()  # connected again (the handshake must not be what the next fault delays)
        proxy.set_fault("late_commit", 0.6)
        with pytest.raises(redis.exceptions.TimeoutError):
            proxied.set("k", "late")
        assert redis_db.get("k") == b"lost"  # not yet ...
        wait_until(lambda: redis_db.get("k") == b"late", 10, "the late commit to land", interval=0.02)  # ... but later
        assert proxied.ping()
        proxy.set_fault("partition", 0.5)
        with pytest.raises(redis.exceptions.TimeoutError):
            proxied.set("k", "cut")
        proxied.close()

        def read_on_a_new_connection() -> Any:  # (the value,), or None while the partition lasts
            nonlocal proxied
            proxied = redis.Redis(port=proxy_port, socket_timeout=0.3, retry=None)
            try:
                return (proxied.get("k"),)
            except redis.exceptions.TimeoutError:
                proxied.close()
                return None

        # The partition heals after its 0.5 s; the partitioned write was dropped, never applied.
        assert wait_until(read_on_a_new_connection, 10, "the partition to heal", interval=0) == (b"late",)
        with socket.create_connection(("127.0.0.1", proxy_port), timeout=5) as raw:
            raw.sendall(b"PING\r\n")
            assert raw.recv(16) == b"+PONG\r\n"
            proxy.set_fault("reset")
            try:
                assert raw.recv(16) == b""  # closed under us
            except ConnectionResetError:
                pass
    finally:
        if proxied is not None:
            proxied.close()
        proxy.stop()


@pytest.mark.slow
@pytest.mark.parametrize("store", PROCESS_STORES)
def test_never_more_than_the_limit_hold_a_semaphore_under_kills_and_pauses(store, request):
    need_server(store, request)
    lines: list[str] = []
    report = semaphore_drill.run(store, SEMAPHORE_SECONDS, say=lines.append)
    print(semaphore_drill.line(report))
    assert report["kills"] + report["pauses"] >= 2 and report["holds"] >= 10, report
    assert (report["over_limit"], report["overlaps"], report["decreasing"]) == (False, [], 0), \
        semaphore_drill.line(report)
    assert report["worst_recovery_s"] <= semaphore_drill.RECOVERY_BOUND_S, semaphore_drill.line(report)


def test_the_semaphore_checker_catches_too_many_holders_overlaps_old_tokens_and_no_recovery():
    clean = [("acquired", "a", 0, 1, 0.0), ("valid", "a", 0.9), ("ending", "a", 0.5),
             ("acquired", "b", 1, 1, 0.1), ("valid", "b", 0.8),
             ("acquired", "c", 0, 2, 0.6), ("valid", "c", 1.5)]
    report = semaphore_drill.check(clean, [], 2)
    assert (report["most_valid_at_once"], report["over_limit"], report["overlaps"], report["decreasing"]) == \
        (2, False, [], 0)
    three = [*clean, ("acquired", "d", 1, 2, 0.7), ("valid", "d", 1.0), ("acquired", "e", 2, 1, 0.75)]
    assert semaphore_drill.check(three, [], 2)["over_limit"] is True  # c, d and e at 0.75
    killed = [("acquired", "a", 0, 1, 0.0), ("valid", "a", 0.9), ("acquired", "c", 0, 2, 0.6)]  # its claim stands
    assert semaphore_drill.check(killed, [], 2)["overlaps"] == [(0, "a", "c", pytest.approx(0.3))]
    backwards = [("acquired", "a", 0, 2, 0.0), ("ending", "a", 0.1), ("acquired", "c", 0, 1, 0.2)]
    assert semaphore_drill.check(backwards, [], 2)["decreasing"] == 1
    assert semaphore_drill.check(clean, [(0.55, "kill_holder", 0)], 2)["worst_recovery_s"] == pytest.approx(0.05)
    assert semaphore_drill.check(clean, [(0.7, "kill_holder", 0)], 2)["worst_recovery_s"] == float("inf")


def test_the_gil_drill_checker_catches_an_acquisition_inside_the_holders_claim():
    def held(lost=None, valid_until=3.7, leaving=2.9):
        return {"started": 0.0, "ended": 2.8, "lost": lost, "valid_until": valid_until, "leaving": leaving}

    handoff = gil_drill.check([(held(), {"acquired": 2.91})])  # after the holder left the block: its release
    assert (handoff["overlaps"], handoff["lost_during_call"]) == ([], 0)
    assert handoff["after_call_end_s"] == (pytest.approx(0.11), pytest.approx(0.11))
    report = gil_drill.check([(held(), {"acquired": 2.14})])  # issue 32's claim: inside the call
    assert [round(claimed_for, 2) for claimed_for, _, _ in report["overlaps"]] == [0.76]
    ended_early = gil_drill.check([(held(valid_until=2.0), {"acquired": 2.14})])  # its validity ended first
    assert ended_early["overlaps"] == []
    lost = gil_drill.check([(held(lost="expired", valid_until=None), {"acquired": 1.01})])
    assert (lost["overlaps"], lost["lost_during_call"]) == ([], 1)
    assert gil_drill.check([(held(), {"acquired": None})])["acquisitions"] == 0
