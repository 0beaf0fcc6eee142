"""Leases across real processes on the serialised moto server: contention, SIGKILL, SIGSTOP, pydynox.

Workers run in ``multiprocessing`` *spawn* children (see ``mp_workers``), each with its own clients.
The parent talks to them through one-way Pipes; every wait has a timeout and every child is SIGKILLed
by its PID and joined when its test ends. Each test uses its own tables, since the server is shared by
the whole session. Durations are waited out only where elapsed time is the point of the test.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from typing import Any, Iterator, Optional

import pytest

from fastlease import LockNotAcquired, SyncDistributedLock
from fastlease.dynamodb import DynamoDBClient
from fastlease.exceptions import MalformedLockRow
from helpers import mp_workers
from helpers.processes import JOIN_S, MAX_TAKEOVER_S, MIN_TAKEOVER_S, Children, kill_and_reap, receive, run_contenders
from helpers.waiting import wait_until

KILL_LEASE_S = 1.0  # the lease of holders that get SIGKILLed or SIGSTOPped
CONTENDERS = 4
ROUNDS = 30
CONTENTION_LEASE_S = 2.0

FAST_PATH = pytest.mark.parametrize("fast_path", [True, False], ids=["fast_path", "boto3"])


# ---- fixtures and helpers (spawned children: see helpers.processes and the ``children`` fixture) --
@pytest.fixture
def admin(moto_session: Any, moto_endpoint: str) -> Iterator[DynamoDBClient]:
    client = DynamoDBClient(session=moto_session, endpoint_url=moto_endpoint, fast_path=False)
    try:
        yield client
    finally:
        client.close()


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def lock_table(admin: DynamoDBClient) -> Iterator[str]:
    name = _unique("proc-locks")
    admin.create_lock_table(name)
    assert admin.lock_table_exists(name)
    try:
        yield name
    finally:
        admin.boto3_client.delete_table(TableName=name)


@pytest.fixture
def results_table(admin: DynamoDBClient) -> Iterator[str]:
    name = _unique("proc-results")
    admin.boto3_client.create_table(
        TableName=name,
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
    )
    try:
        yield name
    finally:
        admin.boto3_client.delete_table(TableName=name)


def read_row(admin: DynamoDBClient, table: str, key: str) -> Optional[dict]:
    response = admin.boto3_client.get_item(TableName=table, Key={"key": {"S": key}}, ConsistentRead=True)
    item: Optional[dict] = response.get("Item")
    return item


def scan_all(admin: DynamoDBClient, table: str) -> list:
    items: list = []
    paginator = admin.boto3_client.get_paginator("scan")
    for page in paginator.paginate(TableName=table, ConsistentRead=True, PaginationConfig={"MaxItems": 1000}):
        items.extend(page["Items"])
    return items


def enter(guard: Any) -> None:
    """Enter and leave a guard; reaching the body means it was acquired, which these tests refuse."""
    with guard:
        raise AssertionError("acquired, but should have been refused")


# ---- a. contention across processes ---------------------------------------------------------------
@FAST_PATH
def test_processes_never_hold_a_key_at_the_same_time(
    fast_path: bool, children: Children, admin: DynamoDBClient, lock_table: str, moto_endpoint: str
) -> None:
    holds = run_contenders(children, moto_endpoint, lock_table, "contended", CONTENDERS, ROUNDS, fast_path,
                           CONTENTION_LEASE_S)
    assert len(holds) == CONTENDERS * ROUNDS
    assert len({hold[2] for hold in holds}) == len(holds), "an owner id was reused"
    # CLOCK_MONOTONIC is one system-wide clock on Linux, so the intervals of all processes compare.
    holds.sort()
    overlaps = [(a, b) for a, b in zip(holds, holds[1:]) if b[0] <= a[1]]
    assert not overlaps, f"{len(overlaps)} overlapping holds, e.g. {overlaps[:3]}"
    # The processes really did interleave (not one after the other) and did wait for each other.
    handovers = sum(1 for a, b in zip(holds, holds[1:]) if a[3] != b[3])
    assert handovers >= CONTENDERS, f"only {handovers} handovers between processes"
    assert max(hold[4] for hold in holds) > 0
    assert scan_all(admin, lock_table) == []


# ---- b. a SIGKILLed holder is taken over after its lease ------------------------------------------
@FAST_PATH
def test_sigkilled_holder_is_taken_over_after_its_lease(
    fast_path: bool, children: Children, admin: DynamoDBClient, lock_table: str, moto_endpoint: str
) -> None:
    key = "killed-holder"
    child = children.start(mp_workers.hold_until_killed, moto_endpoint, lock_table, key, KILL_LEASE_S,
                           "fastlease", fast_path)
    _, pid, child_owner = receive(child, "held")
    assert pid == child.proc.pid
    assert read_row(admin, lock_table, key)["owner"]["S"] == child_owner
    kill_and_reap(child)

    client = mp_workers.fastlease_client(moto_endpoint, fast_path)
    try:
        started = time.monotonic()
        with SyncDistributedLock(client, table=lock_table, key=key, lease_duration=1.0, wait_timeout=10) as lease:
            waited = time.monotonic() - started
            lease.raise_if_lost()
            row = read_row(admin, lock_table, key)
            assert row is not None and row["owner"]["S"] == lease.owner != child_owner
            assert row["protocol"] == {"N": "1"} and row["lease_ms"] == {"N": "1000"}
        assert MIN_TAKEOVER_S <= waited < MAX_TAKEOVER_S, f"took over after {waited:.3f} s"
        assert lease.metrics.wait_ms >= MIN_TAKEOVER_S * 1000
        assert read_row(admin, lock_table, key) is None
    finally:
        client.close()


# ---- c. a SIGSTOPped holder cannot commit after it was taken over ---------------------------------
def test_sigstopped_holder_cannot_commit_after_takeover(
    children: Children, admin: DynamoDBClient, lock_table: str, results_table: str, moto_endpoint: str
) -> None:
    key = "stopped-holder"
    child = children.start(mp_workers.commit_after_stop, moto_endpoint, lock_table, results_table, key,
                           KILL_LEASE_S)
    _, pid, child_owner = receive(child, "held")
    os.kill(pid, signal.SIGSTOP)
    # Block until the kernel reports the child stopped (no polling): WUNTRACED returns stopped children
    # without reaping anything. Bounded: SIGSTOP cannot be ignored, and a child that somehow kept running
    # would exit after its own WAIT_S (then this reaps it and the assertion below fails).
    waited_pid, status = os.waitpid(pid, os.WUNTRACED)
    assert waited_pid == pid and os.WIFSTOPPED(status), f"child not stopped: status {status}"

    client = mp_workers.fastlease_client(moto_endpoint)
    try:
        started = time.monotonic()
        with SyncDistributedLock(client, table=lock_table, key=key, lease_duration=5.0, wait_timeout=10) as lease:
            waited = time.monotonic() - started
            assert read_row(admin, lock_table, key)["owner"]["S"] == lease.owner != child_owner
            child.ctl.send("go")
            os.kill(pid, signal.SIGCONT)
            _, _, outcomes = receive(child, "done")
            # The stale holder's attempts changed nothing: the row is still ours and still valid.
            lease.raise_if_lost()
            assert read_row(admin, lock_table, key)["owner"]["S"] == lease.owner
        assert MIN_TAKEOVER_S <= waited < MAX_TAKEOVER_S, f"took over after {waited:.3f} s"
    finally:
        client.close()
    child.proc.join(timeout=JOIN_S)
    assert child.proc.exitcode == 0

    assert outcomes["valid_before_stop"] is True
    commit = outcomes["commit"]
    assert (commit["type"], commit["cause"], commit["chained"]) == ("LockLost", "stolen", "TransactionCanceled"), commit
    # The rejected commit proved another owner holds the row, so the lease itself now says "stolen"
    # (not merely "expired" from its local clock), and so does the release at the end of the block.
    for step in ("raise_if_lost", "exit"):
        assert outcomes[step]["type"] == "LockLost", outcomes[step]
        assert outcomes[step]["cause"] == "stolen", outcomes[step]
    assert outcomes["lost_cause"] == "stolen"
    assert outcomes["valid_after_commit"] is False
    assert outcomes["state"] == "lost"
    item = admin.boto3_client.get_item(TableName=results_table, Key={"id": {"S": key}}, ConsistentRead=True)
    assert "Item" not in item, f"the stale holder's write landed: {item['Item']}"
    assert scan_all(admin, results_table) == []
    assert read_row(admin, lock_table, key) is None


# ---- d. pydynox interop ----------------------------------------------------------------------------
def test_pydynox_and_fastlease_block_each_other(admin: DynamoDBClient, lock_table: str, moto_endpoint: str) -> None:
    # pydynox is imported in each test, not at the top: the wheel tests collect this file without the peer.
    from pydynox.exceptions import LockNotAcquired as PydynoxLockNotAcquired
    from pydynox.lock import SyncDistributedLock as PydynoxLock

    key = "shared"
    client = mp_workers.fastlease_client(moto_endpoint)
    pclient = mp_workers.pydynox_client(moto_endpoint)
    try:
        # Holders use a 10 s lease, so no renewal rewrites the row while we compare it.
        with PydynoxLock(pclient, table=lock_table, key=key, lease_duration=10.0, wait_timeout=5):
            held = read_row(admin, lock_table, key)
            assert held is not None and held["protocol"] == {"N": "1"}
            with pytest.raises(LockNotAcquired):
                enter(SyncDistributedLock(client, table=lock_table, key=key, lease_duration=1.0, wait_timeout=0))
            assert read_row(admin, lock_table, key) == held
        assert read_row(admin, lock_table, key) is None

        with SyncDistributedLock(client, table=lock_table, key=key, lease_duration=10.0, wait_timeout=5) as lease:
            held = read_row(admin, lock_table, key)
            assert held is not None and held["owner"]["S"] == lease.owner
            with pytest.raises(PydynoxLockNotAcquired):
                enter(PydynoxLock(pclient, table=lock_table, key=key, lease_duration=1.0, wait_timeout=0))
            assert read_row(admin, lock_table, key) == held
            lease.raise_if_lost()
        assert read_row(admin, lock_table, key) is None
    finally:
        client.close()


def test_pydynox_holds_renews_and_releases_a_row_marked_waiting(
    admin: DynamoDBClient, lock_table: str, moto_endpoint: str
) -> None:
    from pydynox.lock import SyncDistributedLock as PydynoxLock

    key = "marked"
    client = mp_workers.fastlease_client(moto_endpoint)
    pclient = mp_workers.pydynox_client(moto_endpoint)
    try:
        # A 1 s lease renews every ~0.33 s, so the hold below spans renewals after the mark.
        with PydynoxLock(pclient, table=lock_table, key=key, lease_duration=1.0, wait_timeout=5):
            waiter = SyncDistributedLock(client, table=lock_table, key=key, lease_duration=1.0, wait_timeout=0.6)
            with pytest.raises(LockNotAcquired):
                enter(waiter)  # waits past WAITING_MARK_AFTER_MS, so it marks pydynox's row
            marked = read_row(admin, lock_table, key)
            assert marked is not None and marked["waiting"] == {"BOOL": True}
            # The failed put and the one mark that landed; a mark that raced one of pydynox's renewals
            # (its condition names the version it read) fails, and is one more write and failure each.
            metrics = waiter.metrics
            assert metrics.write_requests == 1 + metrics.conditional_failures >= 2

            def renewed_row() -> Any:
                row = read_row(admin, lock_table, key)
                return row if row is not None and row["version"] != marked["version"] else None

            # pydynox renews about every 0.33 s.
            renewed = wait_until(renewed_row, 5.0, "pydynox's next renewal of its marked row", interval=0.05)
            assert renewed["owner"] == marked["owner"] and renewed["waiting"] == {"BOOL": True}
        assert read_row(admin, lock_table, key) is None  # pydynox's release deleted it as usual
        with SyncDistributedLock(client, table=lock_table, key=key, lease_duration=1.0, wait_timeout=0) as lease:
            assert read_row(admin, lock_table, key)["owner"] == {"S": lease.owner}
    finally:
        client.close()


def test_fastlease_takes_over_a_sigkilled_pydynox_holder(
    children: Children, admin: DynamoDBClient, lock_table: str, moto_endpoint: str
) -> None:
    key = "pydynox-killed"
    child = children.start(mp_workers.hold_until_killed, moto_endpoint, lock_table, key, KILL_LEASE_S,
                           "pydynox", True)
    receive(child, "held")
    child_row = read_row(admin, lock_table, key)
    assert child_row is not None and child_row["lease_ms"] == {"N": "1000"} and child_row["protocol"] == {"N": "1"}
    kill_and_reap(child)

    client = mp_workers.fastlease_client(moto_endpoint)
    try:
        started = time.monotonic()
        with SyncDistributedLock(client, table=lock_table, key=key, lease_duration=1.0, wait_timeout=10) as lease:
            waited = time.monotonic() - started
            assert read_row(admin, lock_table, key)["owner"]["S"] == lease.owner != child_row["owner"]["S"]
            lease.raise_if_lost()
        assert MIN_TAKEOVER_S <= waited < MAX_TAKEOVER_S, f"took over after {waited:.3f} s"
        assert read_row(admin, lock_table, key) is None
    finally:
        client.close()


def test_pydynox_takes_over_a_sigkilled_fastlease_holder(
    children: Children, admin: DynamoDBClient, lock_table: str, moto_endpoint: str
) -> None:
    from pydynox.lock import SyncDistributedLock as PydynoxLock

    key = "fastlease-killed"
    child = children.start(mp_workers.hold_until_killed, moto_endpoint, lock_table, key, KILL_LEASE_S,
                           "fastlease", True)
    _, _, child_owner = receive(child, "held")
    assert read_row(admin, lock_table, key)["owner"]["S"] == child_owner
    kill_and_reap(child)

    pclient = mp_workers.pydynox_client(moto_endpoint)
    started = time.monotonic()
    with PydynoxLock(pclient, table=lock_table, key=key, lease_duration=1.0, wait_timeout=10):
        waited = time.monotonic() - started
        row = read_row(admin, lock_table, key)
        assert row is not None and row["owner"]["S"] != child_owner
        assert row["protocol"] == {"N": "1"} and row["lease_ms"] == {"N": "1000"}
    assert MIN_TAKEOVER_S <= waited < MAX_TAKEOVER_S, f"took over after {waited:.3f} s"
    assert read_row(admin, lock_table, key) is None


def test_both_libraries_fail_closed_on_a_protocol_2_row(
    admin: DynamoDBClient, lock_table: str, moto_endpoint: str
) -> None:
    from pydynox.lock import SyncDistributedLock as PydynoxLock

    key = "from-the-future"
    row_lease_s = 1.0
    item = {
        "key": {"S": key},
        "owner": {"S": str(uuid.uuid4())},
        "version": {"S": str(uuid.uuid4())},
        "lease_ms": {"N": str(int(row_lease_s * 1000))},
        "protocol": {"N": "2"},
    }
    admin.boto3_client.put_item(TableName=lock_table, Item=item)
    client = mp_workers.fastlease_client(moto_endpoint)
    pclient = mp_workers.pydynox_client(moto_endpoint)

    def both_refuse(wait_timeout: float) -> None:
        with pytest.raises(MalformedLockRow, match="unsupported protocol 2"):
            enter(SyncDistributedLock(client, table=lock_table, key=key, lease_duration=1.0, wait_timeout=wait_timeout))
        assert read_row(admin, lock_table, key) == item
        # pydynox 1.8.0 reports such a row as a plain ValueError.
        with pytest.raises(ValueError, match="unsupported distributed lock record") as refused:
            enter(PydynoxLock(pclient, table=lock_table, key=key, lease_duration=1.0, wait_timeout=wait_timeout))
        assert type(refused.value) is ValueError
        assert read_row(admin, lock_table, key) == item

    try:
        both_refuse(0)
        # Not even after the row's lease has passed unchanged (same clients: any observation they made
        # would now be old enough for a takeover). Elapsed time is the point here, so we wait it out.
        threading.Event().wait(row_lease_s * 1.6)
        both_refuse(0)
        both_refuse(2.0)  # a wait longer than the row's lease does not help either
        assert read_row(admin, lock_table, key) == item
    finally:
        client.close()
