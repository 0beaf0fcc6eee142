"""Singleton Celery tasks: fastlease.celery against celery-singleton, side by side in one run.

Real ``celery worker`` processes on a redis-server started here (a free 127.0.0.1 port, stopped by its
PID), which is the broker, the result backend and both libraries' lock store. Three measurements:

  * **recovery after SIGKILL**: a singleton task of key K runs (it waits for a go-ahead); the bench
    SIGKILLs the prefork child running it, by its PID, then at once sends another task of key K, and
    measures from just before the kill to the moment that task starts (``time.time()``, one host), up
    to ``--limit`` seconds. fastlease with a lease of ``--lease`` seconds; celery-singleton with its
    default (no ``lock_expiry``) and with ``lock_expiry`` set to the same seconds. A send that
    celery-singleton merges into the dead task queues nothing, so the bench sends again every RESEND_S,
    as a periodic schedule would; fastlease's one send retries by itself.
  * **a task longer than the lock's time**: a task of key K runs 3 leases; after 1.5 leases a second
    task of key K is sent. Whether the two ran at once is read from their start and end times.
    fastlease renews its lease while the task runs; celery-singleton's ``lock_expiry`` is a fixed TTL.
  * **client CPU per task**: ``--tasks`` tasks of distinct keys through a ``solo`` worker (one process,
    so every task runs in it): the worker's CPU (its process and every descendant, from /proc, the
    renewal process included) plus the sending process's ``time.process_time()``, per task, for a plain
    task and each library's singleton task. The same worker serves each kind in turn, in ``--rounds``
    alternating rounds; the median round is shown, with every round's figure.

celery-singleton locks when the task is *sent* (``apply_async``) and unlocks when it ends; a second
send of a locked key returns the first task's result instead of queueing (``AsyncResult`` of the
running task). fastlease locks when the task *runs*; a busy key retries (here every 0.05 s).

Run: ``.venv/bin/python bench/celery_tasks.py [--lease 2] [--limit 20] [--tasks 200] [--rounds 5]``. Needs
``celery[redis]`` and ``celery-singleton`` (the bench dependency group).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Optional

import redis
from celery import Celery
from celery_singleton import Singleton

from fastlease.celery import TaskLeases
from fastlease.redis import RedisClient

HERE = Path(__file__).resolve().parent
#: Bound for a worker's start, a task's start and every result the bench waits for.
BOUND_S = 60.0
LOOK_S = 0.005
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
STOP_S = 10.0
#: How often the recovery's producer sends again a task that celery-singleton merged into the dead one.
RESEND_S = 0.25

# ---- the app (imported by the workers too: ``celery -A celery_tasks``; the tasks are named explicitly, so
# that this script, run as __main__, sends the names the workers know) --------------------------------
app = Celery("celery_tasks_bench")
if "BENCH_REDIS" in os.environ:
    _url = os.environ["BENCH_REDIS"]
    app.conf.update(broker_url=f"{_url}/1", result_backend=f"{_url}/2", singleton_backend_url=f"{_url}/3",
                    worker_prefetch_multiplier=1, broker_connection_retry_on_startup=True)
LEASE_S = float(os.environ.get("BENCH_LEASE", "2"))
leases = TaskLeases(lambda: RedisClient(f"{os.environ['BENCH_REDIS']}/3"))


def _db() -> redis.Redis:
    return redis.Redis.from_url(f"{os.environ['BENCH_REDIS']}/4")


def _work(run: str, hold: str) -> dict[str, Any]:
    """A task's body: records its start (pid, time), then, for ``hold="wait"``, waits for the go-ahead
    (``go:<run>``, bounded), or works ``hold`` seconds; records its end."""
    db = _db()
    started = time.time()
    db.rpush(f"started:{run}", f"{os.getpid()} {started!r}")
    if hold == "wait":
        deadline = time.monotonic() + BOUND_S
        while not db.exists(f"go:{run}") and time.monotonic() < deadline:
            time.sleep(LOOK_S)
    elif float(hold) > 0:
        time.sleep(float(hold))  # the task's work
    db.rpush(f"ended:{run}", repr(time.time()))
    return {"pid": os.getpid(), "started": started}


@app.task(name="celery_tasks.fastlease_task", bind=True, max_retries=100_000)
@leases.singleton(table="locks", key="{key}", lease_duration=LEASE_S, retry_delay=0.05)
def fastlease_task(self: Any, key: str, run: str, hold: str) -> dict[str, Any]:
    return _work(run, hold)


@app.task(name="celery_tasks.singleton_task", base=Singleton, unique_on=["key"])
def singleton_task(key: str, run: str, hold: str) -> dict[str, Any]:
    return _work(run, hold)


@app.task(name="celery_tasks.singleton_expiring_task", base=Singleton, unique_on=["key"],
          lock_expiry=int(LEASE_S))
def singleton_expiring_task(key: str, run: str, hold: str) -> dict[str, Any]:
    return _work(run, hold)


@app.task(name="celery_tasks.plain_task")
def plain_task(key: str, run: str, hold: str) -> dict[str, Any]:
    return _work(run, hold)


KINDS = {"fastlease": "fastlease_task", "celery-singleton": "singleton_task",
         "celery-singleton, lock_expiry": "singleton_expiring_task", "plain task": "plain_task"}


# ---- the bench ---------------------------------------------------------------------------------------
@contextlib.contextmanager
def worker(pool: str, environment: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    command = [sys.executable, "-m", "celery", "-A", "celery_tasks", "worker", f"--pool={pool}", "--concurrency=2",
               "--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel=WARNING",
               f"--hostname=bench-{pool}@%h"]
    with open(log, "ab") as out:
        process = subprocess.Popen(command, cwd=HERE, env=environment, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        deadline = time.monotonic() + BOUND_S
        while not app.control.ping(timeout=0.5):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the {pool} worker did not start: see {log}")
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGQUIT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=STOP_S)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=STOP_S)


def send(kind: str, key: str, run: str, hold: str) -> Any:
    return app.tasks[f"celery_tasks.{KINDS[kind]}"].apply_async((key, run, hold))


def wait_started(run: str, count: int, limit: float) -> Optional[list[tuple[int, float]]]:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        rows = _db().lrange(f"started:{run}", 0, -1)
        if len(rows) >= count:
            return [(int(pid), float(at)) for pid, at in (row.split() for row in rows)]
        time.sleep(LOOK_S)
    return None


def recovery(kind: str, limit: float) -> str:
    """Seconds from a holder's SIGKILL to the next task of its key starting, or what happened instead."""
    key = f"recovery-{kind}-{time.monotonic_ns()}"
    holder = send(kind, key, f"{key}:holder", "wait")
    started = wait_started(f"{key}:holder", 1, BOUND_S)
    if started is None:
        return "the holder never started"
    killed_at = time.time()
    os.kill(started[0][0], signal.SIGKILL)
    sends, after = 0, None
    deadline = time.monotonic() + limit
    while after is None and time.monotonic() < deadline:
        # A send that returns the dead task's result queued nothing: the producer sends again, as a
        # periodic schedule would, every RESEND_S. A send that queued a task is left to run.
        sends += 1
        if send(kind, key, f"{key}:probe", "0").id != holder.id:
            after = wait_started(f"{key}:probe", 1, deadline - time.monotonic())
        else:
            after = wait_started(f"{key}:probe", 1, min(RESEND_S, max(0.0, deadline - time.monotonic())))
    _db().set(f"go:{key}:holder", 1)
    tries = f"{sends} send{'s' if sends > 1 else ''}"
    if after is not None:
        return f"{after[0][1] - killed_at:.2f} s ({tries})"
    return f"not within {limit:g} s ({tries}, each returned the dead task's result)"


def overlap(kind: str, lease: float) -> str:
    key = f"long-{kind}-{time.monotonic_ns()}"
    first = send(kind, key, f"{key}:a", repr(3 * lease))
    if wait_started(f"{key}:a", 1, BOUND_S) is None:
        return "the first task never started"
    time.sleep(1.5 * lease)  # the scenario: the second task is sent halfway through the first
    second = send(kind, key, f"{key}:b", "0")
    first.get(timeout=BOUND_S)
    if second.id == first.id:
        return "no: the second send returned the first task's result (not run)"
    second.get(timeout=BOUND_S)
    b_start = float(_db().lindex(f"started:{key}:b", 0).split()[1])
    a_end = float(_db().lindex(f"ended:{key}:a", 0))
    return f"yes: the second ran {a_end - b_start:.2f} s inside the first" if b_start < a_end else \
        f"no: the second started {b_start - a_end:.2f} s after the first ended"


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and its live descendants, from /proc."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                parents[int(entry.name)] = int(fields[1])
                times[int(entry.name)] = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    tree, grew = {pid}, True
    while grew:
        grown = tree | {child for child, parent in parents.items() if parent in tree}
        grew, tree = grown != tree, grown
    return sum(times.get(member, 0.0) for member in tree)


def cpu_per_task(kind: str, process: subprocess.Popen[bytes], tasks: int) -> float:
    prefix = f"cpu-{kind}-{time.monotonic_ns()}"
    send(kind, f"{prefix}-warm", f"{prefix}-warm", "0").get(timeout=BOUND_S)  # connections, the renewal process
    worker_before, own_before = tree_cpu_s(process.pid), time.process_time()
    results = [send(kind, f"{prefix}-{i}", f"{prefix}-{i}", "0") for i in range(tasks)]
    for result in results:
        result.get(timeout=BOUND_S)
    own = time.process_time() - own_before
    return (tree_cpu_s(process.pid) - worker_before + own) / tasks * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--lease", type=float, default=2.0, help="fastlease's lease and celery-singleton's lock_expiry")
    parser.add_argument("--limit", type=float, default=20.0, help="how long to wait for a recovery")
    parser.add_argument("--tasks", type=int, default=200, help="tasks per kind and round in the CPU measurement")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the CPU measurement")
    options = parser.parse_args()
    from fastlease.testing.redis_server import RedisServer

    print(f"python {platform.python_version()}, celery {importlib.metadata.version('celery')}, "
          f"celery-singleton {importlib.metadata.version('celery-singleton')}, {os.cpu_count()} CPUs, "
          f"lease/lock_expiry {options.lease:g} s, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    with RedisServer() as server:
        base = server.url.rsplit("/", 1)[0]
        environment = {**os.environ, "BENCH_REDIS": base, "BENCH_LEASE": repr(options.lease),
                       "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
        os.environ.update(BENCH_REDIS=base, BENCH_LEASE=repr(options.lease))
        app.conf.update(broker_url=f"{base}/1", result_backend=f"{base}/2", singleton_backend_url=f"{base}/3")
        log = Path(os.environ.get("TMPDIR", "/tmp")) / f"celery_tasks_bench_{os.getpid()}.log"
        run_all(options, environment, log)


def run_all(options: argparse.Namespace, environment: dict[str, str], log: Path) -> None:
    kinds = ["fastlease", "celery-singleton", "celery-singleton, lock_expiry"]
    with worker("prefork", environment, log):
        print(f"\n{'recovery after the holder is SIGKILLed':<44}{'time to the next task of the key'}")
        for kind in kinds:
            print(f"  {kind:<42}{recovery(kind, options.limit)}")
        print(f"\n{'a task of 3 leases; another sent after 1.5':<44}{'did they run at once?'}")
        for kind in kinds[::2]:
            print(f"  {kind:<42}{overlap(kind, options.lease)}")
    measured = ["plain task", *kinds[:2]]
    with worker("solo", environment, log) as process:
        # Rounds alternate the kinds, so that a slower stretch of the shared machine falls on each of them.
        rounds = {kind: [] for kind in measured}
        for _ in range(options.rounds):
            for kind in measured:
                rounds[kind].append(cpu_per_task(kind, process, options.tasks))
    print(f"\n{'client CPU per task (worker + sender)':<44}µs per task: median of {options.rounds} rounds of "
          f"{options.tasks} (each round's)")
    plain = statistics.median(rounds["plain task"])
    for kind in measured:
        cpu = statistics.median(rounds[kind])
        extra = "" if kind == "plain task" else f", +{cpu - plain:,.0f} over a plain task"
        print(f"  {kind:<42}{cpu:,.0f}{extra} ({', '.join(f'{value:,.0f}' for value in rounds[kind])})")


if __name__ == "__main__":
    main()
