"""The test servers (moto, redis-server) live exactly as long as the process that started them: they
outlive the thread that started them, and they stop when that process is SIGKILLed without stopping
them (no cleanup of its own runs then)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
from typing import Iterator

import pytest

pytestmark = [
    pytest.mark.server,  # starts a moto server or a redis-server
    pytest.mark.posix,
    pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="waits on processes that are not its children "
                       "with pidfds (Linux 5.3+)"),
]

BOUND_S = 30.0  # every wait here: a server start, a thread's end, the servers' exit after the parent's

# The parent starts a server from a worker thread and joins it, waits until the OS thread is gone too
# (PR_SET_PDEATHSIG fires then, which is why it must not be used), prints the server's PID and URL, and
# then waits on stdin, which the test never closes: it ends only by the test's SIGKILL.
PARENT = textwrap.dedent(
    """
    import os, sys, threading, time
    from fastlease.testing.{module} import {cls}

    server = {cls}()
    urls = []
    starter = threading.Thread(target=lambda: urls.append(server.start(timeout_s={bound})))
    starter.start()
    starter.join({bound})
    deadline = time.monotonic() + {bound}
    while os.path.exists(f"/proc/self/task/{{starter.native_id}}") and time.monotonic() < deadline:
        threading.Event().wait(0.01)  # the OS thread ends just after join() returns; nothing signals it
    print(server.pid, urls[0] if urls else "none", flush=True)
    sys.stdin.read()
    """
)


def redis_answers(url: str) -> bool:
    import redis

    client = redis.Redis.from_url(url, socket_timeout=BOUND_S)
    try:
        return bool(client.ping())
    finally:
        client.close()


def moto_answers(url: str) -> bool:
    import boto3

    client = boto3.client("dynamodb", endpoint_url=url, region_name="us-east-1", aws_access_key_id="testing",
                          aws_secret_access_key="testing")
    return client.list_tables()["TableNames"] == []


SERVERS = {
    "redis": ("redis_server", "RedisServer", redis_answers),
    "moto": ("moto_server", "MotoServer", moto_answers),
}


def children_of(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as listing:
        return [int(child) for child in listing.read().split()]


def exited(pidfd: int) -> bool:
    return bool(select.select([pidfd], [], [], 0)[0])


@pytest.fixture
def pidfds() -> Iterator[list[int]]:
    """pidfds of the processes a test watches; whatever is still alive at the end is SIGKILLed through
    its pidfd (which, unlike a PID, can never name a different process)."""
    opened: list[int] = []
    try:
        yield opened
    finally:
        for pidfd in opened:
            try:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.close(pidfd)


@pytest.mark.parametrize("server", sorted(SERVERS))
def test_a_server_outlives_its_thread_and_stops_with_its_process(server: str, pidfds: list[int]) -> None:
    module, cls, answers = SERVERS[server]
    code = PARENT.format(module=module, cls=cls, bound=BOUND_S)
    parent = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        assert select.select([parent.stdout], [], [], 2 * BOUND_S)[0], "the parent printed nothing"
        guard_pid, url = parent.stdout.readline().split()
        assert url != "none", parent.stderr.read() if parent.stderr else ""
        pids = [int(guard_pid), *children_of(int(guard_pid))]
        assert len(pids) == 2, f"the guard {guard_pid} should have one child, the server: {pids}"
        pidfds.extend(os.pidfd_open(pid) for pid in pids)

        assert answers(url), "the server did not answer after the thread that started it ended"

        os.kill(parent.pid, signal.SIGKILL)  # no stop(), no atexit, no finally runs in the parent
        parent.wait(BOUND_S)
        waiting = list(pidfds)
        for _ in range(len(pidfds) + 1):  # bounded: each round sees at least one more exit, or times out
            waiting = [pidfd for pidfd in waiting if not exited(pidfd)]
            if not waiting or not select.select(waiting, [], [], BOUND_S)[0]:
                break
        running = [pid for pid, pidfd in zip(pids, pidfds) if not exited(pidfd)]
        assert not running, f"still running {BOUND_S:g} s after their parent was SIGKILLed: {running}"
    finally:
        if parent.poll() is None:
            parent.kill()
        parent.wait(BOUND_S)
        for stream in (parent.stdin, parent.stdout, parent.stderr):
            if stream is not None:
                stream.close()
