"""The PostgreSQL store: uncontended cycles against a bare advisory lock, and handoff between processes.

Side by side in one run, on one PostgreSQL server (a throwaway one started here, or ``--dsn``):
  * uncontended acquire+release cycles, ``SyncDistributedLock`` on ``PostgresClient`` with fastlease's
    compiled engine (c) and the same engine interpreted (py), and the usual Postgres-native lock as the
    reference point: ``pg_try_advisory_lock($1)`` then ``pg_advisory_unlock($1)`` on one psycopg
    connection in autocommit mode. Interleaved rounds (machine noise of ±25% then hits every contender
    alike). Reported: median and best cycles/s, wall time per cycle, client CPU per cycle
    (``time.process_time`` over the loop: every thread of this process, fastlease's own included) and,
    apart, read from /proc (in clock ticks, 10 ms on Linux: a round of 3000 cycles resolves about 3 us
    per cycle), the CPU of each fastlease client's renewal process (another process) and, when the
    server runs on this machine, of the server processes serving the contender's connections;
  * round trips per cycle, counted in a separate, untimed pass with libpq's protocol trace on every
    connection of this process: each ReadyForQuery message the server sends ends one request that the
    client waited for (neither fastlease nor psycopg here uses pipeline mode), so their number is the
    number of round trips, whatever the library sent (a prepare, a timeout setting) and wherever;
  * 4 processes on one key, 5 ms critical section (``bench/handoff.py``'s workload and report): fastlease
    (waiters in the key's line of waiters, each release waking the next alone), the advisory lock taken
    blocking (``pg_advisory_lock``), each process on its own connection, and fastlease again on the same
    table with its line dropped (as a table made before the line: every release wakes every waiter).

With ``--dsn``, the lock tables ``fastlease_bench_cycle`` and ``handoff_locks`` are created there if
missing (and kept), and the advisory keys are two fixed bigints (``ADVISORY_KEY`` here and in handoff.py).

Run: ``.venv/bin/python bench/postgres_cycle.py [--cycles N] [--rounds R] [--seconds S] [--workers W]
[--dsn DSN]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Optional

import handoff
import psycopg
from psycopg import pq

from fastlease import SyncDistributedLock, _impl
from fastlease.postgres import PostgresClient
from fastlease.stores.postgres.sql import line_table
from fastlease.testing.postgres_server import PostgresServer

compiled = _impl.load("c")  # built by make test; missing, the script fails (never falls back)
interpreted = _impl.load("py")

TABLE = "fastlease_bench_cycle"
ADVISORY_KEY = 0x666C_6379_636C  # one bigint key for the uncontended advisory cycle
ADVISORY = "advisory lock"
COUNTED_CYCLES = 200
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class Contender:
    """One row: a cycle, the connections it talks on (for the round-trip count) and its renewal process."""

    def __init__(self, cycle: Callable[[], None], connections: Callable[[], list[Any]],
                 renewer: Callable[[], Optional[int]]) -> None:
        self.cycle, self.connections, self.renewer = cycle, connections, renewer
        self.rates: list[float] = []
        self.cpu_us: list[float] = []
        self.renewer_cpu_us: list[float] = []
        self.server_cpu_us: list[float] = []
        self.round_trips = float("nan")


def fastlease_contender(client: PostgresClient, key: str) -> Contender:
    def cycle() -> None:
        with SyncDistributedLock(client, table=TABLE, key=key):
            pass

    def connections() -> list[Any]:
        return [session.connection for session in client.store._idle]

    def renewer() -> Optional[int]:
        link = client.engine.link
        return None if link is None else link.pid

    return Contender(cycle, connections, renewer)


def advisory_contender(connection: psycopg.Connection[Any]) -> Contender:
    def cycle() -> None:
        if not connection.execute("SELECT pg_try_advisory_lock(%s)", (ADVISORY_KEY,)).fetchone()[0]:  # type: ignore[index]
            raise RuntimeError(f"advisory key {ADVISORY_KEY} is held elsewhere")
        connection.execute("SELECT pg_advisory_unlock(%s)", (ADVISORY_KEY,))

    return Contender(cycle, lambda: [connection], lambda: None)


def cpu_seconds_of(pid: Optional[int]) -> float:
    """User + system CPU of another process so far (0 if there is none)."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime (fields 14 and 15)


def server_processes(contender: Contender) -> list[Optional[int]]:
    """The PIDs of the server processes (backends) serving the contender's connections, when the server
    runs on this machine (their /proc entries are postgres processes); else []."""
    pids: list[Optional[int]] = [connection.info.backend_pid for connection in contender.connections()]
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm") as comm:
                if comm.read().strip() != "postgres":
                    return []
        except OSError:
            return []
    return pids


def measure(contender: Contender, count: int) -> None:
    renewer = contender.renewer()
    other = cpu_seconds_of(renewer)
    backends = server_processes(contender)
    server = sum(cpu_seconds_of(pid) for pid in backends)
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(count):
        contender.cycle()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    contender.rates.append(count / wall)
    contender.cpu_us.append(cpu / count * 1e6)
    contender.renewer_cpu_us.append((cpu_seconds_of(renewer) - other) / count * 1e6)
    if backends and server_processes(contender) == backends:  # the same backends served the whole loop
        contender.server_cpu_us.append((sum(cpu_seconds_of(pid) for pid in backends) - server) / count * 1e6)


def count_round_trips(name: str, contender: Contender) -> None:
    """COUNTED_CYCLES cycles under libpq's protocol trace (a file per connection, each flushed when its
    trace stops); round trips = the ReadyForQuery messages received, per cycle."""
    connections = contender.connections()
    with contextlib.ExitStack() as stack:
        traces = [stack.enter_context(tempfile.TemporaryFile("w+")) for _ in connections]
        for connection, trace in zip(connections, traces):
            connection.pgconn.trace(trace.fileno())
            connection.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            for _ in range(COUNTED_CYCLES):
                contender.cycle()
        finally:
            for connection in connections:
                connection.pgconn.untrace()  # flushes libpq's buffer of that trace
        found = 0
        for trace in traces:
            trace.seek(0)
            found += sum(1 for line in trace if line.startswith("B\t") and "\tReadyForQuery" in line)
    if {id(c) for c in contender.connections()} != {id(c) for c in connections}:  # a new one was untraced
        print(f"  ({name}: a connection was opened during the count; its round trips are missing)")
    contender.round_trips = found / COUNTED_CYCLES


def server_version(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as connection:
        return str(connection.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]


def run(dsn: str, args: argparse.Namespace) -> None:
    print(f"# postgres_cycle: {args.rounds} interleaved rounds x {args.cycles} cycles, PostgreSQL "
          f"{server_version(dsn)}, psycopg {psycopg.__version__} ({pq.__impl__}, libpq {pq.version()}), Python "
          f"{platform.python_version()}, {platform.machine()}, {time.strftime('%Y-%m-%d')}")
    fastlease_c = PostgresClient(dsn, _engine_module=compiled)
    fastlease_py = PostgresClient(dsn, _engine_module=interpreted)
    plain = psycopg.connect(dsn, autocommit=True)
    try:
        fastlease_c.create_lock_table(TABLE)
        fastlease_c.create_lock_table(handoff.TABLE)
        contenders = {
            "fastlease, c": fastlease_contender(fastlease_c, "cycle-c"),
            "fastlease, py": fastlease_contender(fastlease_py, "cycle-py"),
            ADVISORY: advisory_contender(plain),
        }
        for contender in contenders.values():
            measure(contender, 200)  # warm-up: connections, prepared statements, renewal processes
            contender.rates.clear()
            contender.cpu_us.clear()
            contender.renewer_cpu_us.clear()
            contender.server_cpu_us.clear()
        for _ in range(args.rounds):
            for contender in contenders.values():
                measure(contender, args.cycles)
        for name, contender in contenders.items():
            count_round_trips(name, contender)
    finally:
        fastlease_c.close()
        fastlease_py.close()
        plain.close()
    print("uncontended acquire+release")
    print(f"{'lock':<16}{'median cycles/s':>16}{'best cycles/s':>15}{'us/cycle':>10}{'CPU us/cycle':>14}"
          f"{'server CPU us':>15}{'renewer CPU us':>16}{'round trips':>13}")
    for name, contender in contenders.items():
        median = statistics.median(contender.rates)
        renewer = "n/a" if name == ADVISORY else f"{statistics.median(contender.renewer_cpu_us):.1f}"
        server = f"{statistics.median(contender.server_cpu_us):.1f}" if contender.server_cpu_us else "n/a"
        print(f"{name:<16}{median:>16,.0f}{max(contender.rates):>15,.0f}{1e6 / median:>10.1f}"
              f"{statistics.median(contender.cpu_us):>14.1f}{server:>15}{renewer:>16}"
              f"{contender.round_trips:>13.2f}")
    reference = contenders[ADVISORY]
    for name in ("fastlease, c", "fastlease, py"):
        ours = contenders[name]
        print(f"{name} against the advisory lock: "
              f"{statistics.median(ours.rates) / statistics.median(reference.rates):.2f}x cycles/s, "
              f"{statistics.median(ours.cpu_us) / statistics.median(reference.cpu_us):.2f}x its CPU, "
              f"{ours.round_trips / reference.round_trips:.2f}x its round trips")
    print()
    print(f"# handoff: {args.workers} processes, one key, {handoff.WORK_S * 1000:g} ms critical section, "
          f"{args.seconds:g} s each")
    print(f"{'setup':<{handoff.LABEL_WIDTH}}{'holds':>7}{'p50 ms':>10}{'p99 ms':>10}   {'share per worker':<23}"
          f"{'reads/acq':>11}{'reads/s wait':>14}")
    handoff.summarise("fastlease: PostgreSQL, the line",
                      handoff.processes_on("fastlease", dsn, args.seconds, args.workers))
    handoff.summarise("pg_advisory_lock: processes",
                      handoff.processes_on(handoff.ADVISORY, dsn, args.seconds, args.workers))
    # The same table without its line of waiters, as a table made before the line is used: every release
    # wakes every waiting process, and each looks (the store's fallback, logged once per process).
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f"DROP TABLE {line_table(handoff.TABLE)}")
    try:
        handoff.summarise("fastlease: PostgreSQL, no line",
                          handoff.processes_on("fastlease-lineless", dsn, args.seconds, args.workers))
    finally:
        restorer = PostgresClient(dsn)
        restorer.create_lock_table(handoff.TABLE)  # its line again (with --dsn, the table is kept)
        restorer.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=3_000, help="cycles per round (default 3000)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--seconds", type=float, default=10.0, help="each handoff run (default 10)")
    parser.add_argument("--workers", type=int, default=handoff.WORKERS,
                        help=f"processes in the handoff (default {handoff.WORKERS})")
    parser.add_argument("--dsn", help="run against this server (postgresql://...) instead of a throwaway one")
    args = parser.parse_args()
    if args.dsn:
        if not args.dsn.startswith("postgresql://"):
            parser.error(f"--dsn must be a postgresql:// URI (the handoff's workers take it), got {args.dsn!r}")
        run(args.dsn, args)
        return 0
    with PostgresServer() as server:
        run(server.dsn, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
