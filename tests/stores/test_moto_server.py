"""The serialised moto test server: conditional writes are atomic under real concurrent requests.

Stock moto_server is not (two of four racing ``attribute_not_exists`` puts can both succeed), which is why
fastlease's DynamoDB tests run against :mod:`fastlease.testing.moto_server` instead.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
import time
import uuid
from types import ModuleType
from typing import TYPE_CHECKING, Any, Iterator, List, Optional

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

pytestmark = pytest.mark.server  # every test here starts a moto server process

if TYPE_CHECKING:
    from fastlease.testing.moto_server import MotoServer


def moto_server_module() -> ModuleType:
    """fastlease.testing.moto_server, imported on use: it needs moto's server mode, which the wheel tests (they
    deselect this module's tests) do not install, and they still collect this file."""
    import fastlease.testing.moto_server

    return fastlease.testing.moto_server

ROUNDS = 800
CONTENDERS = 4
REGION = "us-east-1"
WAIT_S = 30.0  # bound for every barrier wait and thread join


@pytest.fixture(scope="module")
def moto_server() -> Iterator[MotoServer]:
    server = moto_server_module().MotoServer()
    server.start(timeout_s=60.0)
    try:
        yield server
    finally:
        server.stop()


def make_client(endpoint_url: str) -> Any:
    """One client per contender: its own session, its own connection pool, no retries (a retry of a
    conditional put could turn a lost race into a spurious ConditionalCheckFailed or hide a double win)."""
    return boto3.session.Session().client(
        "dynamodb",
        endpoint_url=endpoint_url,
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(
            retries={"total_max_attempts": 1},
            max_pool_connections=2,
            connect_timeout=10,
            read_timeout=30,
        ),
    )


def create_table(client: Any) -> str:
    name = f"fastlease-race-{uuid.uuid4().hex[:12]}"
    client.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "key", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "key", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    client.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 0.1, "MaxAttempts": 50})
    return name


def test_conditional_put_has_exactly_one_winner_per_round(moto_server: MotoServer) -> None:
    """800 rounds; in each, 4 threads (own client each) released together by a barrier race to create one key."""
    setup = make_client(moto_server.endpoint_url)
    table = create_table(setup)
    clients = [make_client(moto_server.endpoint_url) for _ in range(CONTENDERS)]
    # winners[r] lists the contenders whose put succeeded in round r.
    winners: List[List[int]] = [[] for _ in range(ROUNDS)]
    losers = [0] * ROUNDS
    winners_lock = threading.Lock()
    errors: List[BaseException] = []
    barrier = threading.Barrier(CONTENDERS)

    def contend(contender: int) -> None:
        client = clients[contender]
        try:
            for r in range(ROUNDS):
                barrier.wait(timeout=WAIT_S)  # everyone starts round r together: genuinely concurrent requests
                try:
                    client.put_item(
                        TableName=table,
                        Item={"key": {"S": f"race-{r}"}, "owner": {"S": str(contender)}},
                        ConditionExpression="attribute_not_exists(#k)",
                        ExpressionAttributeNames={"#k": "key"},
                    )
                except ClientError as error:
                    if error.response["Error"]["Code"] != "ConditionalCheckFailedException":
                        raise
                    with winners_lock:
                        losers[r] += 1
                else:
                    with winners_lock:
                        winners[r].append(contender)
        except BaseException as error:  # report it, and release the others rather than leave them waiting
            errors.append(error)
            barrier.abort()

    started = time.monotonic()
    threads = [threading.Thread(target=contend, args=(c,), name=f"contender-{c}") for c in range(CONTENDERS)]
    for thread in threads:
        thread.start()
    deadline = started + 240.0
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    elapsed = time.monotonic() - started
    assert not any(thread.is_alive() for thread in threads), f"contenders still running after {elapsed:.0f} s"
    first_error: Optional[BaseException] = next(
        (e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0] if errors else None
    )
    assert first_error is None, f"contender failed: {first_error!r}"

    bad = {r: w for r, w in enumerate(winners) if len(w) != 1}
    assert not bad, f"{len(bad)} of {ROUNDS} rounds without exactly one winner, e.g. {list(bad.items())[:5]}"
    assert all(n == CONTENDERS - 1 for n in losers)

    stored = {}
    paginator = setup.get_paginator("scan")
    for page in paginator.paginate(TableName=table, ConsistentRead=True, PaginationConfig={"MaxItems": ROUNDS + 1}):
        for item in page["Items"]:
            stored[item["key"]["S"]] = int(item["owner"]["S"])
    assert len(stored) == ROUNDS
    mismatched = [r for r in range(ROUNDS) if stored[f"race-{r}"] != winners[r][0]]
    assert not mismatched, f"stored owner is not the winner in rounds {mismatched[:10]}"


def test_stop_ends_the_child_process() -> None:
    server = moto_server_module().MotoServer()
    try:
        url = server.start(timeout_s=60.0)
        pid = server.pid
        assert url.startswith("http://127.0.0.1:") and url == server.endpoint_url
        os.kill(pid, 0)  # alive
        assert server.start() == url  # starting a running server is a no-op
        server.stop()
    finally:
        server.stop()  # idempotent (and stops it by its PID if an assertion above failed)
    assert server.pid == pid
    # stop() reaped the child, so the PID is gone (not a zombie waiting for us).
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(RuntimeError, match="not running"):
        _ = server.endpoint_url


def test_context_manager_stops_the_child() -> None:
    with moto_server_module().MotoServer() as server:
        pid = server.pid
        client = make_client(server.endpoint_url)
        assert client.list_tables()["TableNames"] == []  # a fresh process has fresh moto state
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_start_reports_a_child_that_cannot_start() -> None:
    server = moto_server_module().MotoServer(host="0.0.0.0")
    with pytest.raises(RuntimeError) as caught:
        server.start(timeout_s=60.0)
    message = str(caught.value)
    assert "exited before it was ready" in message
    assert "refusing to bind '0.0.0.0'" in message  # the child's stderr is in the report
    with pytest.raises(ProcessLookupError):
        os.kill(server.pid, 0)
    server.stop()  # still fine after a failed start


def test_a_latency_floor_holds_each_response_outside_the_serialising_lock() -> None:
    """``latency_ms`` (bench/dynamodb_cycle.py's equal-latency table) delays every response to that long
    after its request arrived, but sleeps outside the lock: two connections' requests wait together."""
    floor_s = 1.0
    with moto_server_module().MotoServer(latency_ms=floor_s * 1000) as server:
        clients = [make_client(server.endpoint_url) for _ in range(2)]
        for client in clients:
            client.list_tables()  # connect and warm up; each call already waits the floor
        took: list[float] = []

        def request(client: Any) -> None:
            started = time.monotonic()
            client.list_tables()
            took.append(time.monotonic() - started)

        started = time.monotonic()
        threads = [threading.Thread(target=request, args=(client,)) for client in clients]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT_S)
        both_s = time.monotonic() - started
    assert len(took) == 2 and min(took) >= floor_s, took
    # Serialised sleeps would take two floors; together they take one and the requests' own time.
    assert both_s < 1.9 * floor_s, both_s


def test_a_bad_latency_is_refused_by_name() -> None:
    done = subprocess.run([sys.executable, "-m", "fastlease.testing.moto_server", "--latency-ms", "-1"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--latency-ms must be in 0..60000, got -1.0" in done.stderr


def test_import_without_moto_names_the_install_command() -> None:
    code = "import sys; sys.modules['moto'] = None; import fastlease.testing.moto_server"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "ImportError" in done.stderr
    assert "pip install 'fastlease[testing]'" in done.stderr


def test_the_install_hint_names_an_extra_that_installs_the_server_mode() -> None:
    import tomllib
    from pathlib import Path

    from fastlease.testing.moto_server import INSTALL_HINT

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    if not pyproject.exists():
        pytest.skip("no pyproject.toml here: the suite runs against an installed wheel")
    extras = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    assert INSTALL_HINT == "pip install 'fastlease[testing]'"
    assert any(requirement.startswith("moto[server,dynamodb]") for requirement in extras["testing"])
    assert {"pytest", "boto3", "redis"} <= {requirement.split(">")[0] for requirement in extras["testing"]}


def test_middleware_runs_one_request_at_a_time_including_its_body() -> None:
    """In-process check of the middleware alone: the wrapped app's work, lazy body and close never overlap."""
    active = 0
    peak = 0
    state_lock = threading.Lock()

    def enter() -> None:
        nonlocal active, peak
        with state_lock:
            active += 1
            peak = max(peak, active)

    def leave() -> None:
        nonlocal active
        with state_lock:
            active -= 1

    class Body:
        def __iter__(self) -> Iterator[bytes]:
            enter()
            time.sleep(0.002)  # widen the window a concurrent request would hit
            leave()
            yield b"ok"

        def close(self) -> None:
            enter()
            leave()

    def app(environ: dict, start_response: Any) -> Body:
        enter()
        time.sleep(0.002)
        leave()
        start_response("200 OK", [("Content-Type", "text/plain")])
        return Body()

    wrapped = moto_server_module().SerialisedWSGIApp(app)
    bodies: List[List[bytes]] = []
    barrier = threading.Barrier(8)

    def request() -> None:
        barrier.wait(timeout=WAIT_S)
        for _ in range(20):
            environ = {"wsgi.input": io.BytesIO(b"{}"), "CONTENT_LENGTH": "2"}
            bodies.append(wrapped(environ, lambda status, headers, exc_info=None: None))

    threads = [threading.Thread(target=request) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=WAIT_S)
    assert not any(thread.is_alive() for thread in threads)
    assert len(bodies) == 160 and all(body == [b"ok"] for body in bodies)
    assert peak == 1
