"""The renewal process's memory, as a gate: at most 18 MiB of VmRSS on SQLite, Redis, a Redis Cluster and
DynamoDB, and one renewal process for a holder process with three clients on two stores.

For each store, a fresh holder process (this script with ``--child``) takes one 1 s lease with
``renewal="auto"``, waits (bounded) until the renewal process has reported a renewal, and reads that
process's VmRSS from ``/proc/<pid>/status`` at that moment and 2 s later. The stores are real: a
temporary SQLite file, a redis-server, a three-node Redis Cluster and a serialised moto server
(``fastlease.testing``). Then one
holder makes three clients, two on one SQLite file and one on Redis, holds a lease on each until each
has a renewal reported, and counts the renewal processes: the distinct ``RenewalLink.pid`` of its
clients, and the processes running ``fastlease._renewal_process`` on the machine, before and during.

It prints one row per store and the three-client check, then ``gate: pass`` (exit 0) or each limit
that was exceeded (exit 1). Run: ``.venv/bin/python bench/renewal_memory.py`` (about 20 s).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from datetime import datetime, timezone
from typing import Any, Optional

from renewal_under_load import TABLE, fastlease_client, proc_status, run_child, start_stores

LIMIT_KIB = 18 * 1024
STORES = ("sqlite", "redis", "redis-cluster", "dynamodb")
REPORT_WAIT_S = 5.0


def renewal_processes() -> set[int]:
    """The pids of processes on this machine running ``python -m fastlease._renewal_process``."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                if b"fastlease._renewal_process" in cmdline.read():
                    found.add(int(entry))
        except OSError:
            continue
    return found


def held_until_reported(guards: list[Any]) -> None:
    """Wait (at most REPORT_WAIT_S) until every guard has a renewal reported by the renewal process."""
    deadline = time.monotonic() + REPORT_WAIT_S
    while not all(guard.metrics.renewals for guard in guards):  # metrics applies the reports
        if time.monotonic() > deadline:
            raise RuntimeError(f"no renewal reported within {REPORT_WAIT_S:g} s")
        time.sleep(0.005)


def one_store(spec: dict[str, Any]) -> dict[str, Any]:
    """A holder of one lease on one store: the renewal process's VmRSS at its first report and 2 s on."""
    from fastlease import SyncDistributedLock

    client = fastlease_client(spec, "auto")
    try:
        with SyncDistributedLock(client, table=TABLE, key="memory", lease_duration=1.0, wait_timeout=5) as guard:
            held_until_reported([guard])
            pid = client.engine.link.pid
            first = proc_status(pid, "VmRSS")
            time.sleep(2.0)
            return {"pid": pid, "rss_first_kib": first, "rss_later_kib": proc_status(pid, "VmRSS"),
                    "renewals": guard.metrics.renewals}
    finally:
        client.close()


def three_clients(spec: dict[str, Any]) -> dict[str, Any]:
    """A holder with three clients on two stores (SQLite twice, Redis): how many renewal processes."""
    from fastlease import SQLiteClient, SyncDistributedLock
    from fastlease.redis import RedisClient

    before = renewal_processes()
    clients = [SQLiteClient(spec["sqlite"]), SQLiteClient(spec["sqlite"]), RedisClient(spec["redis"])]
    try:
        guards = [SyncDistributedLock(client, table=TABLE, key=f"three-{index}", lease_duration=1.0,
                                      wait_timeout=5).acquire() for index, client in enumerate(clients)]
        try:
            held_until_reported(guards)
            pids = sorted({client.engine.link.pid for client in clients})
            started = sorted(renewal_processes() - before)
        finally:
            for guard in guards:
                guard.release()
    finally:
        for client in clients:
            client.close()
    return {"link_pids": pids, "started": started}


def mib(kib: Optional[int]) -> str:
    return "n/a" if kib is None else f"{kib / 1024:.1f} MiB"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        spec = json.loads(args.child)
        print(json.dumps(three_clients(spec) if spec.get("check") == "three" else one_store(spec)), flush=True)
        return 0
    notes: list[str] = []
    stack: list[Any] = []
    failures: list[str] = []
    try:
        endpoints = start_stores(list(STORES), notes, stack)
        missing = [store for store in STORES if store not in endpoints]
        if missing:
            failures.append(f"could not start {', '.join(missing)}: {'; '.join(notes)}")
        print(f"# the renewal process's VmRSS, Python {platform.python_version()}, "
              f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; gate: at most {LIMIT_KIB // 1024} MiB")
        print(f"{'store':<14}{'RSS at 1st report':>20}{'RSS 2 s later':>16}{'renewals':>10}")
        for store in STORES:
            if store not in endpoints:
                continue
            row = run_child({"store": store, "library": "fastlease", "endpoint": endpoints[store]}, __file__)
            if "error" in row:
                failures.append(f"{store}: {row['error']}")
                print(f"{store:<14}{'error':>20}")
                continue
            print(f"{store:<14}{mib(row['rss_first_kib']):>20}{mib(row['rss_later_kib']):>16}{row['renewals']:>10}")
            worst = max(row["rss_first_kib"] or 0, row["rss_later_kib"] or 0)
            if not row["rss_first_kib"] or worst > LIMIT_KIB:
                failures.append(f"{store}: the renewal process used {mib(worst)} (limit {LIMIT_KIB // 1024} MiB)")
        if "sqlite" in endpoints and "redis" in endpoints:
            with tempfile.TemporaryDirectory(prefix="fastlease-memory-") as directory:
                row = run_child({"check": "three", "sqlite": os.path.join(directory, "three.db"),
                                 "redis": endpoints["redis"]}, __file__)
            if "error" in row:
                failures.append(f"three clients: {row['error']}")
            else:
                print(f"three clients on two stores (SQLite x2, Redis): renewal process pids seen by the clients "
                      f"{row['link_pids']}, renewal processes started {len(row['started'])}")
                if len(row["link_pids"]) != 1 or len(row["started"]) != 1:
                    failures.append(f"three clients: {len(row['started'])} renewal processes, not 1")
    finally:
        for stop in reversed(stack):
            stop()
    for failure in failures:
        print(f"gate: FAIL {failure}")
    if not failures:
        print("gate: pass")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
