"""fastlease.testing's pytest fixtures, loaded the way users load them (``pytest_plugins`` in a conftest of
their own project), in a separate pytest process so this session's conftest cannot help them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

USER_CONFTEST = 'pytest_plugins = ["fastlease.testing"]\n'

USER_TESTS = textwrap.dedent(
    '''
    import pytest

    from fastlease import SyncDistributedLock
    from fastlease.exceptions import LockNotAcquired
    from fastlease.testing import FakeClock


    def test_memory_client_runs_on_the_fake_clock(fastlease_clock, fastlease_memory_client):
        assert isinstance(fastlease_clock, FakeClock)
        holder = SyncDistributedLock(fastlease_memory_client, table="locks", key="k", lease_duration=10,
                                     wait_timeout=0)
        holder.__enter__()
        fastlease_clock.advance(60)   # six leases pass instantly; the renewals ran on the way
        assert holder.state == "held"
        with pytest.raises(LockNotAcquired):
            with SyncDistributedLock(fastlease_memory_client, table="locks", key="k", wait_timeout=0):
                pass
        holder.__exit__(None, None, None)


    def test_sqlite_client_is_a_file_in_tmp_path(fastlease_sqlite_client, tmp_path):
        with SyncDistributedLock(fastlease_sqlite_client, table="locks", key="k") as lease:
            assert lease.state == "held"
        assert (tmp_path / "fastlease.sqlite3").exists()


    @pytest.fixture
    def fastlease_dynamodb_table():
        return "jobs-locks"


    def test_dynamodb_client_has_the_overridden_table(fastlease_dynamodb_client):
        import boto3

        assert fastlease_dynamodb_client.lock_table_exists("jobs-locks")
        with SyncDistributedLock(fastlease_dynamodb_client, table="jobs-locks", key="k"):
            # Any boto3 client made during the test reaches the same in-process mock.
            items = boto3.client("dynamodb", region_name="us-east-1").scan(TableName="jobs-locks")["Items"]
            assert [item["key"]["S"] for item in items] == ["k"]


    def test_redis_url_is_a_live_loopback_server(fastlease_redis_url):
        from fastlease import RedisClient

        assert fastlease_redis_url.startswith("redis://127.0.0.1:")
        client = RedisClient(fastlease_redis_url)
        try:
            with SyncDistributedLock(client, table="locks", key="k") as lease:
                assert lease.fencing_token == 1
        finally:
            client.close()
    '''
)


def run_user_suite(project: Path, **env: str) -> subprocess.CompletedProcess[str]:
    project.mkdir()
    (project / "conftest.py").write_text(USER_CONFTEST)
    (project / "test_user.py").write_text(USER_TESTS)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(project)],
        cwd=project, env={**os.environ, **env}, capture_output=True, text=True, timeout=180,
    )


def test_every_fixture_works_in_a_users_project(tmp_path: Path, redis_url: str) -> None:
    # redis_url: this session's server exists, so the user's session can start one too.
    result = run_user_suite(tmp_path / "project")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 passed" in result.stdout, result.stdout


def test_missing_redis_server_skips_locally_and_fails_under_ci(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-redis-server")
    local = run_user_suite(tmp_path / "local", REDIS_SERVER=missing, CI="")
    assert local.returncode == 0, local.stdout + local.stderr
    assert "3 passed, 1 skipped" in local.stdout, local.stdout
    ci = run_user_suite(tmp_path / "ci", REDIS_SERVER=missing, CI="true")
    assert ci.returncode != 0
    assert "CI=true: the Redis tests must run" in ci.stdout, ci.stdout
