"""The ``fastlease`` command, run as a separate process (``python -m fastlease``), output and exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from fastlease import SQLiteClient, SyncDistributedLock
from fastlease.exceptions import LockLost

TIMEOUT_S = 120  # bound for one command (the demo included)


def fastlease(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fastlease", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=TIMEOUT_S, env={**os.environ, **(env or {})})


def one_line_error(result: subprocess.CompletedProcess, text: str) -> None:
    """A user error: exit 1, nothing on stdout, one line on stderr naming the problem, no traceback."""
    assert result.returncode == 1, result
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert text in result.stderr, result.stderr


@pytest.fixture
def held(tmp_path: Path):
    """A lease held (by this test process) on import:daily in table locks of tmp_path/locks.db."""
    client = SQLiteClient(tmp_path / "locks.db")
    guard = SyncDistributedLock(client, table="locks", key="import:daily")
    lease = guard.__enter__()
    yield lease
    try:
        guard.__exit__(None, None, None)
    except LockLost:
        pass  # a test removed the row with --force
    client.close()


def test_status_and_list_show_the_holder(tmp_path, held):
    status = fastlease("status", "import:daily", "--table", "locks", "--path", "locks.db", cwd=tmp_path)
    assert status.returncode == 0 and status.stderr == ""
    assert status.stdout.startswith(f"import:daily: held by {held.owner}, lease 30 s, protocol 1, fencing token 1")
    data = json.loads(fastlease("status", "import:daily", "--table", "locks", "--path", "locks.db", "--json",
                                cwd=tmp_path).stdout)
    assert (data["held"], data["owner"], data["lease_ms"], data["protocol"], data["fence"]) == (
        True, held.owner, 30_000, 1, 1)
    assert data["seen_unchanged_s"] >= 0
    free = fastlease("status", "other", "--table", "locks", "--path", "locks.db", "--json", cwd=tmp_path)
    assert json.loads(free.stdout) == {"key": "other", "held": False}
    listed = json.loads(fastlease("list", "--table", "locks", "--path", "locks.db", "--json", cwd=tmp_path).stdout)
    assert [(row["key"], row["owner"]) for row in listed] == [("import:daily", held.owner)]
    assert fastlease("list", "--table", "empty", "--path", "locks.db", cwd=tmp_path).stdout == (
        "no held keys in 'empty'\n")


def test_release_needs_force_and_removes_only_the_row_printed(tmp_path, held):
    refused = fastlease("release", "import:daily", "--table", "locks", "--path", "locks.db", cwd=tmp_path)
    one_line_error(refused, f"would remove import:daily: held by {held.owner}")
    assert "--force" in refused.stderr
    assert held.is_valid()
    assert SQLiteClient(tmp_path / "locks.db").inspect("locks", "import:daily")[0]["owner"] == held.owner
    forced = fastlease("release", "import:daily", "--table", "locks", "--path", "locks.db", "--force", "--json",
                       cwd=tmp_path)
    assert forced.returncode == 0
    assert json.loads(forced.stdout)["removed"] is True
    assert SQLiteClient(tmp_path / "locks.db").inspect("locks") == []
    again = fastlease("release", "import:daily", "--table", "locks", "--path", "locks.db", "--force", cwd=tmp_path)
    assert again.returncode == 0 and "not held, nothing to remove" in again.stdout


def test_bad_input_is_one_line_and_a_non_zero_exit(tmp_path):
    one_line_error(fastlease("status", "k", "--table", "locks", "--path", "missing.db", cwd=tmp_path),
                   "no SQLite lock file at 'missing.db'")
    (tmp_path / "corrupt.db").write_bytes(b"not a database, only text " * 300)
    one_line_error(fastlease("list", "--table", "locks", "--path", "corrupt.db", cwd=tmp_path), "is unusable")
    SQLiteClient(tmp_path / "locks.db").close()
    one_line_error(fastlease("list", "--table", "bad name", "--path", "locks.db", cwd=tmp_path),
                   "table must be 3-255 characters")
    one_line_error(fastlease("list", "--table", "locks", "--store", "nope", cwd=tmp_path), "unknown store 'nope'")
    one_line_error(fastlease("demo", "--store", "nope", cwd=tmp_path), "unknown store 'nope'")
    one_line_error(fastlease("status", "k", "--table", "locks", "--store", "redis", "--url",
                             "redis://:pw-secret@127.0.0.1:1/0", cwd=tmp_path), "127.0.0.1:1/0")
    one_line_error(fastlease("list", "--table", "locks", "--store", "redis", "--url", "http://x", cwd=tmp_path),
                   "bad Redis URL")
    one_line_error(fastlease("demo", "--path", str(tmp_path / "no-dir" / "x.db"), cwd=tmp_path), "does not exist")
    one_line_error(fastlease("demo", "--workers", "1", cwd=tmp_path), "--workers must be an integer from 2 to 64")
    usage = fastlease("status", cwd=tmp_path)  # a bad command line: argparse's usage message, exit 2
    assert usage.returncode == 2 and "Traceback" not in usage.stderr


@pytest.mark.posix  # the demo SIGKILLs a worker
def test_demo_on_sqlite_shows_a_takeover_of_the_killed_holder(tmp_path):
    result = fastlease("demo", "--workers", "3", "--seconds", "4", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["store"] == "sqlite" and summary["errors"] == []
    assert all(row["acquisitions"] > 0 for row in summary["workers"])
    killed = summary["killed"]
    assert summary["workers"][killed["worker"]]["status"] == "killed"
    assert killed["taken_by"] != killed["worker"]
    # Another worker waited out the dead holder's lease (1 s), counted from its last sighting of a
    # renewal, which can precede the kill by up to a renewal interval (1/3 s).
    assert 0.6 <= killed["takeover_s"] < 5.0, killed
    assert list(tmp_path.iterdir()) == []  # the temporary lock file is gone


def test_demo_on_redis_shows_the_killed_holders_key_recovered(tmp_path, redis_url, redis_db):
    result = fastlease("demo", "--store", "redis", "--url", redis_url, "--workers", "3", "--seconds", "4", "--json",
                       cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["store"] == "redis" and summary["errors"] == []
    assert all(row["acquisitions"] > 0 for row in summary["workers"])
    killed = summary["killed"]
    assert summary["workers"][killed["worker"]]["status"] == "killed" and killed["taken_by"] != killed["worker"]
    # The dead holder's key expires at most one lease (1 s) after its last renewal, itself at most a
    # renewal interval (1/3 s) before the kill; the next poll then finds it gone.
    assert 0.6 <= killed["takeover_s"] < 3.0, killed
    assert redis_db.keys(b"fastlease:demo_locks:lease:*") == []


def test_status_list_and_release_on_redis(tmp_path, redis_url, redis_db):
    from fastlease.redis import RedisClient

    client = RedisClient(redis_url)
    guard = SyncDistributedLock(client, table="locks", key="import:daily")
    lease = guard.__enter__()
    try:
        url = ["--store", "redis", "--url", redis_url]
        status = fastlease("status", "import:daily", "--table", "locks", *url, cwd=tmp_path)
        assert status.stdout.startswith(f"import:daily: held by {lease.owner}, lease 30 s, protocol 1, fencing token 1")
        listed = json.loads(fastlease("list", "--table", "locks", "--json", *url, cwd=tmp_path).stdout)
        assert [(row["key"], row["owner"]) for row in listed] == [("import:daily", lease.owner)]
        forced = fastlease("release", "import:daily", "--table", "locks", "--force", *url, cwd=tmp_path)
        assert forced.returncode == 0 and "removed import:daily" in forced.stdout
        assert client.inspect("locks") == []
        with pytest.raises(LockLost):
            guard.__exit__(None, None, None)
    finally:
        client.close()


@pytest.mark.posix  # the demo SIGKILLs a worker
def test_text_demo_prints_progress_and_the_table(tmp_path):
    result = fastlease("demo", "--store", "memory", "--workers", "2", "--seconds", "3", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "acquisitions ·" in result.stdout  # progress lines
    assert "worker  acquisitions  contended" in result.stdout
    assert "takeover: worker" in result.stdout


def test_create_table_status_and_list_on_dynamodb(tmp_path, moto_endpoint, moto_session):
    from fastlease.dynamodb import DynamoDBClient

    table = f"cli-{uuid.uuid4().hex[:8]}"
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    endpoint = ["--endpoint-url", moto_endpoint, "--region", "us-east-1"]
    created = fastlease("create-table", table, *endpoint, "--json", cwd=tmp_path, env=env)
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout) == {"created": table}
    one_line_error(fastlease("create-table", table, *endpoint, cwd=tmp_path, env=env), "already exists")
    client = DynamoDBClient(session=moto_session, endpoint_url=moto_endpoint)
    try:
        with SyncDistributedLock(client, table=table, key="job") as lease:
            status = fastlease("status", "job", "--table", table, "--store", "dynamodb", *endpoint, "--json",
                               cwd=tmp_path, env=env)
            assert status.returncode == 0, status.stderr
            row = json.loads(status.stdout)
            assert (row["owner"], row["lease_ms"], row["protocol"], row["fence"]) == (lease.owner, 30_000, 1, None)
            listed = fastlease("list", "--table", table, "--store", "dynamodb", *endpoint, cwd=tmp_path, env=env)
            assert listed.stdout.startswith(f"job: held by {lease.owner}, lease 30 s, protocol 1")
    finally:
        client.close()


def test_a_read_only_lock_file_is_one_line_error(tmp_path, read_only_file):
    one_line_error(fastlease("list", "--table", "locks", "--path", str(read_only_file), cwd=tmp_path), "ro.db")
