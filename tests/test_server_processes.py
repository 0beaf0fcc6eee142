"""The test servers (moto, redis-server, PostgreSQL) live exactly as long as the process that started them:
they outlive the thread that started them, and they stop when that process is SIGKILLed without stopping
them (no cleanup of its own runs then). And the throwaway PostgreSQL server: loopback only, stopped by
its postmaster's PID, its directory removed, and its fixture failing under CI=true where it cannot start."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Iterator

import pytest

from fastlease.testing.postgres_server import PostgresServer, PostgresServerUnavailable, postgres_bin_dir

pytestmark = [
    pytest.mark.server,  # starts a moto server, a redis-server or PostgreSQL
    pytest.mark.posix,
    pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="waits on processes that are not its children "
                       "with pidfds (Linux 5.3+)"),
]

BOUND_S = 30.0  # every wait here: a server start, a thread's end, the servers' exit after the parent's

# The parent starts a server from a worker thread and joins it, waits until the OS thread is gone too
# (PR_SET_PDEATHSIG fires then, which is why it must not be used), prints the server's PID and URL, and
# then waits on stdin, which the test never closes: it ends only by the test's SIGKILL.
PARENT = textwrap.dedent(
    """
    import os, sys, threading, time
    from fastlease.testing.{module} import {cls}

    server = {cls}()
    urls = []
    starter = threading.Thread(target=lambda: urls.append(server.start(timeout_s={bound})))
    starter.start()
    starter.join({bound})
    deadline = time.monotonic() + {bound}
    while os.path.exists(f"/proc/self/task/{{starter.native_id}}") and time.monotonic() < deadline:
        threading.Event().wait(0.01)  # the OS thread ends just after join() returns; nothing signals it
    print(server.pid, urls[0] if urls else "none", getattr(server, "directory", "-") if urls else "-", flush=True)
    sys.stdin.read()
    """
)


def redis_answers(url: str) -> bool:
    import redis

    client = redis.Redis.from_url(url, socket_timeout=BOUND_S)
    try:
        return bool(client.ping())
    finally:
        client.close()


def moto_answers(url: str) -> bool:
    import boto3

    client = boto3.client("dynamodb", endpoint_url=url, region_name="us-east-1", aws_access_key_id="testing",
                          aws_secret_access_key="testing")
    return client.list_tables()["TableNames"] == []


def postgres_answers(dsn: str) -> bool:
    import psycopg

    with psycopg.connect(dsn, connect_timeout=int(BOUND_S)) as connection:
        row = connection.execute("SELECT 1").fetchone()
    return row == (1,)


SERVERS = {
    "redis": ("redis_server", "RedisServer", redis_answers),
    "moto": ("moto_server", "MotoServer", moto_answers),
    "postgres": ("postgres_server", "PostgresServer", postgres_answers),
}


def children_of(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as listing:
        return [int(child) for child in listing.read().split()]


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rpartition(")")[2].split()[1])  # the field after the state


def server_processes(server: str, pid: int) -> list[int]:
    """Every process of a started server: its guard first. ``pid`` is what the server's ``pid`` reports:
    the guard's of moto and redis-server (one child, the server), the postmaster's of PostgreSQL (whose
    parent is the guard, and whose children are its background workers)."""
    if server != "postgres":
        pids = [pid, *children_of(pid)]
        assert len(pids) == 2, f"the guard {pid} should have one child, the server: {pids}"
        return pids
    workers = children_of(pid)
    assert workers, f"the postmaster {pid} has no background processes"
    return [parent_of(pid), pid, *workers]


def exited(pidfd: int) -> bool:
    return bool(select.select([pidfd], [], [], 0)[0])


@pytest.fixture
def pidfds() -> Iterator[list[int]]:
    """pidfds of the processes a test watches; whatever is still alive at the end is SIGKILLed through
    its pidfd (which, unlike a PID, can never name a different process)."""
    opened: list[int] = []
    try:
        yield opened
    finally:
        for pidfd in opened:
            try:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.close(pidfd)


@pytest.mark.parametrize("server", sorted(SERVERS))
def test_a_server_outlives_its_thread_and_stops_with_its_process(server: str, pidfds: list[int]) -> None:
    module, cls, answers = SERVERS[server]
    code = PARENT.format(module=module, cls=cls, bound=BOUND_S)
    parent = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        assert select.select([parent.stdout], [], [], 2 * BOUND_S)[0], "the parent printed nothing"
        server_pid, url, directory = parent.stdout.readline().split()
        assert url != "none", parent.stderr.read() if parent.stderr else ""
        pids = server_processes(server, int(server_pid))
        pidfds.extend(os.pidfd_open(pid) for pid in pids)

        assert answers(url), "the server did not answer after the thread that started it ended"

        os.kill(parent.pid, signal.SIGKILL)  # no stop(), no atexit, no finally runs in the parent
        parent.wait(BOUND_S)
        waiting = list(pidfds)
        for _ in range(len(pidfds) + 1):  # bounded: each round sees at least one more exit, or times out
            waiting = [pidfd for pidfd in waiting if not exited(pidfd)]
            if not waiting or not select.select(waiting, [], [], BOUND_S)[0]:
                break
        running = [pid for pid, pidfd in zip(pids, pidfds) if not exited(pidfd)]
        assert not running, f"still running {BOUND_S:g} s after their parent was SIGKILLed: {running}"
        if directory != "-":  # the guard removes a PostgreSQL cluster before it exits
            assert not os.path.exists(directory), f"{directory} outlived the server"
    finally:
        if parent.poll() is None:
            parent.kill()
        parent.wait(BOUND_S)
        for stream in (parent.stdin, parent.stdout, parent.stderr):
            if stream is not None:
                stream.close()


# --- the throwaway PostgreSQL server ---------------------------------------------------------------------

def listening_addresses(pid: int) -> set[tuple[str, int]]:
    """The (address, port) of every TCP socket that process ``pid`` listens on, IPv4 and IPv6."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        target = os.readlink(f"/proc/{pid}/fd/{fd}")
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    found = set()
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        with open(table) as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if inode not in inodes or state != "0A":  # 0A: LISTEN
                    continue
                address, port = local.split(":")
                # The kernel prints each 32-bit word of the address in host (little-endian) order.
                raw = b"".join(bytes.fromhex(address[i:i + 8])[::-1] for i in range(0, len(address), 8))
                found.add((socket.inet_ntop(family, raw), int(port, 16)))
    return found


def process_uid(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("Uid:"))
    return int(line.split()[1])


@pytest.fixture
def postgres_server() -> Iterator[PostgresServer]:
    server = PostgresServer()
    try:
        yield server
    finally:
        server.stop()


def test_postgres_server_answers_on_loopback_only(postgres_server: PostgresServer) -> None:
    import psycopg

    dsn = postgres_server.start(timeout_s=BOUND_S)
    port = postgres_server.port
    assert dsn == f"postgresql://postgres@127.0.0.1:{port}/postgres"
    assert postgres_answers(dsn)
    assert listening_addresses(postgres_server.pid) == {("127.0.0.1", port)}
    # Its one unix socket is in its own temporary directory, not the system's /var/run/postgresql.
    with psycopg.connect(dsn) as connection:
        row = connection.execute("SELECT current_setting('unix_socket_directories')").fetchone()
    assert row == (postgres_server.directory,)
    assert os.path.exists(os.path.join(postgres_server.directory, f".s.PGSQL.{port}"))
    if os.geteuid() == 0:
        assert process_uid(postgres_server.pid) != 0, "the postmaster runs as root"


def test_postgres_stop_ends_the_postmaster_and_removes_its_directory(
    postgres_server: PostgresServer, pidfds: list[int]
) -> None:
    import psycopg

    dsn = postgres_server.start(timeout_s=BOUND_S)
    postmaster = postgres_server.pid
    workers = children_of(postmaster)
    pidfds.extend(os.pidfd_open(pid) for pid in [postmaster, *workers])
    client = psycopg.connect(dsn)  # an open session: a smart shutdown (SIGTERM) would wait for it
    try:
        postgres_server.stop()
        # Reaped by its guard before stop() returns; it ends only once its workers have.
        assert exited(pidfds[0]), f"the postmaster {postmaster} is still running after stop()"
        assert all(exited(pidfd) for pidfd in pidfds[1:]), f"workers of {postmaster} outlived it: {workers}"
        with pytest.raises(psycopg.OperationalError) as raised:
            client.execute("SELECT 1")
        # Told so by a fast shutdown; a SIGKILLed server would just have gone.
        assert "terminating connection due to administrator command" in str(raised.value)
    finally:
        client.close()
    assert not os.path.exists(postgres_server.directory)
    assert postgres_server.port is None


def test_two_postgres_servers_get_different_ports() -> None:
    import psycopg

    with PostgresServer() as first, PostgresServer() as second:
        assert first.port != second.port
        assert first.directory != second.directory
        for server in (first, second):
            with psycopg.connect(server.dsn) as connection:
                assert connection.execute("SHOW port").fetchone() == (str(server.port),)


def test_a_postgres_server_that_cannot_start_reports_its_own_output(postgres_server: PostgresServer) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(PostgresServerUnavailable) as raised:
            postgres_server.start(timeout_s=BOUND_S, port=taken.getsockname()[1])
    message = str(raised.value)
    assert "could not bind IPv4 address" in message and "Address already in use" in message, message
    assert not os.path.exists(postgres_server.directory)


def test_postgres_bin_dir_prefers_pg_bindir_then_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PG_BINDIR", str(empty))
    assert postgres_bin_dir() is None  # a PG_BINDIR without the executables is not silently replaced
    linked = tmp_path / "linked"
    linked.mkdir()
    for name in ("initdb", "postgres"):
        (linked / name).write_text("#!/bin/sh\n")
        (linked / name).chmod(0o755)
    monkeypatch.setenv("PG_BINDIR", str(linked))
    assert postgres_bin_dir() == str(linked)
    monkeypatch.delenv("PG_BINDIR")
    monkeypatch.setenv("PATH", str(linked))
    assert postgres_bin_dir() == str(linked)


POSTGRES_USER_TEST = textwrap.dedent(
    """
    def test_uses_postgres(fastlease_postgres_dsn):
        assert fastlease_postgres_dsn.startswith("postgresql://")
    """
)


def test_postgres_fixture_skips_locally_and_fails_under_ci_without_postgresql(tmp_path: Path) -> None:
    empty = tmp_path / "no-postgresql"
    empty.mkdir()
    (tmp_path / "test_user.py").write_text(POSTGRES_USER_TEST)

    def run(ci: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "fastlease.testing",
             str(tmp_path / "test_user.py")],
            cwd=tmp_path, env={**os.environ, "PG_BINDIR": str(empty), "CI": ci}, capture_output=True, text=True,
            timeout=2 * BOUND_S,
        )

    local = run("")
    assert local.returncode == 0, local.stdout + local.stderr
    assert "1 skipped" in local.stdout and "PostgreSQL is not installed" in local.stdout, local.stdout
    ci = run("true")
    assert ci.returncode != 0, ci.stdout
    assert "CI=true: the PostgreSQL tests must run, but PostgreSQL is not installed" in ci.stdout, ci.stdout


@pytest.mark.parametrize("run", ["first", "second"])
def test_postgres_db_is_empty_for_each_test(postgres_db: str, run: str) -> None:
    # Both runs leave a table behind: whichever runs second fails unless the fixture emptied the database.
    import psycopg

    with psycopg.connect(postgres_db) as connection:
        tables = connection.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchall()
        assert tables == [], f"left by an earlier test: {tables}"
        owner = connection.execute(
            "SELECT nspowner::regrole::text = current_user FROM pg_namespace WHERE nspname = 'public'"
        ).fetchone()
        assert owner == (True,)
        connection.execute(f"CREATE TABLE leftover_{run} (n int)")


# ---- the servers from a shell ----------------------------------------------------------------------------
def _ready_line(process: subprocess.Popen[str]) -> str:
    """The server command's first stdout line, waited for at most BOUND_S."""
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], BOUND_S)
    assert ready, "no READY line within the bound"
    return process.stdout.readline().strip()


def _check_serves(module: str, address: str) -> None:
    from fastlease import SyncDistributedLock

    if module == "postgres_server":
        import psycopg

        from fastlease import PostgresClient

        with psycopg.connect(address, autocommit=True) as connection:
            assert connection.execute("SELECT 1").fetchone() == (1,)
        client: object = PostgresClient(address)
        client.create_lock_table("shell")  # type: ignore[attr-defined]
    else:
        from fastlease.redis import RedisClient

        client = RedisClient(address)
    try:
        with SyncDistributedLock(client, table="shell", key="k") as lease:  # type: ignore[arg-type]
            assert lease.fencing_token == 1
    finally:
        client.close()  # type: ignore[attr-defined]


@pytest.mark.parametrize("module, prefix", [("redis_server", "redis://127.0.0.1:"),
                                            ("redis_cluster", "redis+cluster://127.0.0.1:"),
                                            ("postgres_server", "postgresql://postgres@127.0.0.1:")])
def test_a_server_module_run_from_a_shell_says_ready_serves_and_stops_on_sigterm(module: str, prefix: str) -> None:
    process = subprocess.Popen([sys.executable, "-m", f"fastlease.testing.{module}"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        line = _ready_line(process)
        assert line.startswith(f"READY {prefix}"), (line, process.poll())
        address = line[len("READY "):]
        _check_serves(module, address)
        ports = [int(node.rsplit(":", 1)[1].split("/")[0]) for node in address.split("://", 1)[1].split("@")[-1]
                 .split(",")]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=BOUND_S) == 0, process.stderr.read() if process.stderr else ""
        for port in ports:  # every server it started is gone with it
            with socket.socket() as probe:
                assert probe.connect_ex(("127.0.0.1", port)) != 0, f"port {port} still answers after the stop"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=BOUND_S)
