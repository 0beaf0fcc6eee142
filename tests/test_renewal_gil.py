"""Renewal while the holder's GIL is held, and no renewal while the holder is stopped, on every store.

The holder runs in a spawned child (``gil_workers``) with its own client; the contender in another
process (or, for SIGSTOP, in this one). With ``renewal="auto"`` the client's renewal process renews a
1 s lease through a hold of the GIL of either shape (``SHAPES``): 4.5 s of ``sum(range(N))`` C calls
back to back, no other thread given the GIL between them (``gil_workers.hold_gil``), or one
``sum(range(N))`` of 2.3-3.2 s begun right after the acquisition, as in issue 32's report. Either
keeps every Python thread of the holder (its in-process renewal thread too) from running; a
contender that starts with the call and
waits past its end must get the key only once the holder's ownership is over: its confirmed
acquisition, on the host's monotonic clock, never falls inside the holder's validity (as the holder
knows it after the call) before the holder leaves the block. A SIGSTOPped holder sends no pulse, so
its renewal process stops renewing and a contender takes over after the lease; the resumed holder
finds the lease lost and leaves the new owner's row alone. The control, ``renewal="thread"``, shows
the first test can fail: the call outlives the lease.

Every wait is bounded (``helpers.processes.receive``); the ``children`` fixture SIGKILLs every child by
its PID when a test ends. Monotonic times compare across processes (CLOCK_MONOTONIC is system-wide).
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from typing import Any, Iterator, NamedTuple, Tuple

import pytest

from chaos.gil_drill import inside_claim_s
from fastlease import SyncDistributedLock
from helpers import gil_workers, mp_workers
from helpers.processes import JOIN_S, MIN_TAKEOVER_S, Child, Children, receive, tell

pytestmark = pytest.mark.all_pythons

LEASE_S = 1.0


class Shape(NamedTuple):
    """A GIL hold: ``call_s`` long; a call shorter than ``min_call_s`` is run once more, then fails the test.
    Renewals are due every lease/3, so a call of ``min_call_s`` spans at least ``min_renewals``."""

    call_s: float
    min_call_s: float
    min_renewals: int


SHAPES = {
    # C calls of GIL_CHUNK_S back to back, ending on time (4 s at least: 12 renewals on time).
    "chunks": Shape(call_s=4.5, min_call_s=4.0, min_renewals=8),
    # One sum(range(N)), begun right after the acquisition, the switch interval as it is: the shape of the
    # report in issue 32 (2.8 s there). Its length follows the machine's speed, and one long sum runs
    # faster per element than the short ones it is scaled from: aimed at 2.8 s, calls here lasted 2.19-2.80
    # s. Aimed at 3.2 s, it stays above the 2.3 s that the test needs (two leases after the contender's
    # start, with room for both processes' start-up).
    "one": Shape(call_s=3.2, min_call_s=2.3, min_renewals=5),
}
CALL_ATTEMPTS = 2
#: The contender waits past the call's end, so that it acquires once the holder has left the block.
CONTENDER_EXTRA_WAIT_S = 3.0
#: The SIGSTOP test's contender waits this long, and must have taken over within STOP_BOUND_S of the stop
#: (one lease after the renewal process's last renewal, which comes at most 400 ms after the last pulse).
TAKEOVER_WAIT_S = 6.0
STOP_BOUND_S = 3.0

STORES = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("redis", id="redis", marks=pytest.mark.server),
    pytest.param("redis-cluster", id="redis-cluster", marks=pytest.mark.server),
    pytest.param("dynamodb", id="dynamodb", marks=pytest.mark.server),
    pytest.param("postgres", id="postgres", marks=pytest.mark.server),
]


class Target(NamedTuple):
    name: str
    endpoint: str  # what mp_workers.fastlease_client takes
    table: str


@pytest.fixture(params=STORES)
def target(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Target]:
    """A store for the test's processes: a temp SQLite file, the session's redis-server or Redis Cluster, a new table on
    the session's serialised moto server, or a lock table in the session PostgreSQL's emptied schema (those
    fixtures fail under CI=true when the server cannot start)."""
    if request.param == "sqlite":
        yield Target("sqlite", f"sqlite:{tmp_path / 'locks.sqlite3'}", "locks")
    elif request.param == "redis":
        yield Target("redis", request.getfixturevalue("redis_url"), "locks")
    elif request.param == "redis-cluster":
        yield Target("redis-cluster", request.getfixturevalue("redis_cluster_url"), "locks")
    elif request.param == "postgres":
        from fastlease import PostgresClient

        dsn = request.getfixturevalue("postgres_db")
        admin = PostgresClient(dsn)
        admin.create_lock_table("locks")
        admin.close()
        yield Target("postgres", dsn, "locks")
    else:
        from fastlease.dynamodb import DynamoDBClient

        endpoint = request.getfixturevalue("moto_endpoint")
        admin = DynamoDBClient(session=request.getfixturevalue("moto_session"), endpoint_url=endpoint,
                               fast_path=False)
        table = f"gil-locks-{uuid.uuid4().hex[:12]}"
        admin.create_lock_table(table)
        try:
            yield Target("dynamodb", endpoint, table)
        finally:
            admin.boto3_client.delete_table(TableName=table)
            admin.close()


def _key() -> str:
    return f"gil-{uuid.uuid4().hex[:12]}"


def _joined(*workers: Child) -> None:
    for worker in workers:
        worker.proc.join(timeout=JOIN_S)
        assert worker.proc.exitcode == 0, f"child {worker.proc.pid} exited with {worker.proc.exitcode}"


def _gil_attempt(children: Children, target: Target, renewal: str, shape: str) -> Tuple[dict, dict, float]:
    key = _key()
    call_s = SHAPES[shape].call_s
    holder = children.start(gil_workers.hold_through_gil_call, target.endpoint, target.table, key, LEASE_S,
                            renewal, call_s, shape)
    contender = children.start(gil_workers.contend_once, target.endpoint, target.table, key, LEASE_S,
                               call_s + CONTENDER_EXTRA_WAIT_S)
    receive(contender, "ready")  # client built: its attempt starts the moment it is told
    tell(holder, "calibrate")  # now that the contender's start-up no longer competes for the CPU
    receive(holder, "ready")
    tell(holder, "go")
    _, _, _, starting_at = receive(holder, "starting", timeout_s=15)
    tell(contender, "go")
    _, _, attempt = receive(contender, "done", timeout_s=call_s + CONTENDER_EXTRA_WAIT_S + 15)
    _, _, result = receive(holder, "done", timeout_s=4 * call_s + 15)
    _joined(holder, contender)
    call_s = result["ended"] - result["started"]
    print(f"\n{target.name} renewal={renewal} shape={shape}: call {call_s:.2f} s (N={result['n']:,}), "
          f"longest tick gap {result['longest_tick_gap']:.2f} s, renewals {result['renewals']}, contender "
          f"{attempt['outcome']['type'] or 'acquired'} after {attempt['ended'] - attempt['started']:.2f} s, "
          f"{attempt['ended'] - result['ended']:.2f} s after the call's end")
    return result, attempt, starting_at


def run_gil_call(children: Children, target: Target, renewal: str, shape: str = "chunks") -> Tuple[dict, dict]:
    """The holder's GIL-holding call (of ``SHAPES[shape]``) with a contender started when it begins: (the
    holder's result, the contender's attempt). A call that came out shorter than its ``min_call_s`` (the
    calibration met a slow moment of the machine) is run once more, with new processes and a new key."""
    least = SHAPES[shape].min_call_s
    for attempts_left in reversed(range(CALL_ATTEMPTS)):
        result, attempt, starting_at = _gil_attempt(children, target, renewal, shape)
        call_s = result["ended"] - result["started"]
        if call_s >= least or not attempts_left:
            break
        print(f"the call lasted {call_s:.2f} s (< {least} s): once more")
    assert call_s >= least, f"the GIL-holding call lasted {call_s:.2f} s (< {least} s): calibration off"
    if result["gil_enabled"]:
        # A Python thread of the holder could not run during the call: the GIL really was held throughout.
        assert result["longest_tick_gap"] >= 0.9 * call_s, (
            f"the holder's other threads ran during the call (longest gap {result['longest_tick_gap']:.2f} s "
            f"of {call_s:.2f} s): the call did not hold the GIL")
    assert attempt["started"] >= starting_at, "the contender started before the holder's call"
    assert attempt["started"] + 2 * LEASE_S < result["ended"], (
        f"the contender started {result['ended'] - attempt['started']:.2f} s before the call's end: too late "
        "for an expiry or a takeover to fall inside the call, so this run tested nothing")
    assert_no_overlap(result, attempt)
    return result, attempt


def assert_no_overlap(result: dict, attempt: dict) -> None:
    """The contender's confirmed acquisition (``acquire`` had returned) is not inside the holder's
    ownership: the holder's validity as it knew it after the call, up to when it left the block (its
    release follows). A holder that found the lease lost claims nothing."""
    acquired = None if attempt["outcome"]["type"] is not None else attempt["ended"]
    inside = inside_claim_s(result["valid_until"], result["leaving"], acquired)
    assert inside == 0, (
        f"two holders at once: the contender's acquisition was confirmed {inside:.3f} s "
        f"before the holder's ownership ended (the holder's call ran {result['ended'] - result['started']:.2f} s, "
        f"its raise_if_lost: {result['raise_if_lost']}, renewals {result['renewals']}; the contender acquired "
        f"{attempt['ended'] - result['started']:.2f} s into the call)")


@pytest.mark.c_extension  # the native pulse: the pure-Python one stops while the GIL is held
@pytest.mark.parametrize("shape", list(SHAPES))
def test_renewal_process_keeps_the_lease_through_a_gil_holding_call(
    target: Target, shape: str, children: Children
) -> None:
    result, attempt = run_gil_call(children, target, "auto", shape)
    assert attempt["outcome"]["type"] is None, f"the contender never acquired: {attempt['outcome']}"
    assert attempt["ended"] >= result["leaving"], (
        f"the contender acquired {result['leaving'] - attempt['ended']:.2f} s before the holder left the block")
    assert result["renewal_pid"] is not None, "no renewal process was started"
    assert result["raise_if_lost"]["type"] is None, f"the lease was lost during the call: {result['raise_if_lost']}"
    least = SHAPES[shape]
    assert result["renewals"] >= least.min_renewals, (
        f"{result['renewals']} renewals during a call of at least {least.min_call_s} s at a 1 s lease")
    assert result["exit"]["type"] is None, f"the release failed: {result['exit']}"
    assert (result["state"], result["lost_cause"]) == ("released", None)
    # Released: no row of the holder's is left (the contender's own, acquired right after, may be).
    assert [row for row in result["rows_after"] if row["owner"] == result["owner"]] == []


@pytest.mark.parametrize("target", ["sqlite"], indirect=True)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_control_renewal_thread_loses_the_lease_during_a_gil_holding_call(
    target: Target, shape: str, children: Children
) -> None:
    if not gil_workers.gil_enabled():
        pytest.skip("a free-threaded interpreter without the GIL: the renewal thread runs during the call")
    result, attempt = run_gil_call(children, target, "thread", shape)
    lost = result["raise_if_lost"]
    assert (lost["type"], lost["cause"]) == ("LockLost", "expired"), f"the lease was not lost: {lost}"
    assert result["renewals"] == 0
    assert result["renewal_pid"] is None
    # What the loss means: a second holder got the key while the first one was still in its call.
    assert attempt["outcome"]["type"] is None, f"the contender did not take over: {attempt['outcome']}"


def _process_state(pid: int) -> str:
    """The kernel's one-letter state of ``pid`` (R, S, D: running; T: stopped; Z: zombie), "gone" if it
    has exited; "alive" where there is no /proc (macOS)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return "gone"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "gone"
    return "alive"


def test_stopped_holder_is_taken_over_and_leaves_the_new_row_alone(target: Target, children: Children) -> None:
    key = _key()
    child = children.start(gil_workers.hold_until_continued, target.endpoint, target.table, key, LEASE_S)
    _, pid, child_owner, renewal_pid, renewals = receive(child, "held")
    assert renewal_pid is not None and renewals >= 2, (renewal_pid, renewals)
    client = mp_workers.fastlease_client(target.endpoint)
    try:
        os.kill(pid, signal.SIGSTOP)
        # Block until the kernel reports the child stopped (bounded: SIGSTOP cannot be ignored).
        waited_pid, status = os.waitpid(pid, os.WUNTRACED)
        assert waited_pid == pid and os.WIFSTOPPED(status), f"child not stopped: status {status}"
        stopped_at = time.monotonic()
        try:
            guard = SyncDistributedLock(client, table=target.table, key=key, lease_duration=5.0,
                                        wait_timeout=TAKEOVER_WAIT_S)
            with guard as lease:
                took_over_s = time.monotonic() - stopped_at
                # The renewal process ran all along: it stopped renewing by its rule (no pulse), not by a stop.
                renewal_state = _process_state(renewal_pid)
                rows = client.inspect(target.table, key)
                assert [row["owner"] for row in rows] == [lease.owner] != [child_owner]
                tell(child, "continue")
                os.kill(pid, signal.SIGCONT)
                _, _, result = receive(child, "done", timeout_s=30)
                lease.raise_if_lost()
                rows = client.inspect(target.table, key)
                assert [row["owner"] for row in rows] == [lease.owner], f"the resumed holder changed the row: {rows}"
            assert client.inspect(target.table, key) == []
        finally:
            try:
                os.kill(pid, signal.SIGCONT)  # (a no-op if it runs; the children fixture SIGKILLs it either way)
            except ProcessLookupError:
                pass
    finally:
        client.close()
    _joined(child)
    print(f"\n{target.name}: taken over {took_over_s:.2f} s after SIGSTOP; renewal process "
          f"{renewal_state}; holder then: raise_if_lost {result['raise_if_lost']['cause']}, "
          f"exit {result['exit']['cause']}")
    assert renewal_state in ("R", "S", "D", "alive"), f"the renewal process was {renewal_state} during the stop"
    assert MIN_TAKEOVER_S <= took_over_s < STOP_BOUND_S, f"taken over {took_over_s:.2f} s after the stop"
    lost = result["raise_if_lost"]
    assert (lost["type"], lost["cause"]) == ("LockLost", "expired"), lost  # paused, not cut off: expired
    assert result["valid"] is False
    # Its release found another owner's row: nothing deleted, LockLost (stolen) from the block's exit.
    assert (result["exit"]["type"], result["exit"]["cause"]) == ("LockLost", "stolen"), result["exit"]
    assert result["state"] == "lost"
