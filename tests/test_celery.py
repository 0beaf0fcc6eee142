"""fastlease.celery with real Celery workers: two ``celery worker`` processes (prefork, two children
each) on a real redis-server as the broker, the result backend and the lease store.

* singleton tasks: eight reports of one account never overlap, and every one of them runs (retried
  while the key is busy, never reported done without running); the same reports unguarded do overlap,
  which shows that the check can see an overlap; a busy key with ``on_busy="skip"`` gives SKIPPED and
  never runs the body;
* idempotent tasks: a task whose worker child is SIGKILLed mid-run is redelivered
  (``reject_on_worker_lost``), takes over the dead child's lease, and its effect happens once; a second
  delivery with the same id returns the stored result without running the body;
* each child makes its own client, once, and a worker's parent process makes none;
* the decorators' checks at decoration.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
import redis

import celery_app
from fastlease import MemoryClient
from fastlease.celery import SKIPPED, TaskLeases
from helpers.waiting import wait_until

TESTS = Path(__file__).resolve().parent
WORKERS = 2
#: Bound for a worker's start-up (its first answer to a ping) and for every result the tests wait for.
BOUND_S = 60.0
#: Bound for a worker's shutdown after SIGQUIT (Celery's cold shutdown) before its group is SIGKILLed.
STOP_S = 10.0

pytestmark = [pytest.mark.posix]


@pytest.fixture(scope="module")
def workers(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Two Celery workers started for this module and stopped by their PIDs; the broker, the results
    and the leases on three databases of the session's redis-server."""
    base = redis_url.rsplit("/", 1)[0]
    urls = {"FASTLEASE_TEST_BROKER": f"{base}/5", "FASTLEASE_TEST_BACKEND": f"{base}/6",
            "FASTLEASE_TEST_LEASES": f"{base}/7"}
    for url in urls.values():
        redis.Redis.from_url(url).flushdb()
    celery_app.configure(urls["FASTLEASE_TEST_BROKER"], urls["FASTLEASE_TEST_BACKEND"])
    os.environ["FASTLEASE_TEST_LEASES"] = urls["FASTLEASE_TEST_LEASES"]  # celery_app.records() in this process
    logs = tmp_path_factory.mktemp("celery")
    environment = {**os.environ, **urls, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    started = [_start_worker(index, environment, logs) for index in range(WORKERS)]
    try:
        wait_until(lambda: len(celery_app.app.control.ping(timeout=0.5)) == WORKERS, BOUND_S,
                   lambda: f"{WORKERS} Celery workers answering a ping; their logs: {_tails(logs)}")
        yield {"pids": [process.pid for process in started], "logs": logs}
    finally:
        for process in started:
            _stop(process)


def _start_worker(index: int, environment: dict[str, str], logs: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "celery", "-A", "celery_app", "worker", "--pool=prefork", "--concurrency=2",
               "--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel=INFO",
               "--queues=fastlease-tests", f"--hostname=fastlease-test-{index}@%h"]
    with open(logs / f"worker-{index}.log", "wb") as log:
        # A session of its own: the worker and its children form one group, stopped together by its PID.
        return subprocess.Popen(command, cwd=TESTS, env=environment, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGQUIT)
        try:
            process.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)  # any child left behind (the group is the worker's PID)
    except ProcessLookupError:
        pass
    process.wait(timeout=STOP_S)


def _tails(logs: Path) -> str:
    return "\n".join(f"--- {path.name}\n{path.read_text(errors='replace')[-2000:]}" for path in sorted(logs.iterdir()))


def _db() -> redis.Redis:
    return celery_app.records()


def _pids(name: str) -> list[int]:
    return [int(pid) for pid in _db().lrange(name, 0, -1)]


def test_singleton_reports_of_one_account_never_overlap_and_all_run(workers: dict[str, Any]) -> None:
    account = f"acme-{uuid.uuid4().hex[:8]}"
    results = [celery_app.report.delay(account, 0.05) for _ in range(8)]
    pids = [result.get(timeout=BOUND_S) for result in results]
    assert int(_db().get(f"overlaps:{account}") or 0) == 0
    assert len(_pids(f"runs:{account}")) == 8  # each ran, once: none was reported done without running
    assert len(set(pids)) >= 2, f"the reports ran in one process only ({pids}): the test saw no contention"


def test_the_same_reports_unguarded_do_overlap(workers: dict[str, Any]) -> None:
    # The overlap check of the test above can fail: without the singleton, the reports overlap.
    account = f"acme-{uuid.uuid4().hex[:8]}"
    results = [celery_app.unguarded_report.delay(account, 0.3) for _ in range(4)]
    for result in results:
        result.get(timeout=BOUND_S)
    assert int(_db().get(f"overlaps:{account}") or 0) >= 1


def test_a_busy_singleton_with_skip_is_skipped_and_never_runs(workers: dict[str, Any]) -> None:
    name = f"ledger-{uuid.uuid4().hex[:8]}"
    first = celery_app.export.delay(name)
    wait_until(lambda: _db().llen(f"export-started:{name}") == 1, BOUND_S, "the first export running")
    second = celery_app.export.delay(name)
    wait_until(lambda: second.state == SKIPPED, BOUND_S, lambda: f"the second export SKIPPED, is {second.state}")
    _db().set(f"go:{name}", 1)
    assert first.get(timeout=BOUND_S) == 1
    assert second.state == SKIPPED and "export:" in second.info["reason"]
    assert [task_id.decode() for task_id in _db().lrange(f"export-started:{name}", 0, -1)] == [first.id]


def test_a_task_sigkilled_mid_run_is_redelivered_and_its_effect_happens_once(workers: dict[str, Any]) -> None:
    payment = f"pay-{uuid.uuid4().hex[:8]}"
    task_id = f"charge-{payment}"
    first = celery_app.charge.apply_async((payment, 500), task_id=task_id)
    runs = f"charge-runs:{payment}"
    wait_until(lambda: _db().llen(runs) == 1, BOUND_S, "the first run of the charge")
    os.kill(_pids(runs)[0], signal.SIGKILL)  # the prefork child, mid-run, holding the call's lease
    # The redelivery (reject_on_worker_lost) must take the dead child's lease over before it runs.
    wait_until(lambda: _db().llen(runs) == 2, BOUND_S, "the redelivered run of the charge")
    _db().set(f"go:{payment}", 1)
    expected = {"payment": payment, "cents": 500, "charges": 1}
    assert first.get(timeout=BOUND_S) == expected
    assert _pids(runs)[1] != _pids(runs)[0]
    # Delivered again with the same id: the stored result, and the body does not run. (The result
    # backend's copy is forgotten first, so that get() waits for the second delivery's own result.)
    first.forget()
    again = celery_app.charge.apply_async((payment, 500), task_id=task_id)
    assert again.get(timeout=BOUND_S) == expected
    assert _db().llen(runs) == 2 and int(_db().get(f"charged:{payment}")) == 1


def test_each_worker_child_makes_its_own_client_once(workers: dict[str, Any]) -> None:
    account = f"acme-{uuid.uuid4().hex[:8]}"
    for result in [celery_app.report.delay(account, 0.0) for _ in range(8)]:
        result.get(timeout=BOUND_S)
    made_in = _pids("client-made-in")
    assert set(_pids(f"runs:{account}")) <= set(made_in)
    assert not set(made_in) & set(workers["pids"]), "a worker's parent process made a client"
    assert len(made_in) == len(set(made_in)), f"a process made its client twice: {made_in}"


# ---- checks at decoration (no worker needed) -----------------------------------------------------
def test_task_leases_refuses_a_client_and_asks_for_a_function() -> None:
    with pytest.raises(TypeError, match="function that makes the client"):
        TaskLeases(MemoryClient())  # type: ignore[arg-type]


@pytest.mark.parametrize("options, message", [
    ({"on_busy": "drop"}, "on_busy must be 'retry' or 'skip'"),
    ({"retry_delay": -1}, "retry_delay must be seconds"),
    ({"max_retries": 1.5}, "max_retries must be None"),
    ({"lease_duration": 0}, "lease_duration"),
    ({"key": "report:{missing}"}, "missing"),
    ({"table": "bad table!"}, "table"),
])
def test_singleton_checks_its_options_at_decoration(options: dict[str, Any], message: str) -> None:
    leases = TaskLeases(MemoryClient)
    arguments = {"table": "locks", "key": "report:{account}", **options}
    with pytest.raises((TypeError, ValueError), match=message):
        leases.singleton(**arguments)(lambda account: None)


@pytest.mark.parametrize("options, message", [
    ({"payload": ("amount",)}, "amount"),
    ({"ttl": -1}, "ttl"),
    ({"serializer": object()}, "serializer"),
    ({"retry_on": "everything"}, "retry_on"),
    ({"wait": -1}, "wait"),
])
def test_idempotent_checks_its_options_at_decoration(options: dict[str, Any], message: str) -> None:
    leases = TaskLeases(MemoryClient)
    with pytest.raises((TypeError, ValueError), match=message):
        leases.idempotent(table="task_results", **options)(lambda self, payment_id: None)


def test_the_decorators_go_under_app_task() -> None:
    with pytest.raises(TypeError, match="under @app.task"):
        celery_app.leases.singleton(table="locks", key="k")(celery_app.ping)


def test_an_id_keyed_idempotent_task_called_outside_celery_says_to_pass_a_key() -> None:
    leases = TaskLeases(MemoryClient)
    charge = leases.idempotent(table="task_results")(lambda payment_id: payment_id)
    with pytest.raises(TypeError, match="pass key="):
        charge("p1")


def test_a_singleton_called_outside_a_worker_runs_under_its_lease() -> None:
    leases = TaskLeases(MemoryClient)
    seen: list[Any] = []

    @leases.singleton(table="locks", key="report:{account}")
    def report(account: str) -> str:
        lease = leases.current_lease()
        seen.append((lease.key, lease.fencing_token, [row["owner"] for row in leases.client().inspect("locks")]))
        return account

    assert report("acme") == "acme" and report("acme") == "acme"
    (key, first_token, owners), (_, second_token, _) = seen
    assert key == "report:acme" and len(owners) == 1 and second_token > first_token
    assert leases.client().inspect("locks", "report:acme") == []
    with pytest.raises(RuntimeError, match="no such task runs in this thread"):
        leases.current_lease()


# ---- a busy key in Celery's eager mode (tasks run in this process; no worker needed) ------------------
@pytest.fixture
def eager_app() -> Iterator[Any]:
    from celery import Celery

    app = Celery("fastlease_eager", broker="memory://")
    app.conf.task_always_eager = True
    yield app


def test_a_busy_singleton_fails_with_lock_not_acquired_once_its_retries_are_spent(eager_app: Any) -> None:
    from fastlease import LockNotAcquired, SyncDistributedLock

    leases = TaskLeases(MemoryClient)
    runs: list[str] = []

    @eager_app.task(bind=True)
    @leases.singleton(table="locks", key="report:{account}", retry_delay=0, max_retries=2)
    def report(self: Any, account: str) -> None:
        runs.append(account)

    with SyncDistributedLock(leases.client(), table="locks", key="report:acme", wait_timeout=0):
        result = report.apply(("acme",))
    assert result.state == "FAILURE" and isinstance(result.result, LockNotAcquired)
    assert "report:acme" in str(result.result) and runs == []
    assert report.apply(("acme",)).state == "SUCCESS" and runs == ["acme"]  # the key is free again


def test_a_busy_singleton_with_skip_is_ignored_in_eager_mode_too(eager_app: Any) -> None:
    from fastlease import SyncDistributedLock

    leases = TaskLeases(MemoryClient)
    runs: list[str] = []

    @eager_app.task(bind=True)
    @leases.singleton(table="locks", key="export:{name}", on_busy="skip")
    def export(self: Any, name: str) -> None:
        runs.append(name)

    with SyncDistributedLock(leases.client(), table="locks", key="export:ledger", wait_timeout=0):
        assert export.apply(("ledger",)).state == "IGNORED"
    assert runs == []


def test_an_idempotent_task_keyed_on_its_arguments_replays_across_task_ids(eager_app: Any) -> None:
    from fastlease.idempotency import IdempotencyKeyMismatch

    leases = TaskLeases(MemoryClient)
    runs: list[str] = []

    @eager_app.task(bind=True)
    @leases.idempotent(table="task_results", key="charge:{payment_id}")
    def charge(self: Any, payment_id: str, cents: int) -> dict[str, Any]:
        runs.append(self.request.id)
        return {"payment": payment_id, "cents": cents}

    first = charge.apply(("p1", 500), task_id="t-1")
    again = charge.apply(("p1", 500), task_id="t-2")  # another message, the same payment
    assert first.result == again.result == {"payment": "p1", "cents": 500} and runs == ["t-1"]
    reused = charge.apply(("p1", 900), task_id="t-3")  # the same key with other arguments
    assert reused.state == "FAILURE" and isinstance(reused.result, IdempotencyKeyMismatch) and runs == ["t-1"]
    assert charge.apply(("p2", 500), task_id="t-4").state == "SUCCESS" and runs == ["t-1", "t-4"]
