"""Spawned worker processes for tests: start, talk to and stop them (by PID), with every wait bounded.

Workers run in ``multiprocessing`` *spawn* children (targets in ``mp_workers``), each with its own
clients. The parent talks to them through one-way Pipes. The ``children`` fixture (conftest) SIGKILLs
and joins every child of a test when it ends.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from typing import Any, Callable, List, NamedTuple

from helpers import mp_workers

SPAWN = multiprocessing.get_context("spawn")
REPORT_S = 60.0  # bound for a child's start-up and for each report it owes
JOIN_S = 10.0  # bound for joining a child that has finished or been killed
MIN_TAKEOVER_S = 0.95  # takeover needs one full stored lease of unchanged observation (1.0 s)
MAX_TAKEOVER_S = 8.0  # liveness sanity bound only


class Child(NamedTuple):
    proc: Any  # multiprocessing.Process
    out: Any  # parent's receiving end of the child's reports
    ctl: Any  # parent's sending end of the child's instructions


class Children:
    """Spawned workers of one test; ``stop_all`` SIGKILLs each by its PID and joins it."""

    def __init__(self) -> None:
        self.started: List[Child] = []

    def start(self, target: Callable[..., None], *args: Any) -> Child:
        out_recv, out_send = SPAWN.Pipe(duplex=False)
        ctl_recv, ctl_send = SPAWN.Pipe(duplex=False)
        proc = SPAWN.Process(target=target, args=(*args, out_send, ctl_recv), daemon=True)
        child = Child(proc, out_recv, ctl_send)
        self.started.append(child)
        proc.start()
        # Drop our copies of the child's ends: a child that dies makes its `out` report EOF at once.
        out_send.close()
        ctl_recv.close()
        return child

    def stop_all(self) -> None:
        for child in self.started:
            pid = child.proc.pid
            if pid is not None and child.proc.exitcode is None:
                try:
                    os.kill(pid, signal.SIGKILL)  # also ends a SIGSTOPped child
                except ProcessLookupError:
                    pass
            if pid is not None:
                child.proc.join(timeout=JOIN_S)
            child.out.close()
            child.ctl.close()


def receive(child: Child, expected: str, timeout_s: float = REPORT_S) -> tuple:
    """The child's next report, which must be of kind ``expected``; fails (never hangs) otherwise."""
    pid = child.proc.pid
    if not child.out.poll(timeout_s):
        raise AssertionError(f"child {pid}: no report within {timeout_s:g} s")
    try:
        report = child.out.recv()
    except EOFError:
        child.proc.join(timeout=JOIN_S)
        raise AssertionError(f"child {pid} exited (exit code {child.proc.exitcode}) without reporting") from None
    if report[0] == "error":
        raise AssertionError(f"child {pid} failed:\n{report[-1]}")
    assert report[0] == expected, f"child {pid}: expected {expected!r}, got {report!r}"
    return report


def tell(child: Child, message: Any) -> None:
    """Send ``message`` to the child; if it has gone, fail with what it reported (its error) instead of
    a bare BrokenPipeError."""
    try:
        child.ctl.send(message)
    except OSError:
        receive(child, f"(alive to be told {message!r})", timeout_s=JOIN_S)
        raise


def kill_and_reap(child: Child) -> None:
    os.kill(child.proc.pid, signal.SIGKILL)
    child.proc.join(timeout=JOIN_S)
    assert child.proc.exitcode == -signal.SIGKILL


def assert_exclusive(holds: list, contenders: int) -> None:
    """No two of ``holds`` (``mp_workers.contend``'s) overlap, and the key changed hands between processes
    at least ``contenders`` times. CLOCK_MONOTONIC is system-wide on Linux: intervals of all processes compare."""
    holds = sorted(holds)
    overlaps = [(a, b) for a, b in zip(holds, holds[1:]) if b[0] <= a[1]]
    assert not overlaps, f"{len(overlaps)} overlapping holds, e.g. {overlaps[:3]}"
    handovers = sum(1 for a, b in zip(holds, holds[1:]) if a[3] != b[3])
    assert handovers >= contenders, f"only {handovers} handovers between processes"


def run_contenders(children: Children, target: str, table: str, key: str, count: int, rounds: int,
                   fast_path: bool, lease_s: float) -> list:
    """``count`` processes run ``mp_workers.contend`` on ``key`` together; their holds, every one exited 0."""
    workers = [children.start(mp_workers.contend, target, table, key, rounds, fast_path, lease_s)
               for _ in range(count)]
    for worker in workers:
        receive(worker, "ready")
    for worker in workers:  # all clients are built: start the rounds together
        worker.ctl.send("start")
    holds = []
    for worker in workers:
        holds.extend(receive(worker, "done")[2])
    for worker in workers:
        worker.proc.join(timeout=JOIN_S)
        assert worker.proc.exitcode == 0
    return holds
