"""The host-wide observation cache (docs/protocol.md, "Observation and takeover"): fresh clients
recover an abandoned lease within about a lease, which per-client observations never allow; anything
unusable falls back safely."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import pytest

from fastlease import LockNotAcquired, SyncDistributedLock
from fastlease.stores.base import LockRow

ABANDONED = LockRow("dead-owner", "dead-version", 10_000, 1)


def try_once(client, wait=0.0):
    try:
        with SyncDistributedLock(client, table="locks", key="k", wait_timeout=wait):
            return True
    except LockNotAcquired:
        return False


@pytest.mark.parametrize("shared", [True, False])
def test_fresh_clients_recover_an_abandoned_lease_only_when_sharing(make_client, clock, store, tmp_path, shared):
    store.plant("locks", "k", ABANDONED)
    path = tmp_path / "observations.sqlite3"
    option = str(path) if shared else False
    outcomes = []
    for _ in range(12):  # a cron job: a fresh client every second, one immediate attempt each
        client = make_client(clock=clock, shared_observations=option)
        outcomes.append(try_once(client))
        client.close()
        clock.advance(1.0)
    if shared:
        assert outcomes[:10] == [False] * 10  # never before a full lease of observation
        assert outcomes[10] is True  # first sighting at 0 s, the 10 s lease ends at 10 s
    else:
        assert outcomes == [False] * 12


def test_a_changed_row_restarts_the_shared_observation(make_client, clock, store, tmp_path):
    path = str(tmp_path / "observations.sqlite3")
    store.plant("locks", "k", ABANDONED)
    assert try_once(make_client(clock=clock, shared_observations=path)) is False
    clock.advance(9)
    store.plant("locks", "k", ABANDONED._replace(version="renewed"))  # the holder is alive after all
    assert try_once(make_client(clock=clock, shared_observations=path)) is False
    clock.advance(9)
    assert try_once(make_client(clock=clock, shared_observations=path)) is False  # 9 s of the new version
    clock.advance(1)
    assert try_once(make_client(clock=clock, shared_observations=path)) is True


def test_a_reading_from_the_future_counts_as_a_fresh_sighting(make_client, clock, store, tmp_path):
    from fastlease.testing import FakeClock

    path = str(tmp_path / "observations.sqlite3")
    store.plant("locks", "k", ABANDONED)
    later = FakeClock(monotonic_ns=clock.monotonic_ns() + 3600 * 10**9)
    assert try_once(make_client(clock=later, shared_observations=path)) is False
    # A client whose clock reads earlier than the stored sighting cannot compare: it starts afresh.
    assert try_once(make_client(clock=clock, shared_observations=path)) is False
    clock.advance(9.9)
    assert try_once(make_client(clock=clock, shared_observations=path)) is False


def test_a_file_owned_by_someone_else_falls_back_with_a_warning(
    make_client, clock, store, tmp_path, caplog, monkeypatch
):
    path = tmp_path / "observations.sqlite3"
    path.touch()
    # The file is ours; we pose as another user instead (no root needed to make the owners differ).
    owner = path.stat().st_uid
    monkeypatch.setattr(os, "getuid", lambda: owner + 1)
    store.plant("locks", "k", ABANDONED)
    with caplog.at_level(logging.WARNING, logger="fastlease.observations"):
        client = make_client(clock=clock, shared_observations=str(path))
        assert try_once(client) is False
    assert client.engine.observations.shared is False
    assert any("not owned by this user" in record.getMessage() for record in caplog.records)
    clock.advance(10)
    assert try_once(client) is True  # its own observations still work


def test_an_unusable_path_falls_back(make_client, clock, store, tmp_path):
    store.plant("locks", "k", ABANDONED)
    client = make_client(clock=clock, shared_observations=str(tmp_path))  # a directory, not a file
    assert try_once(client) is False
    assert client.engine.observations.shared is False
    clock.advance(10)
    assert try_once(client) is True


def test_bad_option_type_is_rejected(make_client):
    with pytest.raises(TypeError, match="shared_observations must be"):
        make_client(shared_observations=3)


CRON_JOB = """
import sys, boto3
from fastlease import SyncDistributedLock, LockNotAcquired
from fastlease.dynamodb import DynamoDBClient
endpoint, table, shared = sys.argv[1], sys.argv[2], sys.argv[3]
session = boto3.session.Session(aws_access_key_id="t", aws_secret_access_key="t", region_name="us-east-1")
option = shared if shared != "off" else False
client = DynamoDBClient(session=session, endpoint_url=endpoint, shared_observations=option)
try:
    with SyncDistributedLock(client, table=table, key="nightly", wait_timeout=0):
        print("acquired")
except LockNotAcquired:
    print("busy")
"""


#: Shared sightings must have taken the abandoned 2 s lease over by then (three leases); private ones must
#: not have, in runs that go on at least that long.
CRON_TAKEOVER_BOUND_S = 6.0


@pytest.mark.parametrize("shared", [True, False])
def test_cron_style_processes_against_the_dynamodb_server(moto_endpoint, moto_session, tmp_path, shared):
    from fastlease.dynamodb import DynamoDBClient

    table = f"cron_{'shared' if shared else 'own'}"
    admin = DynamoDBClient(session=moto_session, endpoint_url=moto_endpoint)
    if admin.lock_table_exists(table):
        admin.boto3_client.delete_table(TableName=table)
    admin.create_lock_table(table)
    admin.boto3_client.put_item(TableName=table, Item={  # a holder that crashed: a 2 s lease, never renewed
        "key": {"S": "nightly"}, "owner": {"S": "crashed"}, "version": {"S": "v"},
        "lease_ms": {"N": "2000"}, "protocol": {"N": "1"}})
    admin.close()
    option = str(tmp_path / "observations.sqlite3") if shared else "off"
    started = time.monotonic()
    results = []
    # A fresh process every ~0.4 s after the last one ended, one immediate attempt each, until one acquires
    # or the runs have gone on for the bound (bounded: 30 runs at most).
    for _ in range(30):
        run = subprocess.run([sys.executable, "-c", CRON_JOB, moto_endpoint, table, option],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        results.append((round(time.monotonic() - started, 2), run.stdout.strip()))
        if run.stdout.strip() == "acquired" or results[-1][0] >= CRON_TAKEOVER_BOUND_S:
            break
        time.sleep(0.4)  # the cron interval: the workload's pacing, not synchronisation
    outcomes = [outcome for _, outcome in results]
    if shared:
        assert outcomes[-1] == "acquired", results
        taken_at = results[-1][0]
        assert 2.0 <= taken_at < CRON_TAKEOVER_BOUND_S, results  # after a full lease of shared observation
    else:
        assert "acquired" not in outcomes, results
        assert results[-1][0] >= CRON_TAKEOVER_BOUND_S, results  # for as long as shared sightings may need
