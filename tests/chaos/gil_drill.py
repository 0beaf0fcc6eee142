"""The GIL drill, issue 32's scenario in a loop: a holder process takes a 1 s lease and at once runs one
C call that holds the GIL for about 2.8 s (``sum(range(N))``); a contender process, started with the
call, tries to acquire the same key. Round after round, with new processes and a new key each time.

The renewal process must keep the holder's lease through the call; whatever happens, the contender's
acquisition must never be confirmed while the holder still claims the lease. The check is independent of
timing, on the host's monotonic clock (system-wide on Linux, so both processes' readings are on one
timeline): the holder reports, after its call, what ``raise_if_lost()`` said, ``lease.valid_until()``
and when it left the block (its release follows); the contender reports when ``acquire()`` returned.
A round overlaps when the holder passed ``raise_if_lost()`` and the contender's acquisition came before
the earlier of the holder's validity end and its leaving. The report also gives how long after the
call's end each acquisition came (a handoff at the release: a few ms) and the rounds whose holder
lost its lease during the call (safe, but the renewal process did not keep it).

Run: ``python -m tests.chaos --gil --store redis --seconds 120`` (each round takes about 5 s); on
another Python, with its venv: ``.venv-3.12/bin/python -m tests.chaos --gil ...``.
"""

from __future__ import annotations

import random
import time
from typing import Any, Callable, Optional

from helpers.gil_workers import calibrate_sum

from . import workload
from .election_drill import SPAWN, Reporter, receive, run_drill
from .harness import _Setup, stop_all

CALL_S = 2.8
#: Each report must come within this long (process start-up, a client, the call itself).
REPORT_S = 30.0


def inside_claim_s(valid_until: Optional[float], leaving: float, acquired: Optional[float]) -> float:
    """How far a contender's confirmed acquisition (``acquired``; None: it never acquired) lies inside a
    holder's claim after its call: the validity it knew then (``valid_until``; None: it claimed none), cut
    where it left the block (``leaving``: its release follows). 0.0 when outside: no overlap."""
    if valid_until is None or acquired is None:
        return 0.0
    return max(0.0, min(valid_until, leaving) - acquired)


def _holder_main(store: str, target: str, key: str, n: int, sender: Any) -> None:
    from fastlease import LockLost, SyncDistributedLock

    client = workload.make_client(store, target, None)
    result: dict[str, Any] = {}
    try:
        guard = SyncDistributedLock(client, table=workload.TABLE, key=key, lease_duration=workload.LEASE_S,
                                    wait_timeout=10)
        try:
            with guard as lease:
                result["started"] = time.monotonic()
                sender.send(("starting", result["started"]))
                sum(range(n))  # one GIL-holding C call
                result["ended"] = time.monotonic()
                try:
                    lease.raise_if_lost()
                    result["lost"] = None
                except LockLost as error:
                    result["lost"] = error.cause
                result["renewals"] = lease.metrics.renewals
                until = lease.valid_until()
                result["valid_until"] = until
                result["leaving"] = time.monotonic()
        except LockLost as error:
            result["exit"] = error.cause
    finally:
        client.close()
    sender.send(("done", result))


def _contender_main(store: str, target: str, key: str, go: Any, sender: Any) -> None:
    from fastlease import LockLost, LockNotAcquired, SyncDistributedLock

    client = workload.make_client(store, target, None)
    result: dict[str, Any] = {"acquired": None}
    try:
        sender.send(("ready",))
        if not go.wait(REPORT_S):
            return
        result["started"] = time.monotonic()
        guard = SyncDistributedLock(client, table=workload.TABLE, key=key, lease_duration=workload.LEASE_S,
                                    wait_timeout=CALL_S + 5)
        try:
            with guard:
                result["acquired"] = time.monotonic()
        except (LockNotAcquired, LockLost) as error:
            result["error"] = repr(error)[:200]
    finally:
        client.close()
    sender.send(("done", result))


def _expect(reporter: Reporter, kind: str) -> tuple[Any, ...]:
    deadline = time.monotonic() + REPORT_S
    while time.monotonic() < deadline:  # bounded
        for _, event in receive([reporter], 0.1):
            if event[0] == kind:
                return event
        if reporter.finished:
            break
    raise RuntimeError(f"no {kind!r} report from process {reporter.process.pid} within {REPORT_S:g} s")


def _round(setup: _Setup, key: str, n: int) -> tuple[dict, dict]:
    go = SPAWN.Event()
    contender = Reporter(_contender_main, setup.store, setup.target, key, go)
    holder: Optional[Reporter] = None
    try:
        _expect(contender, "ready")
        holder = Reporter(_holder_main, setup.store, setup.target, key, n)
        _expect(holder, "starting")
        go.set()
        held = _expect(holder, "done")[1]
        took = _expect(contender, "done")[1]
    finally:
        stop_all([contender] + ([holder] if holder is not None else []))
    return held, took


def run(store: str, seconds: float, *, seed: Optional[int] = None, say: Callable[[str], None] = print) -> dict:
    """Rounds on ``store`` until ``seconds`` are spent (one at least): the report of ``check``."""
    title = f"GIL drill: one {CALL_S:g} s GIL-holding call right after a {workload.LEASE_S:g} s acquisition"
    return run_drill(store, seconds, seed, say, title, _drill)


def _drill(setup: _Setup, seconds: float, rng: random.Random, seed: int) -> dict:
    n = calibrate_sum(CALL_S)
    deadline = time.monotonic() + seconds
    rounds = []
    while not rounds or time.monotonic() < deadline:  # bounded: a round ends within a few REPORT_S
        rounds.append(_round(setup, f"gil-{seed}-{len(rounds)}", n))
    report = check(rounds)
    report.update(store=setup.store, seed=seed)
    return report


def check(rounds: list[tuple[dict, dict]]) -> dict:
    """Overlaps (the contender's confirmed acquisition inside the holder's claim), holders that lost the
    lease during the call, and when each acquisition came relative to the call's end."""
    overlaps, lost, after_end, calls = [], 0, [], []
    for held, took in rounds:
        calls.append(held["ended"] - held["started"])
        lost += held["lost"] is not None
        acquired = took["acquired"]
        if acquired is None:
            continue
        after_end.append(acquired - held["ended"])
        inside = inside_claim_s(held["valid_until"] if held["lost"] is None else None, held["leaving"], acquired)
        if inside > 0:
            overlaps.append((inside, held, took))
    return {"rounds": len(rounds), "overlaps": overlaps, "lost_during_call": lost,
            "acquisitions": len(after_end), "calls_s": (min(calls), max(calls)),
            "after_call_end_s": (min(after_end), max(after_end)) if after_end else None}


def line(report: dict) -> str:
    after = report["after_call_end_s"]
    return (f"{report['store']}: {report['rounds']} rounds, calls {report['calls_s'][0]:.2f}-"
            f"{report['calls_s'][1]:.2f} s; overlaps {len(report['overlaps'])}; holders that lost the lease "
            f"during the call {report['lost_during_call']}; contender acquisitions {report['acquisitions']}, "
            + (f"{after[0]:+.3f} to {after[1]:+.3f} s after the call's end" if after else "none")
            + f"; seed {report['seed']}")
