"""Security checks: owner ids from the operating system's CSPRNG, and credentials that never reach a
repr, a log line or an exception message (injection-shaped keys are in the store contract suite)."""

from __future__ import annotations

import logging
import os
import random
import uuid

import pytest

from fastlease import LockNotAcquired, SyncDistributedLock
from fastlease.exceptions import StoreRequestRejected


def test_owner_and_version_ids_come_from_os_urandom(core, monkeypatch):
    calls = []
    real = os.urandom

    def counting(size: int) -> bytes:
        calls.append(size)
        return real(size)

    monkeypatch.setattr(os, "urandom", counting)
    random.seed(7)
    first = [core.new_token() for _ in range(600)]  # more than one refill of any internal pool
    random.seed(7)  # Python's `random` plays no part: the same seed gives new ids
    second = [core.new_token() for _ in range(600)]
    assert calls, "no token drew on os.urandom"
    assert len(set(first + second)) == 1200
    assert all(uuid.UUID(token).version == 4 for token in first + second)


SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCY-SECRET-KEY"


@pytest.fixture
def debug_logs(caplog):
    caplog.set_level(logging.DEBUG)  # every logger, fastlease's and the SDKs' included
    return caplog


def test_aws_secret_key_never_appears_in_reprs_logs_or_errors(moto_endpoint, debug_logs):
    import boto3

    from fastlease.dynamodb import DynamoDBClient

    session = boto3.session.Session(aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key=SECRET,
                                    region_name="us-east-1")
    seen = []
    for fast_path in (True, False):
        client = DynamoDBClient(session=session, endpoint_url=moto_endpoint, fast_path=fast_path)
        try:
            if not client.lock_table_exists("secure_locks"):
                client.create_lock_table("secure_locks")
            with SyncDistributedLock(client, table="secure_locks", key="k") as lease:
                seen += [repr(lease), repr(client), str(lease.metrics)]
            unreachable = DynamoDBClient(session=session, endpoint_url="http://127.0.0.1:1", fast_path=fast_path)
            with pytest.raises(LockNotAcquired) as info:
                SyncDistributedLock(unreachable, table="secure_locks", key="k", wait_timeout=0.2).__enter__()
            seen += [str(info.value), repr(info.value), str(info.value.__cause__), repr(unreachable)]
            unreachable.close()
        finally:
            client.close()
    assert debug_logs.records, "nothing was logged: the test would prove nothing"
    everything = "\n".join(seen) + debug_logs.text
    assert SECRET not in everything


def test_redis_password_never_appears_in_reprs_logs_or_errors(redis_url, redis_db, debug_logs):
    from fastlease.redis import RedisClient

    password = "pw-" + SECRET
    redis_db.execute_command("ACL", "SETUSER", "locker", "on", f">{password}", "~*", "&*", "+@all")
    try:
        url = redis_url.replace("redis://", f"redis://locker:{password}@")
        client = RedisClient(url)
        seen = [repr(client)]
        try:
            with SyncDistributedLock(client, table="secure", key="k") as lease:
                seen.append(repr(lease))
        finally:
            client.close()
        wrong = RedisClient(url.replace(password, password + "-wrong"))
        with pytest.raises(StoreRequestRejected) as info:
            SyncDistributedLock(wrong, table="secure", key="k", wait_timeout=0.2).__enter__()
        seen += [str(info.value), repr(info.value), str(info.value.__cause__), repr(wrong)]
        wrong.close()
        down = RedisClient(f"redis://locker:{password}@127.0.0.1:1/0")
        with pytest.raises(LockNotAcquired) as info:
            SyncDistributedLock(down, table="secure", key="k", wait_timeout=0.2).__enter__()
        seen += [str(info.value), str(info.value.__cause__), repr(down)]
        down.close()
    finally:
        redis_db.execute_command("ACL", "DELUSER", "locker")
    everything = "\n".join(seen) + debug_logs.text
    assert password not in everything and SECRET not in everything
