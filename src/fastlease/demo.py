"""``fastlease demo``: worker processes contend on a few customer keys; one holder is killed halfway.

Each worker is a separate process (spawned) with its own client, as in production. They loop over
the customers in turn: hold the customer's lease (1 s) while "syncing" it for 0.1-0.6 s, release.
Halfway through, the demo SIGKILLs a worker while it holds a lease: it never releases, and its
renewals stop. Another worker takes the key over once it has seen the abandoned row unchanged for
one full lease. The demo prints progress every second, then a table per worker and the takeover time.

Before any worker starts, the demo makes its lock table where the store needs one made (DynamoDB,
PostgreSQL), and one read with a short timeout checks that the store answers: a store that cannot be
reached ends the demo with one line naming it and the error, not a run of timeouts.

On the memory store the workers are threads of this process (the store lives in one process), and
the "kill" stops the holder's renewals and abandons its row instead.
"""

from __future__ import annotations

import collections
import functools
import multiprocessing
import multiprocessing.connection
import os
import random
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, Optional, cast

from ._store_factory import (
    BadOption,
    StoreOptions,
    check_postgres_dsn,
    client_from_options,
    postgres_dsn_from_environment,
    redis_url_from_environment,
    require_library,
)
from .exceptions import LockLost, LockNotAcquired
from .lock import SyncDistributedLock
from .stores.base import NO_USAGE
from .stores.memory import MemoryStore

if TYPE_CHECKING:  # annotations only: boto3's and psycopg's clients are imported when their store is chosen
    from .dynamodb import DynamoDBClient
    from .postgres import PostgresClient

CUSTOMERS = ("acme", "globex", "initech")
TABLE = "demo_locks"
LEASE_S = 1.0
WAIT_S = 3.0
WORK_S = (0.1, 0.6)
#: Workers go on past the run's end until the killed holder's key has been taken over, for at most this
#: long after the kill (or after the end, when nobody could be killed by then): a loaded machine can
#: start the workers, and so the kill, late, and the demo is there to show the takeover.
OVERTIME_S = LEASE_S + WAIT_S + 1.0
MOTO_REGION = "us-east-1"  # the Region of the moto server the demo starts when no --endpoint-url is given
#: The store check before the workers start: one read of this key, with this timeout, well under a
#: worker's wait budget (WAIT_S), so an unreachable store is reported at once.
PROBE_KEY = "store-check"
PROBE_TIMEOUT_S = 2.0
#: What the summary table's columns mean, printed under it.
COLUMNS = (
    ("acquisitions", "leases the worker acquired"),
    ("contended", "of those, acquisitions that found the key held and waited for it"),
    ("wait ms", "time spent waiting for the lease, summed over the worker's acquisitions"),
    ("renewals", f"renewals of its leases ({LEASE_S:g} s, renewed every {LEASE_S / 3:.2f} s while held)"),
    ("timeouts", f"attempts that gave up after waiting {WAIT_S:g} s without getting the lease"),
    ("status", "ok, killed (halfway, while holding a lease), never acquired (no lease in the whole run) "
               "or error (below)"),
)


class DemoError(Exception):
    """A demo that cannot run as asked (bad --workers or --seconds, a server it cannot start, a store
    that does not answer); the message says why."""


def _error_text(error: BaseException) -> str:
    """An error as one line: its type and message."""
    return " ".join(f"{type(error).__name__}: {error}".split())


def worker(index: int, options: StoreOptions, memory_store: Optional[MemoryStore], stop_at: Any, events: Any,
           crash: Optional[threading.Event] = None) -> None:
    """One worker's loop; reports ("hold", ...), ("valid", ...), ("lost", ...), ("done", ...), ("timeout", ...) or
    ("error", ...). A timeout carries the last store error of its wait, or None when it only found the key held.

    ``stop_at`` is a shared double (``multiprocessing.Value``) that the parent moves: the time to stop, on
    the monotonic clock, which is system-wide on Linux, so processes share it. It starts past the run's
    end, so no worker leaves before the parent knows whether the killed holder's key was taken over."""
    rng = random.Random(index)
    try:
        client = client_from_options(options, memory_store=memory_store)
    except Exception as error:  # noqa: BLE001 - reported to the parent
        events.put(("error", index, _error_text(error)))
        return
    try:
        for turn in range(100_000):  # bounded; the deadline ends it first
            if time.monotonic() >= stop_at.value:
                break
            # Each worker visits every customer in turn (from its own starting point), so a killed
            # holder's customer is soon asked for again and the takeover shows.
            customer = CUSTOMERS[(index + turn) % len(CUSTOMERS)]
            guard = SyncDistributedLock(client, table=TABLE, key=f"customer-sync:{customer}",
                                        lease_duration=LEASE_S, wait_timeout=WAIT_S)
            try:
                lease = guard.__enter__()
            except LockNotAcquired as error:
                cause = error.__cause__  # the last store error of the wait, if any
                events.put(("timeout", index, customer, None if cause is None else _error_text(cause)))
                continue
            metrics = guard.metrics
            contended = metrics.read_requests > 0 or metrics.conditional_failures > 0  # found it held
            events.put(("hold", index, customer, time.monotonic(), metrics.wait_ms, contended))
            report = functools.partial(_report_validity, events, index, customer)
            if _work(rng.uniform(*WORK_S), lease, report, crash):
                client.close()  # the simulated crash: renewals stop and the row is never released
                return
            renewals = lease.metrics.renewals
            try:
                guard.__exit__(None, None, None)
            except LockLost as lost:  # ownership ended during the work (a starved machine): say so, go on
                events.put(("lost", index, customer, lost.cause))
            events.put(("done", index, customer, renewals))
    except Exception as error:  # noqa: BLE001 - reported to the parent
        events.put(("error", index, _error_text(error)))
    finally:
        client.close()


def _report_validity(events: Any, index: int, customer: str, until: float) -> None:
    events.put(("valid", index, customer, until))


def _work(seconds: float, lease: Any, report: Callable[[float], object], crash: Optional[threading.Event]) -> bool:
    """The work done under the lease: ``seconds`` of waiting, in slices of a renewal interval, reporting
    before each slice when the lease's validity ends (so the parent can show that a takeover of a killed
    holder's key never came before it). True if the simulated crash came."""
    end = time.monotonic() + seconds
    for _ in range(1000):  # bounded: a slice is at least 1 ms
        left = end - time.monotonic()
        if left <= 0:
            return False
        report(lease.valid_until() or 0.0)  # on the monotonic clock, which the processes share
        pause = min(left, LEASE_S / 3) + 0.001
        if crash is not None:
            if crash.wait(pause):
                return True
        else:
            time.sleep(pause)
    return False


def _after_last_renewal() -> str:
    """Why a takeover can come sooner than a lease after the kill: it is counted from the dead holder's
    last renewal, which came before the kill."""
    return f"one lease ({LEASE_S:g} s) after its last renewal, which came before the kill"


def prepare_store(options: StoreOptions, cleanup: list[Callable[[], object]],
                  say: Callable[[str], None]) -> StoreOptions:
    """The options the workers use: a temporary SQLite file, a moto server, a redis-server or a
    throwaway PostgreSQL cluster of the demo's own (stopped through ``cleanup``) wherever ``options``
    name none. One client is built here, in the parent, so a bad option fails once, with the message
    the other commands give for it, and before anything is printed."""
    require_library(options.store)  # before any server is started for a store that cannot be used
    if options.store == "sqlite":
        if options.path is None:
            directory = tempfile.mkdtemp(prefix="fastlease-demo-")
            cleanup.append(lambda: shutil.rmtree(directory, ignore_errors=True))
            options = replace(options, path=os.path.join(directory, "locks.db"))
        where = f"SQLite file {options.path}"
    elif options.store == "dynamodb" and options.endpoint_url is None:
        options, where = _start_moto(options, cleanup)
    elif options.store == "dynamodb":
        where = f"DynamoDB at {options.endpoint_url}"
    elif options.store == "redis" and redis_url_from_environment(options) is None:
        options, where = _start_redis(options, cleanup)
    elif options.store == "redis":
        from .redis import _safe_url

        options = replace(options, url=redis_url_from_environment(options))  # --url, else $FASTLEASE_REDIS_URL
        where = f"Redis at {_safe_url(cast(str, options.url))}"
    elif options.store == "postgres" and postgres_dsn_from_environment(options) is None:
        options, where = _start_postgres(options, cleanup)
    elif options.store == "postgres":
        from .postgres import _without_password

        dsn = cast(str, postgres_dsn_from_environment(options))  # --dsn, else $FASTLEASE_POSTGRES_DSN
        check_postgres_dsn(dsn, "--dsn" if options.dsn else "$FASTLEASE_POSTGRES_DSN")
        options = replace(options, dsn=dsn)
        where = f"PostgreSQL at {_without_password(dsn)}"
    else:
        where = "in-memory (workers are threads of this process; the crash is simulated)"
    client = client_from_options(options)
    try:
        _check_store(client, options.store, where)
    finally:
        client.close()
    say(f"store: {where}")
    return options


def _start_moto(options: StoreOptions, cleanup: list[Callable[[], object]]) -> tuple[StoreOptions, str]:
    """A local moto server for ``--store dynamodb`` without an endpoint (stopped through ``cleanup``), with
    placeholder credentials where none are set: the options that reach it, and where it is. DemoError,
    naming the install command, when moto's server mode is not installed."""
    try:
        from .testing.moto_server import MotoServer
    except ImportError as error:  # its message names the one install command
        raise DemoError(f"--store dynamodb without --endpoint-url starts a moto server, but {error}") from None
    moto_server = MotoServer()
    endpoint_url = moto_server.start(timeout_s=60.0)
    cleanup.append(moto_server.stop)
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    return (replace(options, endpoint_url=endpoint_url, region=options.region or MOTO_REGION),
            f"DynamoDB on a local serialised moto server, {endpoint_url} (pid {moto_server.pid})")


def _start_redis(options: StoreOptions, cleanup: list[Callable[[], object]]) -> tuple[StoreOptions, str]:
    """A local redis-server for ``--store redis`` without a URL (stopped through ``cleanup``): the options
    that reach it, and where it is. DemoError, saying why, when it cannot be started."""
    from .testing.redis_server import RedisServer, RedisServerUnavailable

    server = RedisServer()
    try:
        url = server.start()
    except RedisServerUnavailable as error:
        raise DemoError(f"--store redis without --url starts a local redis-server, but {error}") from None
    cleanup.append(server.stop)
    return replace(options, url=url), f"Redis on a local redis-server, {url} (pid {server.pid})"


def _start_postgres(options: StoreOptions, cleanup: list[Callable[[], object]]) -> tuple[StoreOptions, str]:
    """A throwaway PostgreSQL cluster for ``--store postgres`` without a DSN (stopped, and its directory
    removed, through ``cleanup``): the options that reach it, and where it is. DemoError, saying so and
    what to do instead, when PostgreSQL is not installed or does not start."""
    from .testing.postgres_server import DEBIAN_BIN_DIRS, PostgresServer, PostgresServerUnavailable, postgres_bin_dir

    without = "--store postgres without --dsn (or $FASTLEASE_POSTGRES_DSN) starts a throwaway local PostgreSQL server"
    if postgres_bin_dir() is None:
        raise DemoError(f"{without}, but initdb is not available (not in $PG_BINDIR, on PATH or in "
                        f"{DEBIAN_BIN_DIRS}): install PostgreSQL (apt-get install -y postgresql, or set PG_BINDIR "
                        "to the directory of initdb and postgres), or pass --dsn to use a server you run")
    server = PostgresServer()
    try:
        dsn = server.start()
    except PostgresServerUnavailable as error:
        raise DemoError(f"{without}, but it did not start: {' '.join(str(error).split())}; pass --dsn to use a "
                        "server you run") from None
    cleanup.append(server.stop)
    return (replace(options, dsn=dsn),
            f"PostgreSQL on a throwaway local server (no --dsn given), {dsn} (pid {server.pid}), removed at the end")


def _check_store(client: Any, store: str, where: str) -> None:
    """Make the demo's table (DynamoDB, PostgreSQL) and read one key with a short timeout, through the
    request path the workers use: a store that is unreachable, or refuses the demo, fails here, once,
    before any worker starts, with a DemoError naming it."""
    try:
        if store == "dynamodb":
            dynamodb = cast("DynamoDBClient", client)
            if not dynamodb.lock_table_exists(TABLE):
                dynamodb.create_lock_table(TABLE, wait=True)
        elif store == "postgres":  # lock operations never create tables: the demo deploys its own
            cast("PostgresClient", client).create_lock_table(TABLE)
        client.store.read(TABLE, PROBE_KEY, PROBE_TIMEOUT_S, NO_USAGE)
    except Exception as error:  # noqa: BLE001 - store errors and the SDK's own: one line, not a traceback
        raise DemoError(f"cannot reach the store ({where}): {_error_text(error)}") from None


def run(options: StoreOptions, workers: int = 4, seconds: float = 10.0, *,
        say: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the demo on the store ``options`` name (see prepare_store); returns the summary (also printed
    through ``say`` as it goes). Raises DemoError, or StoreOptionError for a store option that cannot work."""
    if type(workers) is not int or not 2 <= workers <= 64:
        raise BadOption(f"--workers must be an integer from 2 to 64, got {workers!r}")
    if not 2.0 <= seconds <= 600.0:
        raise BadOption(f"--seconds must be from 2 to 600, got {seconds!r}")
    cleanup: list[Callable[[], object]] = []
    try:
        return _contend(prepare_store(options, cleanup, say), workers, seconds, say)
    finally:
        for step in reversed(cleanup):
            step()


def _contend(options: StoreOptions, count: int, seconds: float, say: Callable[[str], None]) -> dict[str, Any]:
    """Run ``count`` workers on the store ``options`` name for ``seconds``, kill a holder halfway, print
    progress every second and then the table through ``say``; returns the summary."""
    threads = options.store == "memory"
    say(f"{count} workers, customers {', '.join(CUSTOMERS)}, lease {LEASE_S:g} s, {seconds:g} s; "
        "one holder is killed halfway")
    start_at = time.monotonic() + (0.2 if threads else 2.0)  # spawned workers need time to import
    stop_at = start_at + seconds
    crashes: list[Optional[threading.Event]] = [threading.Event() if threads else None for _ in range(count)]
    # The workers' shared deadline, moved at the kill and at the takeover below. No lock: a worker
    # SIGKILLed while it held one would leave it held; an aligned double is written whole.
    run_until = multiprocessing.get_context("spawn").Value("d", stop_at + OVERTIME_S, lock=False)
    inbox, runners = _start_workers(options, run_until, crashes)
    tally = _Tally(count, start_at, say)
    next_progress = start_at + 1.0
    try:
        while time.monotonic() < run_until.value + WAIT_S + 5.0:
            event = inbox.get(0.1)
            now = time.monotonic()
            if event is not None:
                tally.record(event, now)
            if tally.killed is None and now >= start_at + seconds / 2:
                tally.killed = _kill_a_holder(tally.holders, runners, crashes, now, start_at, say)
                if tally.killed is not None:
                    tally.stats[tally.killed["worker"]]["status"] = "killed"
                    run_until.value = max(stop_at, now + OVERTIME_S)  # time for the takeover to happen
            if tally.killed is not None and "taken_by" in tally.killed:
                run_until.value = stop_at  # seen: the run ends as planned, or now if that has passed
            if now >= next_progress and now < stop_at:
                total = sum(s["acquisitions"] for s in tally.stats)
                held = " · ".join(f"{c}: {_label(h)}" for c, h in tally.holders.items())
                say(f"[{now - start_at:5.1f}s] {total} acquisitions · {held}")
                next_progress += 1.0
            if now >= stop_at and not any(_alive(r) for r in runners) and event is None:
                break
    finally:
        for runner in runners:
            _stop(runner)
    tally.errors.extend(_never_acquired(tally.stats, tally.store_errors, seconds))
    summary = {"store": options.store, "workers": tally.stats, "killed": tally.killed, "errors": tally.errors}
    _print_table(summary, say)
    return summary


def _start_workers(options: StoreOptions, stop_at: Any,
                   crashes: list[Optional[threading.Event]]) -> tuple[_Inbox, list[Any]]:
    """Start one worker per entry of ``crashes``: on the memory store, threads that share one MemoryStore,
    each with its crash event; else spawned processes, which are killed for real. Returns the inbox their
    events come to and the workers. ``stop_at`` is the shared deadline :func:`worker` describes."""
    runners: list[Any] = []
    readers, writers = zip(*(multiprocessing.Pipe(duplex=False) for _ in crashes))
    if options.store == "memory":
        memory_store = MemoryStore()  # the one store the worker threads share
        for index, writer in enumerate(writers):
            runners.append(threading.Thread(target=worker, args=(index, options, memory_store, stop_at,
                                                                 _Channel(writer), crashes[index])))
            runners[-1].start()
    else:
        context = multiprocessing.get_context("spawn")
        for index, writer in enumerate(writers):
            runners.append(context.Process(target=worker, args=(index, options, None, stop_at, _Channel(writer),
                                                                None), daemon=True))
            runners[-1].start()
            writer.close()  # the worker's copy is the only one left, so its death ends the pipe
    return _Inbox(readers), runners


class _Channel:
    """A worker's end of its own pipe to the parent. Each worker has its own, not one shared
    multiprocessing.Queue: a Queue's writers share a lock, and a worker SIGKILLed while its feeder thread
    held that lock would silence every other worker for good (the demo kills one on purpose; a CI run
    showed no takeover because of it)."""

    def __init__(self, connection: Any) -> None:
        self._connection = connection

    def put(self, event: tuple[Any, ...]) -> None:
        self._connection.send(event)


class _Inbox:
    """The parent's ends of the workers' pipes, read as one queue."""

    def __init__(self, readers: Any) -> None:
        self._readers = list(readers)
        self._pending: collections.deque[tuple[Any, ...]] = collections.deque()

    def get(self, timeout: float) -> Optional[tuple[Any, ...]]:
        """The next event of any worker, or None after ``timeout`` seconds without one."""
        if not self._pending:  # (with every pipe ended, wait() just waits out the timeout)
            for reader in multiprocessing.connection.wait(self._readers, timeout):
                try:
                    self._pending.append(cast(Any, reader).recv())
                except (EOFError, OSError):  # its worker has gone, perhaps killed in the middle of a send
                    self._readers.remove(reader)
        return self._pending.popleft() if self._pending else None


class _Tally:
    """What the parent has learnt from its workers' events so far: each worker's counts and status, who
    holds each customer, the validity each holder last reported, the killed holder and the takeover of
    its key, and the errors to report. Only the parent's thread reads and writes it."""

    def __init__(self, count: int, start_at: float, say: Callable[[str], None]) -> None:
        self.stats: list[dict[str, Any]] = [
            {"acquisitions": 0, "contended": 0, "wait_ms": 0.0, "renewals": 0, "timeouts": 0, "lost": 0, "status": "ok"}
            for _ in range(count)
        ]
        self.holders: dict[str, Any] = dict.fromkeys(CUSTOMERS)  # worker index, None (free) or a label
        # (worker, customer) -> its lease's last reported validity end
        self.valid_until: dict[tuple[int, str], float] = {}
        self.killed: Optional[dict[str, Any]] = None
        self.errors: list[str] = []
        self.store_errors: dict[int, str] = {}  # worker index -> the last store error behind one of its timeouts
        self._start_at = start_at
        self._say = say

    def record(self, event: tuple[Any, ...], now: float) -> None:
        """Count one event of a worker (the kinds :func:`worker` reports), which arrived at ``now``."""
        kind, index = event[0], event[1]
        stats = self.stats[index]
        if kind == "hold":
            _, _, customer, acquired, wait_ms, contended = event
            self._hold(index, customer, acquired, wait_ms, contended)
        elif kind == "valid":
            self.valid_until[(index, event[2])] = event[3]
        elif kind == "done":
            stats["renewals"] += event[3]
            if self.holders.get(event[2]) == index:
                self.holders[event[2]] = None
        elif kind == "lost":
            stats["lost"] += 1
            self._say(f"[{now - self._start_at:5.1f}s] worker {index} lost its lease on {event[2]} ({event[3]}) "
                      "before it finished: its work may have overlapped another's")
        elif kind == "timeout":
            stats["timeouts"] += 1
            if event[3] is not None:
                self.store_errors[index] = event[3]
        else:
            stats["status"] = "error"
            self.errors.append(f"worker {index}: {event[2]}")

    def _hold(self, index: int, customer: str, acquired: float, wait_ms: float, contended: bool) -> None:
        """Worker ``index`` acquired ``customer``'s lease at ``acquired``; the first acquisition of the
        killed holder's customer after the kill is the takeover, said as it happens."""
        stats = self.stats[index]
        stats["acquisitions"] += 1
        stats["wait_ms"] += wait_ms
        stats["contended"] += contended
        self.holders[customer] = index
        killed = self.killed
        if killed is not None and killed["customer"] == customer and "takeover_s" not in killed:
            killed["takeover_s"] = acquired - killed["at"]
            # The killed holder's last known validity end: a safe takeover comes after it.
            killed["valid_after_kill_s"] = self.valid_until.get((killed["worker"], customer), 0.0) - killed["at"]
            killed["taken_by"] = index
            self._say(f"[{acquired - self._start_at:5.1f}s] worker {index} took over {customer} "
                      f"{killed['takeover_s']:.2f} s after worker {killed['worker']} was killed, "
                      f"{_after_last_renewal()}")


def _never_acquired(stats: list[dict[str, Any]], store_errors: dict[int, str], seconds: float) -> list[str]:
    """Mark the workers that held no lease in the whole run; the errors to report for them. Under heavy
    contention (many workers, a short run) a worker may lose every turn, and that is no error; a
    worker whose waits ended on store errors, or a run in which nobody acquired, is."""
    errors = []
    for index, row in enumerate(stats):
        if row["acquisitions"] == 0 and row["status"] == "ok":
            row["status"] = "never acquired"
            if index in store_errors:
                errors.append(f"worker {index} never acquired a lease: the store failed its requests "
                              f"(last error: {store_errors[index]})")
    if not errors and not any(row["acquisitions"] for row in stats):
        errors.append(f"no worker acquired a lease in {seconds:g} s")
    return errors


def _kill_a_holder(holders: dict[str, Any], runners: list[Any], crashes: list[Optional[threading.Event]],
                   now: float, start_at: float, say: Callable[[str], None]) -> Optional[dict[str, Any]]:
    for customer, index in holders.items():
        if not isinstance(index, int) or not _alive(runners[index]):
            continue
        crash = crashes[index]
        if crash is not None:
            crash.set()
            how = "simulated: its renewals stop, its row stays"
        else:
            os.kill(runners[index].pid, signal.SIGKILL)
            how = "SIGKILL"
        holders[customer] = f"w{index} (killed)"
        say(f"[{now - start_at:5.1f}s] killed worker {index} ({how}) while it held {customer}")
        return {"worker": index, "customer": customer, "at": now}
    return None  # nobody holds a lease right now: try again at the next event


def _label(holder: Any) -> str:
    return "free" if holder is None else f"w{holder}" if isinstance(holder, int) else str(holder)


def _alive(runner: Any) -> bool:
    return bool(runner.is_alive())


def _stop(runner: Any) -> None:
    """Join a worker (bounded); a process still running is SIGKILLed by its PID."""
    runner.join(WAIT_S + 10.0)
    if isinstance(runner, threading.Thread):
        return
    if runner.is_alive():
        os.kill(runner.pid, signal.SIGKILL)
        runner.join(10.0)


def _print_table(summary: dict[str, Any], say: Callable[[str], None]) -> None:
    say("")
    say("worker  acquisitions  contended  wait ms  renewals  timeouts  status")
    for index, row in enumerate(summary["workers"]):
        say(f"{index:>6}  {row['acquisitions']:>12}  {row['contended']:>9}  {row['wait_ms']:>7.0f}  "
            f"{row['renewals']:>8}  {row['timeouts']:>8}  {row['status']}")
    width = max(len(name) for name, _ in COLUMNS)
    for name, meaning in COLUMNS:
        say(f"  {name:<{width}}  {meaning}")
    say("")
    killed = summary["killed"]
    if killed is None:
        say("no worker held a lease at halftime, so none was killed")
    elif "takeover_s" in killed:
        say(f"takeover: worker {killed['taken_by']} took {killed['customer']} over {killed['takeover_s']:.2f} s "
            f"after worker {killed['worker']} was killed,")
        say(f"  {_after_last_renewal()}: a holder renews every {LEASE_S / 3:.2f} s, so a takeover can come "
            f"{LEASE_S * 2 / 3:.2f} s after the kill, or sooner when its renewals ran late")
        if "valid_after_kill_s" in killed:
            after = killed["takeover_s"] > killed["valid_after_kill_s"]
            say(f"  the killed holder's lease was valid until {killed['valid_after_kill_s']:+.2f} s from the kill "
                f"(its last report), and the takeover came {'after that' if after else 'BEFORE that: two holders'}")
    else:
        say(f"worker {killed['worker']} was killed holding {killed['customer']}; nobody asked for it again in time")
    lost = sum(row.get("lost", 0) for row in summary["workers"])
    if lost:
        say(f"{lost} lease(s) lost before the work ended: renewals did not keep up (an overloaded machine?)")
    for error in summary["errors"]:
        say(f"error: {error}")
