"""Leader election (``fastlease.election``): handover on resignation, failover after SIGKILL, and tooz.

Side by side in one run, on stores started here (a redis-server and a throwaway PostgreSQL, each on a
free 127.0.0.1 port and stopped by its PID; a SQLite file in a temporary directory):
  * resignation handover on Redis, PostgreSQL and SQLite: two candidate processes (spawn), one client
    each, alternate as leader on one key. The leader keeps its term HOLD_S (the other candidate is
    campaigning meanwhile), resigns, and campaigns again only once the other leads. Measured on
    ``time.monotonic()`` (CLOCK_MONOTONIC: one clock for every process of a Linux host), from just
    before the leader's ``resign()`` to the other's ``campaign()`` returning: p50 and p99 over
    ``--handovers`` handovers (WARMUP_HANDOVERS more run first, left out). The terms must increase.
    Gate: p50 <= 50 ms on Redis and PostgreSQL.
  * failover after SIGKILL on the same stores: a leader with lease L (``--lease``) idles in its term; a
    second candidate process campaigns for 1.5 L plus a random part of L (so that the kill falls
    anywhere in the leader's renewal period); the parent SIGKILLs the leader by its PID and measures
    from just before the kill to the candidate's election. That candidate is the next kill's leader
    (``--kills`` kills). Median, max, and the max's excess over L. Gate: max <= L + 0.2 s. The renewal
    process of every leader must exit by itself once its holder is gone (checked; one that does not
    is killed by its PID and reported).
  * tooz (OpenStack's coordination library, its Redis driver) on the same redis-server: the same
    failover, with the URL ``redis://127.0.0.1:<port>?timeout=L`` (L in whole seconds: the driver's
    member and leader-lock lease, and its socket timeout); ``start(start_heart=True)`` runs its heart
    thread, which renews both about every L/2. Each candidate creates (if need be) and joins the group,
    registers ``watch_elected_as_leader(group, callback)`` and calls ``run_watchers()`` (a non-blocking
    attempt on the leader lock) every ``--tooz-poll`` s: 0.125 s by default, the mean interval at which
    a waiting fastlease candidate reads the store.
  * the client CPU of an idle leader per second, over ``--idle`` s of leading after WARM_S:
    ``time.process_time()`` inside the leader process (every thread) and, apart, fastlease's renewal
    process (another process: a lease of 1 s or more is renewed from there) on its process CPU-time
    clock. tooz: with its heart thread only (the main thread sleeps), then also calling
    ``run_watchers()`` every poll, as the loop of a tooz application does. Without tooz installed, its
    rows are left out (and the run says so).

Run: ``.venv/bin/python bench/election.py [--handovers 50] [--lease 1.0] [--kills 5] [--idle 5]``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import multiprocessing
import os
import platform
import random
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from typing import Any, Optional
from urllib.parse import urlsplit

TABLE = "election_bench"
#: A leader's term in the handover test: long enough for the other candidate to be waiting in its campaign.
HOLD_S = 0.2
#: Handovers run first and left out: connections, prepared statements, subscriptions, renewal processes.
WARMUP_HANDOVERS = 2
HANDOVER_GATE_MS = 50.0
HANDOVER_GATED = ("Redis", "PostgreSQL")
FAILOVER_MARGIN_S = 0.2
#: How long a process may take to import and connect, and to answer the parent.
READY_TIMEOUT_S = 60.0
#: The longest any campaign, or any wait for the other candidate, may take.
CAMPAIGN_LIMIT_S = 60.0
#: The longest a leader process waits for the parent's next command before it resigns and exits.
IDLE_LIMIT_S = 600.0
#: Leading before the idle CPU is measured (the renewal process starts at the first lease).
WARM_S = 1.0
#: How long a renewal process may outlive its holder's death or close.
HELPER_EXIT_S = 5.0
LABEL_WIDTH = 44
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# ---- in the candidate processes ------------------------------------------------------------------
def make_client(endpoint: str) -> Any:
    """A fastlease client of the store at ``endpoint`` (sqlite:PATH, redis:// or postgresql://)."""
    if endpoint.startswith("sqlite:"):
        from fastlease import SQLiteClient

        return SQLiteClient(endpoint[len("sqlite:"):])
    if endpoint.startswith("redis://"):
        from fastlease.redis import RedisClient

        return RedisClient(endpoint)
    from fastlease.postgres import PostgresClient

    return PostgresClient(endpoint)


def proc_stat(pid: int) -> Optional[list[str]]:
    """The fields of /proc/<pid>/stat after the command name (the state first), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def cpu_seconds_of(pid: Optional[int]) -> float:
    """CPU of another process so far, every thread (0 without one): its process CPU-time clock (what
    glibc's clock_getcpuclockid returns, ``~pid << 3 | CPUCLOCK_SCHED``: nanoseconds), else the user +
    system time in /proc/<pid>/stat (clock ticks)."""
    if pid is None:
        return 0.0
    with contextlib.suppress(OSError):
        return time.clock_gettime((~pid << 3) | 2)
    fields = proc_stat(pid)
    return 0.0 if fields is None else (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def alive_as(pid: int, started: str) -> bool:
    """Whether ``pid`` still runs (not a zombie) and is the process that started at ``started`` (a
    recycled PID is another process, never to be signalled)."""
    fields = proc_stat(pid)
    return fields is not None and fields[0] != "Z" and fields[19] == started


class FastleaseCandidate:
    """A candidate on fastlease: its own client and ``Election``."""

    def __init__(self, endpoint: str, key: str, lease: float, poll: float) -> None:
        from fastlease.election import Election

        self.client = make_client(endpoint)
        self.election = Election(self.client, table=TABLE, key=key, lease_duration=lease,
                                 identity=f"bench-{os.getpid()}")
        self.term: Any = None

    def campaign(self) -> Optional[int]:
        self.term = self.election.campaign(wait_timeout=CAMPAIGN_LIMIT_S)
        return int(self.term.number)

    def helper(self, wait_s: float) -> Optional[tuple[int, str]]:
        """The client's renewal process, (PID, start time), once known (up to ``wait_s``); None without."""
        link = self.client.engine.link
        deadline = time.monotonic() + wait_s
        while link is not None:
            fields = proc_stat(link.pid) if link.pid else None
            if fields is not None:
                return link.pid, fields[19]
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.01)
        return None

    def idle(self, seconds: float, watching: bool) -> Optional[bool]:
        """Lead idly for ``seconds``; whether the term is still held then."""
        self.term.wait(seconds)
        return bool(self.term.is_valid())

    def close(self) -> None:
        try:
            if self.term is not None:
                self.term.resign()
        finally:
            self.client.close()


def tooz_url(endpoint: str, lease: float) -> str:
    """tooz's Redis driver URL for the redis-server at ``endpoint``: ``timeout`` is its lease (whole s)."""
    address = urlsplit(endpoint)
    return f"redis://{address.hostname}:{address.port}?timeout={int(lease)}"


class ToozCandidate:
    """A candidate on tooz: a coordinator with its heart thread, a member of the group it watches."""

    def __init__(self, endpoint: str, key: str, lease: float, poll: float) -> None:
        from tooz import coordination

        self.poll, self.group, self.elected = poll, key.encode(), threading.Event()
        self.coordinator = coordination.get_coordinator(tooz_url(endpoint, lease), f"bench-{os.getpid()}".encode())
        self.coordinator.start(start_heart=True)
        with contextlib.suppress(coordination.GroupAlreadyExist):
            self.coordinator.create_group(self.group).get(timeout=READY_TIMEOUT_S)
        self.coordinator.join_group(self.group).get(timeout=READY_TIMEOUT_S)
        self.coordinator.watch_elected_as_leader(self.group, lambda event: self.elected.set())

    def campaign(self) -> Optional[int]:
        deadline = time.monotonic() + CAMPAIGN_LIMIT_S
        while True:
            self.coordinator.run_watchers()
            if self.elected.is_set():
                return None  # tooz has no term number
            if time.monotonic() >= deadline:
                raise TimeoutError(f"tooz: not elected within {CAMPAIGN_LIMIT_S:g} s")
            time.sleep(self.poll)

    def helper(self, wait_s: float) -> Optional[tuple[int, str]]:
        return None  # no renewal process: the heart is a thread of this process

    def idle(self, seconds: float, watching: bool) -> Optional[bool]:
        """Lead idly for ``seconds``: the heart thread alone, or also ``run_watchers()`` every poll."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, self.poll) if watching else left)
            if watching:
                self.coordinator.run_watchers()
        return None  # the Redis driver has no get_leader to check it with

    def close(self) -> None:
        self.coordinator.stop()  # releases the leader lock, leaves the group, stops the heart


def measure_idle(candidate: Any, seconds: float, watching: bool) -> tuple[float, Optional[float], Optional[bool]]:
    """After WARM_S of leading: (this process's CPU per second, the renewal process's or None, held)."""
    time.sleep(WARM_S)
    helper = candidate.helper(WARM_S)
    pid = None if helper is None else helper[0]
    other, cpu, wall = cpu_seconds_of(pid), time.process_time(), time.monotonic()
    held = candidate.idle(seconds, watching)
    wall = time.monotonic() - wall
    renewer = None if pid is None else (cpu_seconds_of(pid) - other) / wall
    return (time.process_time() - cpu) / wall, renewer, held


def candidate_worker(library: str, endpoint: str, key: str, lease: float, poll: float, conn: Any) -> None:
    """One candidate process: campaign, report the election, then lead idly and obey the parent's
    commands, ``("cpu", seconds, watching)`` and ``("stop",)``, until stopped (or killed)."""
    candidate = None
    try:
        candidate = (ToozCandidate if library == "tooz" else FastleaseCandidate)(endpoint, key, lease, poll)
        conn.send(("campaigning",))
        term = candidate.campaign()
        elected_at = time.monotonic()
        conn.send(("elected", elected_at, term, candidate.helper(WARM_S)))
        while conn.poll(IDLE_LIMIT_S):
            command = conn.recv()
            if command[0] != "cpu":
                break
            conn.send(("cpu", *measure_idle(candidate, command[1], command[2])))
    except BaseException as error:  # reported by the parent, not lost with the process
        with contextlib.suppress(OSError):
            conn.send(("error", f"{type(error).__name__}: {error}"))
    finally:
        if candidate is not None:
            candidate.close()


def wait_for_count(count: Any, target: int) -> None:
    """Until the shared counter reaches ``target`` (bounded by CAMPAIGN_LIMIT_S)."""
    deadline = time.monotonic() + CAMPAIGN_LIMIT_S
    while count.value < target:
        if time.monotonic() >= deadline:
            raise TimeoutError(f"the other candidate was not elected within {CAMPAIGN_LIMIT_S:g} s")
        time.sleep(0.001)


def handover_worker(endpoint: str, index: int, lease: float, total: int, shared: tuple[Any, ...], conn: Any) -> None:
    """Candidate ``index`` (0 or 1) of the handover test. Candidate 0 is elected first; the other campaigns
    once it leads, and each ex-leader campaigns again once the other leads: so every resignation has a
    candidate waiting, and the resigner never races it. Election k writes ``elected_at[k]`` and
    ``terms[k]``, its resignation ``resigned_at[k]``; ``total`` handovers need total + 1 elections."""
    from fastlease.election import Election

    elections, elected_at, resigned_at, terms, go = shared
    client = make_client(endpoint)
    try:
        election = Election(client, table=TABLE, key="handover", lease_duration=lease, identity=f"candidate-{index}")
        conn.send(("ready",))
        if not go.wait(READY_TIMEOUT_S):
            raise TimeoutError("no start signal from the parent")
        wait_for_count(elections, index)
        while elections.value <= total:
            term = election.campaign(wait_timeout=CAMPAIGN_LIMIT_S)
            now = time.monotonic()
            k = elections.value
            elected_at[k], terms[k] = now, term.number
            elections.value = k + 1
            if k < total:
                time.sleep(HOLD_S)
                resigned_at[k] = time.monotonic()
            term.resign()
            if k == total:
                break
            wait_for_count(elections, k + 2)
        conn.send(("done",))
    except BaseException as error:
        with contextlib.suppress(OSError):
            conn.send(("error", f"{type(error).__name__}: {error}"))
    finally:
        client.close()


# ---- in the parent -------------------------------------------------------------------------------
class Child:
    """A spawned process and the parent's end of its pipe; stopped by its PID."""

    def __init__(self, context: Any, target: Any, args: tuple[Any, ...]) -> None:
        self.conn, child_end = context.Pipe()
        self.process = context.Process(target=target, args=(*args, child_end))
        self.process.start()
        child_end.close()  # so that the child's death is EOF here

    def expect(self, kind: str, timeout: float) -> tuple[Any, ...]:
        """The child's next message, which must be ``kind`` within ``timeout`` s (else an error)."""
        if not self.conn.poll(timeout):
            raise TimeoutError(f"no {kind!r} from process {self.process.pid} within {timeout:g} s")
        try:
            message = self.conn.recv()
        except EOFError:
            raise RuntimeError(f"process {self.process.pid} died before {kind!r}") from None
        if message[0] == "error":
            raise RuntimeError(message[1])
        if message[0] != kind:
            raise RuntimeError(f"expected {kind!r} from process {self.process.pid}, got {message!r:.200}")
        return tuple(message)

    def stop(self) -> None:
        """Ask it to stop (it resigns and closes its client), then SIGKILL it by its PID if it must."""
        with contextlib.suppress(OSError):
            self.conn.send(("stop",))
        self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
        self.conn.close()


def spawn_context() -> Any:
    return multiprocessing.get_context("spawn")


def check_helpers(helpers: list[tuple[int, str]], notes: list[str]) -> None:
    """Every renewal process recorded must exit by itself within HELPER_EXIT_S of its holder's death or
    close; one that does not is killed by its PID (if it is still that process) and noted."""
    deadline = time.monotonic() + HELPER_EXIT_S
    for pid, started in helpers:
        while alive_as(pid, started) and time.monotonic() < deadline:
            time.sleep(0.05)
        if alive_as(pid, started):
            os.kill(pid, signal.SIGKILL)
            notes.append(f"renewal process {pid} outlived its holder by {HELPER_EXIT_S:g} s: killed")
    helpers.clear()


def handover(endpoint: str, args: argparse.Namespace) -> tuple[list[float], bool]:
    """Two candidate processes alternating on one key: each handover's ms, and whether the terms increased."""
    context = spawn_context()
    total = args.handovers + WARMUP_HANDOVERS
    elections = context.RawValue("i", 0)
    elected_at, resigned_at = context.RawArray("d", total + 1), context.RawArray("d", total + 1)
    terms = context.RawArray("q", total + 1)
    shared = (elections, elected_at, resigned_at, terms, context.Event())
    children = [Child(context, handover_worker, (endpoint, index, args.lease, total, shared)) for index in (0, 1)]
    try:
        for child in children:
            child.expect("ready", READY_TIMEOUT_S)
        shared[-1].set()
        for child in children:
            child.expect("done", total * (HOLD_S + 5.0) + CAMPAIGN_LIMIT_S)
    finally:
        for child in children:
            child.stop()
    gaps = [(elected_at[k + 1] - resigned_at[k]) * 1000 for k in range(WARMUP_HANDOVERS, total)]
    return gaps, all(later > earlier for earlier, later in zip(terms, terms[1:]))


def record_helper(helpers: list[tuple[int, str]], elected: tuple[Any, ...]) -> None:
    if elected[3] is not None:
        helpers.append(tuple(elected[3]))  # type: ignore[arg-type]


def failover(library: str, endpoint: str, args: argparse.Namespace, helpers: list[tuple[int, str]]) -> list[float]:
    """A chain of leaders on one key, each SIGKILLed while the next campaigns: the seconds from each kill
    to the next one's election."""
    context = spawn_context()
    worker_args = (library, endpoint, f"failover-{library}", args.lease, args.tooz_poll)
    leader = Child(context, candidate_worker, worker_args)
    children, times = [leader], []
    try:
        leader.expect("campaigning", READY_TIMEOUT_S)
        record_helper(helpers, leader.expect("elected", CAMPAIGN_LIMIT_S))
        for _ in range(args.kills):
            candidate = Child(context, candidate_worker, worker_args)
            children.append(candidate)
            candidate.expect("campaigning", READY_TIMEOUT_S)
            time.sleep(1.5 * args.lease + random.uniform(0, args.lease))  # it watches the leader meanwhile
            killed_at = time.monotonic()
            os.kill(leader.process.pid, signal.SIGKILL)
            elected = candidate.expect("elected", args.lease + CAMPAIGN_LIMIT_S)
            times.append(elected[1] - killed_at)
            record_helper(helpers, elected)
            leader.process.join(5)
            leader = candidate
        return times
    finally:
        for child in children:
            child.stop()


def idle_cpu(library: str, endpoint: str, args: argparse.Namespace,
             helpers: list[tuple[int, str]]) -> list[tuple[Any, ...]]:
    """One leader process, idle: (CPU/s in it, its renewal process's CPU/s or None, held) per variant
    (tooz: heart only, then heart and run_watchers every poll)."""
    worker_args = (library, endpoint, f"idle-{library}", args.lease, args.tooz_poll)
    leader = Child(spawn_context(), candidate_worker, worker_args)
    try:
        leader.expect("campaigning", READY_TIMEOUT_S)
        record_helper(helpers, leader.expect("elected", CAMPAIGN_LIMIT_S))
        rows = []
        for watching in ((False, True) if library == "tooz" else (False,)):
            leader.conn.send(("cpu", args.idle, watching))
            rows.append(leader.expect("cpu", args.idle + 2 * WARM_S + READY_TIMEOUT_S)[1:])
        return rows
    finally:
        leader.stop()


# ---- the report ----------------------------------------------------------------------------------
def percentile(values: list[float], fraction: float) -> float:
    return sorted(values)[min(len(values) - 1, int(len(values) * fraction))] if values else float("nan")


def handover_section(stores: dict[str, str], args: argparse.Namespace) -> None:
    print(f"# resignation handover: 2 candidate processes, one key, {HOLD_S:g} s terms, lease {args.lease:g} s, "
          f"{args.handovers} handovers ({WARMUP_HANDOVERS} more first, left out)")
    print(f"{'setup':<{LABEL_WIDTH}}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}  {'terms increase':<16}"
          f"gate: p50 <= {HANDOVER_GATE_MS:g} ms")
    for store, endpoint in stores.items():
        label = f"fastlease, {store}"
        try:
            gaps, increasing = handover(endpoint, args)
        except Exception as error:
            print(f"{label:<{LABEL_WIDTH}}(failed: {error})")
            continue
        p50 = statistics.median(gaps)
        gate = ("PASS" if p50 <= HANDOVER_GATE_MS else "FAIL") if store in HANDOVER_GATED else "n/a"
        print(f"{label:<{LABEL_WIDTH}}{p50:>9.1f}{percentile(gaps, 0.99):>9.1f}{max(gaps):>9.1f}  "
              f"{'yes' if increasing else 'NO':<16}{gate}")


def failover_row(label: str, times: list[float], lease: float, gated: bool) -> None:
    worst = max(times)
    gate = ("PASS" if worst <= lease + FAILOVER_MARGIN_S else "FAIL") if gated else "n/a"
    print(f"{label:<{LABEL_WIDTH}}{len(times):>6}{statistics.median(times):>10.3f}{min(times):>8.3f}"
          f"{worst:>8.3f}{worst - lease:>+11.3f}  {gate}")


def failover_section(stores: dict[str, str], args: argparse.Namespace, tooz: Optional[str], notes: list[str]) -> None:
    print(f"# failover after SIGKILL of the leader: lease L = {args.lease:g} s, {args.kills} kills per setup; "
          f"from the kill to the candidate's election")
    print(f"{'setup':<{LABEL_WIDTH}}{'kills':>6}{'median s':>10}{'min s':>8}{'max s':>8}{'max - L s':>11}  "
          f"gate: max <= L + {FAILOVER_MARGIN_S:g} s")
    results: dict[str, list[float]] = {}
    setups = [("fastlease", store, endpoint) for store, endpoint in stores.items()]
    if tooz is not None and "Redis" in stores:
        setups.append(("tooz", "Redis", stores["Redis"]))
    helpers: list[tuple[int, str]] = []
    for library, store, endpoint in setups:
        label = (f"fastlease, {store}" if library == "fastlease" else
                 f"tooz {tooz}, Redis, timeout={int(args.lease)}, poll {args.tooz_poll:g} s")
        try:
            results[library + store] = failover(library, endpoint, args, helpers)
        except Exception as error:
            print(f"{label:<{LABEL_WIDTH}}(failed: {error})")
            continue
        finally:
            check_helpers(helpers, notes)
        failover_row(label, results[library + store], args.lease, library == "fastlease")
    ours, theirs = results.get("fastlease" + "Redis"), results.get("tooz" + "Redis")
    if ours and theirs:
        print(f"tooz / fastlease on Redis: median {statistics.median(theirs) / statistics.median(ours):.2f}x, "
              f"max {max(theirs) / max(ours):.2f}x")


def idle_section(stores: dict[str, str], args: argparse.Namespace, tooz: Optional[str], notes: list[str]) -> None:
    print(f"# idle leader: client CPU per second of leading, over {args.idle:g} s after {WARM_S:g} s, "
          f"lease {args.lease:g} s")
    print(f"{'setup':<{LABEL_WIDTH}}{'process ms/s':>13}{'renewal proc ms/s':>19}{'total ms/s':>12}  held")
    setups = [("fastlease", store, endpoint, [f"fastlease, {store}"]) for store, endpoint in stores.items()]
    if tooz is not None and "Redis" in stores:
        setups.append(("tooz", "Redis", stores["Redis"], [f"tooz {tooz}, Redis, heart thread only",
                                                          f"tooz, heart + run_watchers every {args.tooz_poll:g} s"]))
    totals: dict[str, tuple[float, float]] = {}  # label -> (leader process, total), per second
    helpers: list[tuple[int, str]] = []
    for library, store, endpoint, labels in setups:
        try:
            rows = idle_cpu(library, endpoint, args, helpers)
        except Exception as error:
            print(f"{labels[0]:<{LABEL_WIDTH}}(failed: {error})")
            continue
        finally:
            check_helpers(helpers, notes)
        for label, (own, renewer, held) in zip(labels, rows):
            total = own + (renewer or 0.0)
            totals.setdefault(library + store, (own, total))
            totals[label] = (own, total)
            renewal = "n/a" if renewer is None else f"{renewer * 1000:.2f}"
            print(f"{label:<{LABEL_WIDTH}}{own * 1000:>13.2f}{renewal:>19}{total * 1000:>12.2f}  "
                  f"{'n/a' if held is None else ('yes' if held else 'NO')}")
    ours = totals.get("fastlease" + "Redis")
    if ours is not None and ours[0] > 0 and tooz is not None:
        for label in setups[-1][3]:
            if label in totals:
                print(f"{label} / fastlease, Redis: {totals[label][1] / ours[1]:.2f}x its total CPU, "
                      f"{totals[label][1] / ours[0]:.2f}x its leader process's alone")


# ---- the run -------------------------------------------------------------------------------------
def tooz_version(lease: float) -> tuple[Optional[str], Optional[str]]:
    """(tooz's version, None) when its rows can run, else (None, why not)."""
    try:
        version = importlib.metadata.version("tooz")
    except importlib.metadata.PackageNotFoundError:
        return None, "tooz is not installed (.venv/bin/pip install tooz): its rows are left out"
    if lease != int(lease) or lease < 1:
        return None, f"tooz's Redis driver takes its timeout in whole seconds, and --lease is {lease:g}: no tooz rows"
    return version, None


def server_versions(stores: dict[str, str]) -> list[str]:
    found = []
    if "Redis" in stores:
        import redis

        client = redis.Redis.from_url(stores["Redis"])
        found.append(f"redis-server {client.info('server')['redis_version']}")
        client.close()
    if "PostgreSQL" in stores:
        import psycopg

        with psycopg.connect(stores["PostgreSQL"], autocommit=True) as connection:
            found.append(f"PostgreSQL {connection.execute('SHOW server_version').fetchone()[0]}")  # type: ignore[index]
    return found


def start_stores(stack: contextlib.ExitStack, directory: str, notes: list[str]) -> dict[str, str]:
    """The stores of the run: each server started here (and stopped by the stack); one that cannot start
    is noted and left out."""
    from fastlease.testing.postgres_server import PostgresServer, PostgresServerUnavailable
    from fastlease.testing.redis_server import RedisServer, RedisServerUnavailable

    stores: dict[str, str] = {}
    try:
        stores["Redis"] = stack.enter_context(RedisServer()).url
    except RedisServerUnavailable as error:
        notes.append(f"no Redis rows: {error}")
    try:
        stores["PostgreSQL"] = stack.enter_context(PostgresServer()).dsn
        client = make_client(stores["PostgreSQL"])
        try:
            client.create_lock_table(TABLE)
        finally:
            client.close()
    except PostgresServerUnavailable as error:
        notes.append(f"no PostgreSQL rows: {error}")
    stores["SQLite"] = "sqlite:" + os.path.join(directory, "election.db")
    return stores


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--handovers", type=int, default=50, help="handovers per store (default 50)")
    parser.add_argument("--lease", type=float, default=1.0, help="the term's lease L, seconds (default 1.0)")
    parser.add_argument("--kills", type=int, default=5, help="SIGKILLed leaders per setup (default 5)")
    parser.add_argument("--idle", type=float, default=5.0, help="seconds of idle leading measured (default 5)")
    parser.add_argument("--tooz-poll", type=float, default=0.125,
                        help="seconds between a tooz candidate's run_watchers() calls (default 0.125)")
    args = parser.parse_args()
    if args.handovers < 1 or args.kills < 1 or args.idle <= 0 or not 0.01 <= args.tooz_poll <= 10:
        parser.error("--handovers and --kills must be >= 1, --idle > 0, --tooz-poll in 0.01..10")
    if not 0.5 <= args.lease <= 30:
        parser.error(f"--lease must be 0.5..30 seconds, got {args.lease:g}")
    from fastlease import _impl

    tooz, why_not = tooz_version(args.lease)
    notes: list[str] = [] if why_not is None else [why_not]
    directory = tempfile.mkdtemp(prefix="fastlease-election-")
    try:
        with contextlib.ExitStack() as stack:
            stores = start_stores(stack, directory, notes)
            print(f"# election: Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs, "
                  f"fastlease engine {_impl.core.IMPLEMENTATION}, {', '.join(server_versions(stores))}, "
                  f"tooz {tooz or 'n/a'}, {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC", flush=True)
            for note in notes:
                print(f"  ({note})")
            notes.clear()
            handover_section(stores, args)
            print()
            failover_section(stores, args, tooz, notes)
            print()
            idle_section(stores, args, tooz, notes)
            for note in notes:
                print(f"  ({note})")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
