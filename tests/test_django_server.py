"""Idempotent Django views under a real server: gunicorn with 4 worker processes (gthread), each with
its own lease client made from the settings, on SQLite and on PostgreSQL. Eight duplicate POSTs,
sent at once from eight threads released together, run the view once: each answer is the stored
response (the original, or a replay) or 409 in progress; a retry after completion replays it."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator, NamedTuple

import pytest

from django_project.fixtures import server_environment
from fastlease.testing._process import HOST, free_port
from helpers.waiting import wait_until

#: The fixtures django_setup and django_alias.
pytest_plugins = ["django_project.fixtures"]

TESTS = Path(__file__).resolve().parent
DUPLICATES = 8
BOUND_S = 30.0  # bound for the server's start and for each request
STOP_S = 10.0  # bound for gunicorn's graceful stop, before SIGKILL


class Answer(NamedTuple):
    status: int
    headers: dict[str, str]
    body: bytes


def request(port: int, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> Answer:
    connection = http.client.HTTPConnection(HOST, port, timeout=BOUND_S)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return Answer(response.status, {name.lower(): value for name, value in response.getheaders()}, response.read())
    finally:
        connection.close()


def _answers_health(port: int, server: subprocess.Popen, log: Path) -> bool:
    if server.poll() is not None:
        raise AssertionError(f"gunicorn exited with {server.returncode}:\n{log.read_text()}")
    try:
        return request(port, "GET", "/health").status == 200
    except OSError:  # not listening yet
        return False


@pytest.fixture
def server(django_alias: str, django_setup, tmp_path: Path) -> Iterator[int]:
    """gunicorn serving the test project with its leases on ``django_alias``; yields its port. Stopped by its PID."""
    port = free_port()
    log = tmp_path / "gunicorn.log"
    with open(log, "wb") as output:
        server = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "--workers", "4", "--worker-class", "gthread", "--threads", "4",
             "--bind", f"{HOST}:{port}", "--chdir", str(TESTS), "--timeout", str(int(BOUND_S)),
             "--graceful-timeout", str(int(STOP_S / 2)), "django_project.wsgi:application"],
            stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
            env=server_environment(django_setup, django_alias),
        )
    try:
        wait_until(lambda: _answers_health(port, server, log), BOUND_S, "gunicorn to answer /health")
        yield port
    finally:
        os.kill(server.pid, signal.SIGTERM)  # gunicorn's graceful stop: the workers finish, then exit
        try:
            server.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            os.kill(server.pid, signal.SIGKILL)
            server.wait(timeout=STOP_S)


def test_eight_concurrent_duplicates_under_gunicorn_run_the_view_once(server, django_alias):
    from django_project.models import Execution

    key = f"key-{uuid.uuid4()}"
    body = json.dumps({"amount": 25}).encode()
    headers = {"Idempotency-Key": key, "Content-Type": "application/json"}
    start = threading.Barrier(DUPLICATES)

    def send(_: int) -> Answer:
        start.wait(BOUND_S)  # all eight leave together
        return request(server, "POST", "/payments", body, headers)

    with ThreadPoolExecutor(DUPLICATES) as pool:
        answers = list(pool.map(send, range(DUPLICATES)))

    assert Execution.objects.using(django_alias).filter(key=key).count() == 1
    originals = [a for a in answers if a.status == 201 and "idempotent-replayed" not in a.headers]
    assert len(originals) == 1, answers
    original = originals[0]
    for answer in answers:
        if answer.status == 409:
            problem = json.loads(answer.body)
            assert problem["type"] == "tag:fastlease,2026:idempotency-key-in-progress", problem
            assert answer.headers["retry-after"] == "1"
        else:
            assert answer.status == 201 and answer.body == original.body, answer
    retry = request(server, "POST", "/payments", body, headers)
    assert retry.status == 201 and retry.headers["idempotent-replayed"] == "true" and retry.body == original.body
    assert retry.headers["location"] == original.headers["location"]
    assert Execution.objects.using(django_alias).filter(key=key).count() == 1
