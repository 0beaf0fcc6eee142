"""Does a held 1 s lease survive a busy holder? fastlease (renewal process and renewal thread) and
pydynox 1.8.0, side by side, on real stores: DynamoDB (one serialised moto server process), Redis (a
redis-server) and SQLite (a temporary file).

Each holder is a child process of its own (a fresh interpreter: this script with ``--child``) that
takes a 1 s lease and is then busy for 4 s in one of three ways:

  python loop  a pure-Python loop: the interpreter drops the GIL every switch interval (5 ms);
  sleep        ``time.sleep(4)``: the GIL is free;
  C call       one ``sum(range(n))``, n calibrated in the child (before the lease) to ~4 s: the GIL
               is held until it returns, so no Python thread of the holder runs meanwhile.

Libraries: ``fastlease auto`` (the default, ``renewal="auto"``: a 1 s lease is renewed by the client's
renewal process, paced by the native pulse thread), ``fastlease thread`` (``renewal="thread"``: the
old in-process renewal thread) and, on DynamoDB only, pydynox's ``SyncDistributedLock`` (renews from
a Rust thread). After the busy period the holder reports:

  held      ``raise_if_lost()`` passed (both libraries: a local check of the lease's validity);
  renewals  the library's own counter: fastlease ``guard.metrics.renewals``, pydynox
            ``LockMetrics.renewals`` (its lock's ``metrics``); about 12 are due in 4 s (every lease/3);
  busy s    how long the busy period really took;
  release   the release's outcome: ``ok``, or the exception it raised. No contender runs here, so a
            lapsed lease's row is still ours on DynamoDB and SQLite (``ok`` even where held is no);
            Redis expires the key itself (PX), so there a lapsed lease's release is ``LockLost``.

The renewal process's cost, per store, from a separate probe child (``fastlease auto``, not busy):
from ``RenewalLink.started_at`` (the monotonic time the holder started it, at its first lease) to
its pid being known, to its main thread waiting in its select loop (``/proc/<pid>/syscall``: the
start-up is done) and to the holder applying its first renewal report (the first renewal is due
lease/3 after the acquisition, so this is at least ~333 ms whatever the start-up costs); its CPU
time by then (``/proc/<pid>/stat``, 10 ms ticks), its VmRSS at the first report and 2 s later, and
the holder's own VmRSS for scale (``/proc/<pid>/status``).

Scheduling (a 2-core machine): a busy holder occupies a whole core in the python-loop and C-call
cases, and the renewal processes, the moto server and redis-server need the other one. So at most
one CPU-bound holder runs at a time: each (store, library)'s sleep child runs alongside its
python-loop child (it only sleeps), then the C-call child runs alone, with its calibration done on
a quiet machine; the probes run alone. Two CPU-bound holders at once would take both cores and a
lost lease would then measure the scheduler, not the library. The whole run takes about 75 s.
Run: ``.venv/bin/python bench/renewal_under_load.py [--stores dynamodb,redis,sqlite]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Optional

LEASE_S = 1.0
BUSY_S = 4.0
KINDS = ("python loop", "sleep", "C call")
STORES = ("dynamodb", "redis", "sqlite")
TABLE = "renewal_locks"
CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": "us-east-1"}
CHILD_TIMEOUT_S = 60.0
#: pselect6 and select on x86_64, select on aarch64 (pselect6 is 72 there): the renewal process's loop.
SELECT_SYSCALLS = {"270", "23", "72"}


# ---- the holder (a child process) -------------------------------------------------------------------
def calibrate_sum(seconds: float) -> int:
    """n such that ``sum(range(n))`` takes about ``seconds`` here (one C call: the GIL stays held).
    A fresh process runs its first sums up to ~1.6x slower (clock ramp-up, cold caches), which made a
    single sample undershoot by up to 25%: so 0.3 s of warm-up, then the fastest of three samples."""
    n = 1_000_000
    deadline = time.perf_counter() + 0.3
    while time.perf_counter() < deadline:
        sum(range(n))
    samples = []
    for _ in range(3):
        start = time.perf_counter()
        sum(range(10 * n))
        samples.append(time.perf_counter() - start)
    return int(10 * n * seconds / min(samples))


def busy(kind: str, seconds: float, sum_n: int) -> None:
    if kind == "python loop":
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            pass
    elif kind == "sleep":
        time.sleep(seconds)
    else:
        sum(range(sum_n))


def proc_status(pid: Optional[int], field: str) -> Optional[int]:
    """A ``/proc/<pid>/status`` size field (VmRSS, VmHWM) in KiB, or None."""
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def proc_cpu_ms(pid: int) -> Optional[float]:
    """User + system CPU time of ``pid`` so far, in ms (``/proc/<pid>/stat``), or None."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def in_select(pid: int) -> Optional[bool]:
    """Whether ``pid``'s main thread is blocked in select now; None if /proc does not say."""
    try:
        with open(f"/proc/{pid}/syscall") as syscall:
            return syscall.read().split(" ", 1)[0] in SELECT_SYSCALLS
    except OSError:
        return None


def fastlease_client(spec: dict[str, Any], renewal: str) -> Any:
    if spec["store"] == "dynamodb":
        import boto3

        from fastlease.dynamodb import DynamoDBClient

        return DynamoDBClient(session=boto3.session.Session(**CREDENTIALS), endpoint_url=spec["endpoint"],
                              renewal=renewal)
    if spec["store"] in ("redis", "redis-cluster"):
        from fastlease.redis import RedisClient

        return RedisClient(spec["endpoint"], renewal=renewal)
    from fastlease import SQLiteClient

    return SQLiteClient(spec["endpoint"], renewal=renewal)


def hold_busy(spec: dict[str, Any]) -> dict[str, Any]:
    """Take the lease, be busy, check it: one row of the table."""
    kind, library = spec["kind"], spec["library"]
    sum_n = calibrate_sum(BUSY_S) if kind == "C call" else 0  # before the lease: it takes ~0.7 s
    key = f"{library}-{kind}".replace(" ", "-")
    client: Any = None
    if library == "pydynox":
        from pydynox import DynamoDBClient as PydynoxClient
        from pydynox.exceptions import LockLost as PydynoxLost
        from pydynox.lock import SyncDistributedLock as PydynoxLock

        lost_error: type[BaseException] = PydynoxLost

        client = PydynoxClient(region="us-east-1", access_key="testing", secret_key="testing",
                               endpoint_url=spec["endpoint"])
        guard: Any = PydynoxLock(client, table=TABLE, key=key, lease_duration=LEASE_S, wait_timeout=5)
    else:
        from fastlease import LockLost, SyncDistributedLock

        lost_error = LockLost
        client = fastlease_client(spec, library.split()[1])
        guard = SyncDistributedLock(client, table=TABLE, key=key, lease_duration=LEASE_S, wait_timeout=5)
    row: dict[str, Any] = {"release": "ok"}
    try:
        with guard:
            start = time.perf_counter()
            busy(kind, BUSY_S, sum_n)
            row["busy_s"] = time.perf_counter() - start
            try:
                guard.raise_if_lost()
                row["held"] = True
            except lost_error:
                row["held"] = False
            row["renewals"] = guard.metrics.renewals
            link = getattr(getattr(client, "engine", None), "link", None)
            row["renewal_process"] = link is not None and link.pid is not None and link.renewing > 0
    except Exception as error:  # noqa: BLE001 - the release's outcome is a result here
        row["release"] = type(error).__name__
    finally:
        if library != "pydynox":
            client.close()
    return row


def probe(spec: dict[str, Any]) -> dict[str, Any]:
    """The renewal process's start-up and memory: fastlease auto, one 1 s lease, not busy."""
    from fastlease import SyncDistributedLock

    client = fastlease_client(spec, "auto")
    guard = SyncDistributedLock(client, table=TABLE, key="probe", lease_duration=LEASE_S, wait_timeout=5)
    row: dict[str, Any] = {}
    try:
        with guard:
            link = client.engine.link
            t0, pid, deadline = link.started_at, None, time.monotonic() + 5.0
            while time.monotonic() < deadline:
                now = time.monotonic()
                if pid is None:
                    pid = link.pid
                    if pid is not None:
                        row["pid_ms"] = (now - t0) * 1000
                if pid is not None and "ready_ms" not in row:
                    ready = in_select(pid)
                    if ready is None:
                        row["ready_ms"] = None
                    elif ready:
                        row["ready_ms"] = (now - t0) * 1000
                guard.is_valid()  # applies the renewal process's reports
                if guard.metrics.renewals:
                    row["first_report_ms"] = (now - t0) * 1000
                    break
                time.sleep(0.0005)
            if pid is not None:
                row["cpu_ms"] = proc_cpu_ms(pid)
                row["rss_first_kib"] = proc_status(pid, "VmRSS")
                time.sleep(2.0)
                guard.is_valid()
                row["rss_later_kib"] = proc_status(pid, "VmRSS")
                row["renewals_later"] = guard.metrics.renewals
            row["holder_rss_kib"] = proc_status(os.getpid(), "VmRSS")
    finally:
        client.close()
    return row


def child_main(spec: dict[str, Any]) -> int:
    row = probe(spec) if spec["library"] == "probe" else hold_busy(spec)
    print(json.dumps(row), flush=True)
    return 0


# ---- the parent -----------------------------------------------------------------------------------------
def run_child(spec: dict[str, Any], script: str = __file__) -> dict[str, Any]:
    """Run ``script --child SPEC`` (this one by default) and return the JSON row it prints last."""
    env = {name: value for name, value in os.environ.items() if name != "FASTLEASE_RENEWAL"}
    try:
        done = subprocess.run([sys.executable, os.path.abspath(script), "--child", json.dumps(spec)],
                              capture_output=True, text=True, env=env, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"error": f"no answer within {CHILD_TIMEOUT_S:g} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"error": f"exit {done.returncode}: {tail}"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def run_group(base: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The three busy kinds of one (store, library): sleep alongside the python loop, then the C call."""
    rows: dict[str, dict[str, Any]] = {}

    def run(kind: str) -> None:
        rows[kind] = run_child({**base, "kind": kind})

    sleeper = threading.Thread(target=run, args=("sleep",))
    sleeper.start()
    run("python loop")
    sleeper.join()
    run("C call")
    return rows


def _start_server(store: str, server: Any, unavailable: type[Exception], endpoints: dict[str, str],
                  notes: list[str], stack: list[Any]) -> None:
    """Start a throwaway server of ``fastlease.testing`` for ``store``, or note why it could not start."""
    try:
        endpoints[store] = server.start()
        stack.append(server.stop)
    except unavailable as error:
        notes.append(f"{store} skipped: {str(error).splitlines()[0]}")


def start_stores(wanted: list[str], notes: list[str], stack: list[Any]) -> dict[str, str]:
    """Each wanted store's endpoint (DynamoDB: URL, Redis: URL, SQLite: file path); notes for the rest."""
    endpoints: dict[str, str] = {}
    if "dynamodb" in wanted:
        try:
            import boto3

            from fastlease.testing.moto_server import MotoServer
        except ImportError as error:
            notes.append(f"DynamoDB skipped: {error}")
        else:
            server = MotoServer()
            server.start()
            stack.append(server.stop)
            boto3.client("dynamodb", endpoint_url=server.endpoint_url, **CREDENTIALS).create_table(
                TableName=TABLE,
                AttributeDefinitions=[{"AttributeName": "key", "AttributeType": "S"}],
                KeySchema=[{"AttributeName": "key", "KeyType": "HASH"}],
                BillingMode="PAY_PER_REQUEST",
            )
            endpoints["dynamodb"] = server.endpoint_url
    if "redis" in wanted:
        from fastlease.testing.redis_server import RedisServer, RedisServerUnavailable

        _start_server("redis", RedisServer(), RedisServerUnavailable, endpoints, notes, stack)
    if "redis-cluster" in wanted:
        from fastlease.testing.redis_cluster import RedisClusterServer, RedisClusterUnavailable

        _start_server("redis-cluster", RedisClusterServer(), RedisClusterUnavailable, endpoints, notes, stack)
    if "sqlite" in wanted:
        directory = tempfile.mkdtemp(prefix="fastlease-renewal-bench-")
        stack.append(lambda: shutil.rmtree(directory, ignore_errors=True))
        endpoints["sqlite"] = os.path.join(directory, "locks.db")
    return endpoints


def pydynox_version(notes: list[str]) -> Optional[str]:
    try:
        import pydynox
        from pydynox.lock import SyncDistributedLock  # noqa: F401
    except ImportError as error:
        notes.append(f"pydynox skipped: it is not installed on Python {platform.python_version()} ({error})")
        return None
    return str(pydynox.__version__)


def fmt(value: Any, spec: str = ".0f", unit: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{unit}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stores", default=",".join(STORES), help="comma-separated (default: all three)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child_main(json.loads(args.child))
    wanted = [name.strip() for name in args.stores.split(",") if name.strip()]
    unknown = set(wanted) - set(STORES)
    if unknown:
        parser.error(f"unknown store(s): {', '.join(sorted(unknown))}")

    import fastlease
    from fastlease import MemoryClient

    started = time.monotonic()
    notes: list[str] = []
    stack: list[Any] = []
    results: list[tuple[str, str, str, dict[str, Any]]] = []
    costs: dict[str, dict[str, Any]] = {}
    with MemoryClient() as probe_client:
        engine = probe_client.implementation
    try:
        endpoints = start_stores(wanted, notes, stack)
        theirs = pydynox_version(notes) if "dynamodb" in endpoints else None
        for store in wanted:
            if store not in endpoints:
                continue
            base = {"store": store, "endpoint": endpoints[store]}
            costs[store] = run_child({**base, "library": "probe"})
            libraries = ["fastlease auto", "fastlease thread"] + (["pydynox"] if store == "dynamodb" and theirs else [])
            for library in libraries:
                rows = run_group({**base, "library": library})
                for kind in KINDS:
                    results.append((store, library, kind, rows[kind]))
    finally:
        for stop in reversed(stack):
            stop()

    version = platform.python_version()
    print(f"# renewal_under_load: lease {LEASE_S:g} s, busy {BUSY_S:g} s, each holder its own process; "
          f"Python {version}, fastlease {fastlease.__version__} (engine {engine}), "
          f"pydynox {theirs or 'n/a'}, {platform.machine()}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}")
    header = f"{'python':<8}{'store':<10}{'library':<18}{'busy':<13}{'held':<6}{'renewals':>9}{'busy s':>8}  release"
    print(header)
    print("-" * len(header))
    for store, library, kind, row in results:
        name = f"pydynox {theirs}" if library == "pydynox" else library
        if "error" in row:
            print(f"{version:<8}{store:<10}{name:<18}{kind:<13}error: {row['error']}")
            continue
        if library == "fastlease auto" and not row.get("renewal_process"):
            notes.append(f"{store} fastlease auto {kind}: the lease was NOT renewed by a renewal process")
        held = "yes" if row.get("held") else "no"
        print(f"{version:<8}{store:<10}{name:<18}{kind:<13}{held:<6}{fmt(row.get('renewals'), 'd'):>9}"
              f"{fmt(row.get('busy_s'), '.1f'):>8}  {row['release']}")
    print("renewals: each library's own counter (fastlease guard.metrics.renewals, pydynox LockMetrics.renewals)")

    print()
    print(f"# the renewal process (fastlease auto), per store: ms from RenewalLink.started_at; CPU by the first "
          f"report; first renewal due at lease/3 = {LEASE_S / 3 * 1000:.0f} ms")
    header = (f"{'python':<8}{'store':<10}{'pid':>6}{'ready':>7}{'1st report':>12}{'CPU ms':>8}"
              f"{'RSS 1st':>10}{'RSS +2s':>10}{'holder RSS':>12}")
    print(header)
    print("-" * len(header))
    for store, row in costs.items():
        if "error" in row:
            print(f"{version:<8}{store:<10}error: {row['error']}")
            continue

        def mib(kib: Optional[int]) -> str:
            return fmt(None if kib is None else kib / 1024, ".1f", " MiB")

        print(f"{version:<8}{store:<10}{fmt(row.get('pid_ms')):>6}{fmt(row.get('ready_ms')):>7}"
              f"{fmt(row.get('first_report_ms')):>12}{fmt(row.get('cpu_ms')):>8}{mib(row.get('rss_first_kib')):>10}"
              f"{mib(row.get('rss_later_kib')):>10}{mib(row.get('holder_rss_kib')):>12}")
    for note in notes:
        print(f"note: {note}")
    print(f"# {time.monotonic() - started:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
