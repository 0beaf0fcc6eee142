"""Uncontended acquire+release cycles against one serialised moto server, side by side in one run:
fastlease on its fast request path, the same with fencing tokens (``fencing=True``: the acquisition is one
TransactWriteItems), fastlease on plain boto3 (``fast_path=False``), and pydynox 1.8.0.

For each: cycles/s (wall), client CPU µs per cycle (``time.process_time`` of this process, all its
threads, so pydynox's Rust runtime threads count too; the server is another process), and requests
per cycle from the libraries' own lease metrics. Rounds are interleaved so machine noise hits all
three alike. Then, apart: fastlease's own work per cycle with no network at all (a transport that
encodes each request's body and answers at once), without and with fencing, which is what fencing
adds to the client's CPU whatever the server's latency.
Run: ``.venv/bin/python bench/dynamodb_cycle.py [--cycles N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from typing import Callable

import boto3

from fastlease import SyncDistributedLock
from fastlease.client import LeaseClient
from fastlease.dynamodb import DynamoDBClient
from fastlease.stores.dynamodb.fastpath import _encode_json
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

    def call(self, operation: str, params: dict, timeout_s: float) -> dict:
        _encode_json(params).encode()
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=300, help="cycles per round (default 300)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    args = parser.parse_args()

    with MotoServer() as server:
        endpoint = server.endpoint_url
        boto3.client("dynamodb", endpoint_url=endpoint, **CREDENTIALS).create_table(
            TableName=TABLE,
            AttributeDefinitions=[{"AttributeName": "key", "AttributeType": "S"}],
            KeySchema=[{"AttributeName": "key", "KeyType": "HASH"}],
            BillingMode="PAY_PER_REQUEST",
        )
        contenders: dict[str, tuple[Callable[[int], int], Callable[[], None]]] = {
            "fastlease fast": fastlease_runner(endpoint, True),
            "fastlease fencing": fastlease_runner(endpoint, True, fencing=True),
            "fastlease boto3": fastlease_runner(endpoint, False),
        }
        try:
            import pydynox

            contenders[f"pydynox {pydynox.__version__}"] = pydynox_runner(endpoint)
        except ImportError:
            print("pydynox is not installed (make bench installs it)", file=sys.stderr)
        for run, _ in contenders.values():
            run(20)  # warm-up: connections, lock clients, caches
        wall: dict[str, list[float]] = {name: [] for name in contenders}
        cpu: dict[str, list[float]] = {name: [] for name in contenders}
        requests: dict[str, int] = {name: 0 for name in contenders}
        for _ in range(args.rounds):
            for name, (run, _) in contenders.items():
                wall_start, cpu_start = time.perf_counter(), time.process_time()
                requests[name] += run(args.cycles)
                cpu[name].append((time.process_time() - cpu_start) / args.cycles * 1e6)
                wall[name].append((time.perf_counter() - wall_start) / args.cycles * 1e6)
        for _, close in contenders.values():
            close()

    total = args.rounds * args.cycles
    print(f"# dynamodb_cycle: {args.rounds} interleaved rounds x {args.cycles} cycles against one serialised "
          f"moto server, Python {platform.python_version()}, {platform.machine()}, {time.strftime('%Y-%m-%d')}")
    print(f"{'client':<18}{'cycles/s':>10}{'wall us/cycle':>15}{'CPU us/cycle':>14}{'requests/cycle':>16}")
    medians = {}
    for name in contenders:
        medians[name] = (statistics.median(wall[name]), statistics.median(cpu[name]))
        print(f"{name:<18}{1e6 / medians[name][0]:>10,.0f}{medians[name][0]:>15,.0f}{medians[name][1]:>14,.0f}"
              f"{requests[name] / total:>16.2f}")
    for name in medians:
        if name.startswith("pydynox"):
            for ours in ("fastlease fast", "fastlease fencing", "fastlease boto3"):
                # Each round ran the contenders back to back, so a round's own ratio is the least disturbed by
                # the machine's speed drifting between rounds; its median and range say how steady it was.
                paired = sorted(a / b for a, b in zip(cpu[ours], cpu[name]))
                print(f"{ours} / {name}: CPU {medians[ours][1] / medians[name][1]:.2f}x "
                      f"(per round {statistics.median(paired):.2f}x, {paired[0]:.2f}-{paired[-1]:.2f}), "
                      f"wall {medians[ours][0] / medians[name][0]:.2f}x")
    plain = [no_network_us(False) for _ in range(3)]
    fenced = [no_network_us(True) for _ in range(3)]
    print(f"no network, fastlease's own work per cycle (best of 3 x 20,000): {min(plain):.1f} us; with fencing "
          f"{min(fenced):.1f} us (+{min(fenced) - min(plain):.1f} us)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
