"""Uncontended acquire+release cycles against one serialised moto server, side by side in one run:
fastlease on its fast request path, the same with fencing tokens (``fencing=True``: the acquisition is one
TransactWriteItems), fastlease on plain boto3 (``fast_path=False``), and pydynox 1.8.0.

For each: cycles/s (wall), client CPU µs per cycle (``time.process_time`` of this process, all its
threads, so pydynox's Rust runtime threads count too; the server is another process), and requests
per cycle from the libraries' own lease metrics. Rounds are interleaved so machine noise hits all
three alike. Then, apart: fastlease's own work per cycle with no network at all (a transport that
encodes each request's body and answers at once), without and with fencing, which is what fencing
adds to the client's CPU whatever the server's latency; warm (back to back), and cold (each cycle
after 5 ms asleep, as after a wait for the server).

Then the same contenders again against a second server that holds every response until ``--latency-ms``
(5) after its request arrived, whatever the operation, as a remote endpoint does. On these machines a
client's CPU per request grows with how long it idled before it (its code and data go cold), and moto
spends longer on a transaction than on a PutItem, so in the first table a fenced acquisition is charged
for moto's slowness; in the second every client waits alike. Each table ends with
the raw exchange: fastlease's own two requests of a cycle, their bytes as sent, replayed on one
kept-alive socket by a bare ``sendall`` and ``recv``: the CPU that any client pays for the exchange itself.

Then both tables again against ``canned_endpoint.py``, an endpoint that stores nothing and answers every
request with success: moto runs on the same cores as the client, and its own work between a request and
its answer leaves the client colder than a remote endpoint would; this one costs almost nothing.
Run: ``.venv/bin/python bench/dynamodb_cycle.py [--cycles N] [--rounds R] [--latency-ms MS] [--no-canned]``.
"""

from __future__ import annotations

import argparse
import platform
import socket
import statistics
import sys
import time
from typing import Callable
from urllib.parse import urlsplit

import boto3
from canned_endpoint import CannedEndpoint

from fastlease import SyncDistributedLock
from fastlease.client import LeaseClient
from fastlease.dynamodb import DynamoDBClient
from fastlease.stores.dynamodb.bodies import Body, as_text
from fastlease.stores.dynamodb.fastpath import FastTransport
from fastlease.stores.dynamodb.store import DynamoDBStore
from fastlease.testing.moto_server import MotoServer

TABLE = "bench_locks"
CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": "us-east-1"}


def fastlease_runner(endpoint: str, fast_path: bool,
                     fencing: bool = False) -> tuple[Callable[[int], int], Callable[[], None]]:
    client = DynamoDBClient(session=boto3.session.Session(**CREDENTIALS), endpoint_url=endpoint, fast_path=fast_path,
                            fencing=fencing)
    assert client.transport == ("fast" if fast_path else "boto3")
    key = f"bench-{client.transport}-{fencing}"

    def run(cycles: int) -> int:
        requests = 0
        for _ in range(cycles):
            with SyncDistributedLock(client, table=TABLE, key=key) as lease:
                pass
            metrics = lease.metrics
            requests += metrics.write_requests + metrics.read_requests
        return requests

    return run, client.close


class _Answering:
    """A transport that encodes the request, as the fast path does, and answers at once: success."""

    def call(self, operation: str, params: dict | Body, timeout_s: float) -> dict:
        as_text(params).encode()
        return {}


def no_network_us(fencing: bool, cycles: int = 20_000) -> float:
    """fastlease's CPU per acquire+release cycle with no network (renewals on the thread: none run)."""
    client = LeaseClient(DynamoDBStore(_Answering(), fencing), renewal="thread")
    try:
        for _ in range(cycles // 10):
            with SyncDistributedLock(client, table=TABLE, key="no-network"):
                pass
        start = time.process_time()
        for _ in range(cycles):
            with SyncDistributedLock(client, table=TABLE, key="no-network"):
                pass
        return (time.process_time() - start) / cycles * 1e6
    finally:
        client.close()


def no_network_idle_us(fencing: bool, cycles: int = 1_000, idle_s: float = 0.005) -> float:
    """The same work, each cycle after ``idle_s`` asleep, as a cycle's work follows a wait for the
    server: the median of the cycles' CPU on this thread's clock. What a cycle costs cold."""
    client = LeaseClient(DynamoDBStore(_Answering(), fencing), renewal="thread")
    try:
        for _ in range(100):
            with SyncDistributedLock(client, table=TABLE, key="no-network"):
                pass
        spent = []
        for _ in range(cycles):
            time.sleep(idle_s)
            start = time.thread_time_ns()
            with SyncDistributedLock(client, table=TABLE, key="no-network"):
                pass
            spent.append(time.thread_time_ns() - start)
        return statistics.median(spent) / 1e3
    finally:
        client.close()


def pydynox_runner(endpoint: str) -> tuple[Callable[[int], int], Callable[[], None]]:
    from pydynox import DynamoDBClient as PydynoxClient
    from pydynox.lock import SyncDistributedLock as PydynoxLock

    client = PydynoxClient(region="us-east-1", access_key="testing", secret_key="testing", endpoint_url=endpoint)

    def run(cycles: int) -> int:
        requests = 0
        for _ in range(cycles):
            with PydynoxLock(client, table=TABLE, key="bench-pydynox") as lease:
                pass
            metrics = lease.metrics
            requests += metrics.write_requests + metrics.read_requests
        return requests

    return run, lambda: None


Runner = tuple[Callable[[int], int], Callable[[], None]]


def raw_exchange_runner(endpoint: str) -> Runner:
    """Replays the bytes of one fastlease cycle's two requests (PutItem, DeleteItem), as its fast path
    sent them, with a bare sendall and recv on one kept-alive socket: the exchange with nothing around it.
    moto checks no signature's age, so the same bytes are answered each time (the PutItem, then the
    DeleteItem of that row)."""
    sent: list[bytes] = []
    original = FastTransport._exchange

    def capture(self: FastTransport, operation: str, message: bytes, timeout_s: float) -> tuple[int, bytes]:
        sent.append(message)
        return original(self, operation, message, timeout_s)

    run, close = fastlease_runner(endpoint, True)
    FastTransport._exchange = capture  # type: ignore[method-assign]
    try:
        run(1)
    finally:
        FastTransport._exchange = original  # type: ignore[method-assign]
        close()
    put, delete = sent
    address = urlsplit(endpoint)
    sock = socket.create_connection((address.hostname, address.port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def replay(cycles: int) -> int:
        for _ in range(cycles):
            for message in (put, delete):
                sock.sendall(message)
                answer = sock.recv(65536)
                if not answer.startswith(b"HTTP/1.1 200"):
                    raise RuntimeError(f"the replayed request was refused: {answer[:200]!r}")
        return 2 * cycles

    return replay, sock.close


def contenders_for(endpoint: str) -> dict[str, Runner]:
    contenders: dict[str, Runner] = {
        "fastlease fast": fastlease_runner(endpoint, True),
        "fastlease fencing": fastlease_runner(endpoint, True, fencing=True),
        "fastlease boto3": fastlease_runner(endpoint, False),
    }
    try:
        import pydynox

        contenders[f"pydynox {pydynox.__version__}"] = pydynox_runner(endpoint)
    except ImportError:
        print("pydynox is not installed (make bench installs it)", file=sys.stderr)
    contenders["raw exchange"] = raw_exchange_runner(endpoint)
    return contenders


def measure(latency_ms: float, rounds: int, cycles: int, canned: bool = False) -> None:
    """One table: every contender against one server (``latency_ms``: its response floor), interleaved;
    moto, or with ``canned`` the endpoint that stores nothing (``canned_endpoint.py``)."""
    with (CannedEndpoint(latency_ms) if canned else MotoServer(latency_ms=latency_ms)) as server:
        assert server.endpoint_url is not None
        if not canned:
            admin = DynamoDBClient(session=boto3.session.Session(**CREDENTIALS), endpoint_url=server.endpoint_url)
            admin.create_lock_table(TABLE)
            admin.close()
        contenders = contenders_for(server.endpoint_url)
        for run, _ in contenders.values():
            run(20)  # warm-up: connections, lock clients, caches
        wall: dict[str, list[float]] = {name: [] for name in contenders}
        cpu: dict[str, list[float]] = {name: [] for name in contenders}
        requests: dict[str, int] = {name: 0 for name in contenders}
        for _ in range(rounds):
            for name, (run, _) in contenders.items():
                wall_start, cpu_start = time.perf_counter(), time.process_time()
                requests[name] += run(cycles)
                cpu[name].append((time.process_time() - cpu_start) / cycles * 1e6)
                wall[name].append((time.perf_counter() - wall_start) / cycles * 1e6)
        for _, close in contenders.values():
            close()

    server = "the canned endpoint (no store, every request answered with success)" if canned else \
        "one serialised moto server"
    held = f"every response held to {latency_ms:g} ms" if latency_ms else \
        ("every response at once" if canned else "at moto's own speed")
    print(f"# dynamodb_cycle: {rounds} interleaved rounds x {cycles} cycles against {server}, "
          f"{held}, Python {platform.python_version()}, {platform.machine()}, {time.strftime('%Y-%m-%d')}")
    print(f"{'client':<18}{'cycles/s':>10}{'wall us/cycle':>15}{'CPU us/cycle':>14}{'requests/cycle':>16}")
    medians = {}
    for name in contenders:
        medians[name] = (statistics.median(wall[name]), statistics.median(cpu[name]))
        print(f"{name:<18}{1e6 / medians[name][0]:>10,.0f}{medians[name][0]:>15,.0f}{medians[name][1]:>14,.0f}"
              f"{requests[name] / (rounds * cycles):>16.2f}")
    for name in medians:
        if name.startswith("pydynox"):
            for ours in ("fastlease fast", "fastlease fencing", "fastlease boto3"):
                # Each round ran the contenders back to back, so a round's own ratio is the least disturbed by
                # the machine's speed drifting between rounds; its median and range say how steady it was.
                paired = sorted(a / b for a, b in zip(cpu[ours], cpu[name]))
                print(f"{ours} / {name}: CPU {medians[ours][1] / medians[name][1]:.2f}x "
                      f"(per round {statistics.median(paired):.2f}x, {paired[0]:.2f}-{paired[-1]:.2f}), "
                      f"wall {medians[ours][0] / medians[name][0]:.2f}x")
            raw = medians["raw exchange"][1]
            print(f"above the raw exchange: fastlease fast {medians['fastlease fast'][1] - raw:,.0f} us, "
                  f"fencing {medians['fastlease fencing'][1] - raw:,.0f} us, {name} {medians[name][1] - raw:,.0f} us")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=300, help="cycles per round (default 300)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--latency-ms", type=float, default=5.0,
                        help="the second table's response floor (default 5; 0 leaves that table out)")
    parser.add_argument("--no-canned", action="store_true",
                        help="leave out the tables against the canned endpoint (canned_endpoint.py)")
    args = parser.parse_args()
    if args.cycles < 1 or args.rounds < 1 or not 0 <= args.latency_ms <= 1000:
        parser.error("--cycles and --rounds must be at least 1, --latency-ms in 0..1000")
    measure(0.0, args.rounds, args.cycles)
    if args.latency_ms:
        # Each cycle waits two floors, so fewer cycles per round keep this table's time near the first's.
        measure(args.latency_ms, args.rounds, max(1, args.cycles // 2))
    if not args.no_canned:
        measure(0.0, args.rounds, args.cycles, canned=True)
        if args.latency_ms:
            measure(args.latency_ms, args.rounds, max(1, args.cycles // 2), canned=True)
    plain = [no_network_us(False) for _ in range(3)]
    fenced = [no_network_us(True) for _ in range(3)]
    print(f"no network, fastlease's own work per cycle (best of 3 x 20,000): {min(plain):.1f} us; with fencing "
          f"{min(fenced):.1f} us (+{min(fenced) - min(plain):.1f} us)")
    print(f"the same, each cycle after 5 ms asleep (median of 1,000): {no_network_idle_us(False):.1f} us; "
          f"with fencing {no_network_idle_us(True):.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
