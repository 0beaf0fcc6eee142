"""The Celery app that tests/test_celery.py runs in real worker processes (``celery -A celery_app worker``).

Its settings come from the environment, so that the test process and the workers it starts agree:
``FASTLEASE_TEST_BROKER`` (the Redis broker, also the result backend, on another database) and
``FASTLEASE_TEST_LEASES`` (the Redis database of the leases and of what the tasks record). Each task
records what it did in that database: the test reads it there, never through the worker's logs.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery

from fastlease.celery import TaskLeases
from fastlease.redis import RedisClient

#: How long a task that waits for the test's go-ahead waits at most (a bound, not a pause).
GO_AHEAD_S = 30.0
#: The pause between looks for the go-ahead.
LOOK_S = 0.01

app = Celery("fastlease_tests")


def configure(broker: str, backend: str) -> None:
    """Point the app at the test's Redis (the workers read the same values from the environment)."""
    app.conf.update(
        broker_url=broker,
        result_backend=backend,
        # One message per child at a time: a task that waits must not hold others back in its prefetch.
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        task_default_queue="fastlease-tests",
    )


if "FASTLEASE_TEST_BROKER" in os.environ:
    configure(os.environ["FASTLEASE_TEST_BROKER"], os.environ["FASTLEASE_TEST_BACKEND"])


def records() -> redis.Redis:
    """The test's Redis database: what the tasks record, and the leases."""
    return redis.Redis.from_url(os.environ["FASTLEASE_TEST_LEASES"])


def make_client() -> RedisClient:
    # Each call is recorded with its process: the test checks that every child makes its own client once.
    records().rpush("client-made-in", os.getpid())
    return RedisClient(os.environ["FASTLEASE_TEST_LEASES"])


leases = TaskLeases(make_client)


def wait_for_go_ahead(name: str) -> None:
    """Block until the test sets ``go:<name>`` (bounded): the task is then known to be running."""
    deadline = time.monotonic() + GO_AHEAD_S
    while not records().exists(f"go:{name}"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no go-ahead for {name} within {GO_AHEAD_S} s")
        time.sleep(LOOK_S)


def work_on(account: str, hold_s: float) -> int:
    """The body of a report: counts the reports of ``account`` running now (more than one is an
    overlap, recorded) while it works for ``hold_s`` seconds; returns this process's id."""
    db = records()
    if db.incr(f"inside:{account}") > 1:
        db.incr(f"overlaps:{account}")
    try:
        db.rpush(f"runs:{account}", os.getpid())
        time.sleep(hold_s)  # the work itself: the time two unguarded reports overlap in
    finally:
        db.decr(f"inside:{account}")
    return os.getpid()


@app.task
def ping() -> int:
    return os.getpid()


@app.task(bind=True, max_retries=200)
@leases.singleton(table="locks", key="report:{account}", lease_duration=5.0, retry_delay=0.02)
def report(self: Any, account: str, hold_s: float) -> int:
    return work_on(account, hold_s)


@app.task
def unguarded_report(account: str, hold_s: float) -> int:
    return work_on(account, hold_s)


@app.task(bind=True)
@leases.singleton(table="locks", key="export:{name}", on_busy="skip")
def export(self: Any, name: str) -> int:
    records().rpush(f"export-started:{name}", self.request.id)
    wait_for_go_ahead(name)
    return int(records().incr(f"exported:{name}"))


@app.task(bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=50)
@leases.idempotent(table="task_results", lease_duration=1.0, retry_delay=0.2)
def charge(self: Any, payment_id: str, cents: int) -> dict[str, Any]:
    db = records()
    db.rpush(f"charge-runs:{payment_id}", os.getpid())
    wait_for_go_ahead(payment_id)
    charges = int(db.incr(f"charged:{payment_id}"))  # the effect that must happen once
    return {"payment": payment_id, "cents": cents, "charges": charges}
