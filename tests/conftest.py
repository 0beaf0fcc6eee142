"""Shared fixtures: every engine test runs once per implementation (``c`` and ``py``) in one run."""

from __future__ import annotations

import importlib.util
import select
import signal
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterator

import pytest

from fastlease import MemoryClient, _impl
from fastlease.stores.memory import MemoryStore
from fastlease.testing import FakeClock, FaultInjector
from fastlease.testing.fixtures import start_or_skip
from fastlease.testing.redis_cluster import RedisClusterServer, RedisClusterUnavailable
from helpers.processes import Children

#: Fixtures that start or reach a service process (a moto server, a redis-server, a Redis Cluster, PostgreSQL):
#: tests that use them are marked ``server``, so a wheel can be tested where no server runs (``-m "not server"``).
SERVER_FIXTURES = frozenset({"moto_endpoint", "moto_session", "redis_url", "redis_db", "fastlease_redis_url",
                             "redis_cluster_url", "redis_cluster_server", "redis_cluster_db", "make_redis_cluster",
                             "fastlease_redis_cluster", "fastlease_redis_cluster_url",
                             "postgres_dsn", "postgres_db", "fastlease_postgres_dsn",
                             # Django's test project is set up once with both its databases, PostgreSQL's included.
                             "django_setup"})
#: How long emptying a test's database may wait for a lock held by a connection an earlier test left open.
EMPTY_DATABASE_LOCK_TIMEOUT = "10s"
#: Test modules that import psycopg at the top. The wheel's server-free suite (the ``test-wheel``
#: dependency group, which every platform can install) has no psycopg, and these modules' tests all need
#: the PostgreSQL server anyway, so there they are not collected. ``make test`` installs psycopg (the
#: ``test`` group), so it always collects them.
PSYCOPG_MODULES = ["stores/test_postgres.py", "stores/test_postgres_feed.py", "stores/test_postgres_line.py",
                   "stores/test_postgres_processes.py", "test_bench_postgres.py"]
#: Test modules of the benchmarks, which import the scripts in ``bench/``. The wheel's suite is a copy of
#: ``tests/`` without ``bench/`` (and their tests all need a server), so there they are not collected.
#: Every ``test_bench_*.py``, found rather than listed: a new one left off a list broke the wheel's suite once.
BENCH_MODULES = sorted(path.name for path in Path(__file__).resolve().parent.glob("test_bench_*.py"))
#: Test modules of the Celery and Django integrations, which import those frameworks at the top: not collected
#: where they are not installed (both test groups install them; a bare ``pip install pytest`` run does not).
CELERY_MODULES = ["test_celery.py", "celery_app"]
DJANGO_MODULES = ["test_django.py", "test_django_server.py", "django_project"]
collect_ignore = PSYCOPG_MODULES if importlib.util.find_spec("psycopg") is None else []
if importlib.util.find_spec("celery") is None:
    collect_ignore += CELERY_MODULES
if importlib.util.find_spec("django") is None or importlib.util.find_spec("rest_framework") is None:
    collect_ignore += DJANGO_MODULES
if not (Path(__file__).resolve().parent.parent / "bench").is_dir():
    collect_ignore = sorted(set(collect_ignore) | set(BENCH_MODULES))

#: Fixtures that fork or send POSIX signals: tests that use them are marked ``posix``.
POSIX_FIXTURES = frozenset({"in_forked_child", "children", "read_only_file"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if importlib.util.find_spec("psycopg") is None:
        # The wheel's server-free suite: tests of the PostgreSQL store (the command line's among them)
        # cannot run without psycopg, as server tests cannot run without their server.
        deselected = [item for item in items if "postgres" in item.nodeid.lower()]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = [item for item in items if "postgres" not in item.nodeid.lower()]
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & SERVER_FIXTURES:
            item.add_marker(pytest.mark.server)
        if used & POSIX_FIXTURES:
            item.add_marker(pytest.mark.posix)
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("core") == "py":
            item.add_marker(pytest.mark.interpreted)


@pytest.fixture(scope="session", params=["c", "py"])
def core(request: pytest.FixtureRequest) -> ModuleType:
    """The engine module under test. A missing compiled core fails the ``c`` run; it never skips."""
    try:
        return _impl.load(request.param)
    except ImportError as error:  # pragma: no cover - the point is to fail loudly
        pytest.fail(f"compiled core not importable ({error}); run `make test` to build it")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
def make_client(core: ModuleType, store: MemoryStore) -> Iterator[Callable[..., MemoryClient]]:
    """Build MemoryClients on the test's shared store (like processes sharing a table); closed after."""
    clients: list[MemoryClient] = []

    def build(**kwargs: object) -> MemoryClient:
        kwargs.setdefault("store", store)
        client = MemoryClient(_engine_module=core, **kwargs)  # type: ignore[arg-type]
        clients.append(client)
        return client

    yield build
    for client in clients:
        client.close()


@pytest.fixture
def faults(store: MemoryStore, clock: FakeClock) -> FaultInjector:
    injector = FaultInjector(clock)
    store.faults = injector
    yield injector
    injector.unblock()
    store.faults = None


@pytest.fixture
def real_faults(store: MemoryStore) -> Iterator[FaultInjector]:
    """Faults on the test's store for clients on the system clock (renewal threads really run). List
    it after ``make_client``: it is torn down first, so a blocked request is let go before clients close."""
    injector = FaultInjector()
    store.faults = injector
    yield injector
    injector.unblock()
    store.faults = None


@pytest.fixture
def in_forked_child() -> Callable[[Callable[[], str]], str]:
    """Run ``fn`` in a forked child and return the str it reports; the child exits at once after."""
    import os

    def run(fn: Callable[[], str]) -> str:
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: no test machinery runs here
            try:
                report = fn()
            except BaseException as error:  # noqa: BLE001 - reported to the parent
                report = f"child raised {error!r}"
            os.write(write_end, report.encode())
            os._exit(0)
        os.close(write_end)
        try:
            chunks = []
            for _ in range(10_000):  # bounded: the child writes one short report, then exits
                if not select.select([read_end], [], [], 30)[0]:
                    os.kill(pid, signal.SIGKILL)  # hung: stop it by its PID; the assert below fails
                    break
                chunk = os.read(read_end, 65536)
                if not chunk:
                    break
                chunks.append(chunk)
        finally:
            os.close(read_end)
            _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        return b"".join(chunks).decode()

    return run


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """One serialised moto server (a separate process on 127.0.0.1) for the whole test session."""
    from fastlease.testing.moto_server import MotoServer

    server = MotoServer()
    try:
        yield server.start(timeout_s=60)
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_url(fastlease_redis_url: str) -> str:
    """One real redis-server for the whole session: fastlease.testing's fixture (loaded by ``-p`` in
    pyproject's addopts, before this file imports the module), which skips only where the
    server cannot start, and never in CI (CI=true): there it fails."""
    return fastlease_redis_url


@pytest.fixture
def redis_db(redis_url: str) -> Iterator[object]:
    """A redis.Redis on the session's server, its database emptied before the test."""
    import redis

    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def redis_cluster_server(fastlease_redis_cluster: RedisClusterServer) -> RedisClusterServer:
    """The session's three-node Redis Cluster (fastlease.testing's fixture, as for ``redis_url``), for tests
    that look at its nodes. Tests that migrate slots or kill, pause or flush nodes behind other tests'
    backs use ``make_redis_cluster`` instead."""
    return fastlease_redis_cluster


@pytest.fixture(scope="session")
def redis_cluster_url(fastlease_redis_cluster_url: str) -> str:
    """``redis+cluster://...`` of the session's cluster: it skips only where the cluster cannot start,
    and never in CI (CI=true): there it fails."""
    return fastlease_redis_cluster_url


@pytest.fixture
def redis_cluster_db(redis_cluster_server: RedisClusterServer) -> Iterator[object]:
    """A redis.cluster.RedisCluster on the session's cluster, every primary emptied (FLUSHALL) before the test."""
    from redis.cluster import RedisCluster

    redis_cluster_server.flushall()
    host, port = redis_cluster_server.nodes[0]
    client = RedisCluster(host=host, port=port)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def make_redis_cluster() -> Iterator[Callable[..., RedisClusterServer]]:
    """Start a Redis Cluster of the test's own (``make_redis_cluster(nodes=3)``, the arguments of
    ``RedisClusterServer.start``), for tests that migrate slots or kill or pause nodes; every one is stopped
    by its nodes' PIDs after the test. Skips where a cluster cannot start, except under CI=true: there it fails."""
    started: list[RedisClusterServer] = []

    def start(**options: object) -> RedisClusterServer:
        server = RedisClusterServer()
        started.append(server)
        start_or_skip(server, RedisClusterUnavailable, "Redis Cluster", **options)
        return server

    try:
        yield start
    finally:
        for server in started:
            server.stop()


@pytest.fixture(scope="session")
def postgres_dsn(fastlease_postgres_dsn: str) -> str:
    """One throwaway PostgreSQL cluster for the whole session (fastlease.testing's fixture, as for
    ``redis_url``): it skips only where the server cannot start, and never in CI (CI=true): there it fails."""
    return fastlease_postgres_dsn


@pytest.fixture
def postgres_db(postgres_dsn: str) -> str:
    """The DSN of an empty database for this test: the session server's ``public`` schema dropped (with
    everything in it) and made again, owned by the connecting role. Faster than a new database, which
    copies a template. A lock still held by an earlier test's connection fails it within
    :data:`EMPTY_DATABASE_LOCK_TIMEOUT` rather than hanging."""
    import psycopg

    with psycopg.connect(postgres_dsn, autocommit=True) as connection:
        connection.execute(f"SET lock_timeout = '{EMPTY_DATABASE_LOCK_TIMEOUT}'")
        connection.execute("DROP SCHEMA IF EXISTS public CASCADE")
        connection.execute("CREATE SCHEMA public AUTHORIZATION CURRENT_USER")
    return postgres_dsn


@pytest.fixture(scope="session")
def in_process_aws_session():  # type: ignore[no-untyped-def]
    """A boto3 session with fake credentials for tests inside moto's in-process ``mock_aws``. Each test
    enters a mock of its own (moto's state starts empty) and makes its own clients; only the session is
    shared, because a new one parses botocore's JSON models again: about 0.2 s for each test."""
    import boto3
    from moto import mock_aws  # noqa: F401 - imported first: a session made before moto is not mocked

    return boto3.session.Session(
        aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
    )


@pytest.fixture(scope="session")
def moto_session(moto_endpoint: str):  # type: ignore[no-untyped-def]
    """A boto3 session whose clients reach the moto server with fake credentials."""
    import boto3

    return boto3.session.Session(
        aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
    )


@pytest.fixture
def children() -> Iterator[Children]:
    """Spawned worker processes of one test, each SIGKILLed by its PID and joined when it ends."""
    spawned = Children()
    try:
        yield spawned
    finally:
        spawned.stop_all()
    alive = [child.proc.pid for child in spawned.started if child.proc.is_alive()]
    assert not alive, f"children still alive after SIGKILL and join: {alive}"


@pytest.fixture
def read_only_file(tmp_path: Path) -> Iterator[Path]:
    """A lock file nobody may write: mode 0444, and for root (who ignores modes) the immutable flag."""
    import os
    import subprocess

    from fastlease import SQLiteClient

    path = tmp_path / "ro.db"
    SQLiteClient(path).close()
    for extra in tmp_path.glob("ro.db-*"):
        extra.unlink()
    path.chmod(0o444)
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i", str(path)], check=True, timeout=10)
    try:
        yield path
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(path)], check=True, timeout=10)


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.server),
                        pytest.param("redis_cluster", marks=pytest.mark.server),
                        pytest.param("postgres", marks=pytest.mark.server),
                        pytest.param("dynamodb", marks=pytest.mark.server)])
def make_store_client(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Any]]:
    """Clients of one store, per parameter (every store but memory), on one table ``locks`` (created)."""
    clients: list[Any] = []

    def build() -> Any:
        if request.param == "sqlite":
            from fastlease import SQLiteClient

            client = SQLiteClient(tmp_path / "locks.db")
        elif request.param == "redis":
            from fastlease import RedisClient

            request.getfixturevalue("redis_db")
            client = RedisClient(request.getfixturevalue("redis_url"))
        elif request.param == "redis_cluster":
            from fastlease import RedisClient

            request.getfixturevalue("redis_cluster_db")
            client = RedisClient(request.getfixturevalue("redis_cluster_url"))
        elif request.param == "postgres":
            from fastlease import PostgresClient

            client = PostgresClient(request.getfixturevalue("postgres_db"))
            client.create_lock_table("locks")
        else:
            from fastlease.dynamodb import DynamoDBClient

            client = DynamoDBClient(session=request.getfixturevalue("moto_session"), fencing=True,
                                    endpoint_url=request.getfixturevalue("moto_endpoint"))
            if not clients and not client.lock_table_exists("locks"):
                client.create_lock_table("locks")
        clients.append(client)
        return client

    yield build
    for client in clients:
        client.close()
