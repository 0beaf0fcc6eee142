"""The semaphore drill: worker processes take turns on the slots of one semaphore of limit 2 while the
drill SIGKILLs and SIGSTOPs holders; then the checker proves, from what the holders claimed, that no more
than the limit were valid at once, that no slot had two valid holders, and that each slot's tokens rose.

Each worker loops: acquire a slot, hold it for 50-300 ms, release. It reports on its pipe, with readings
of the monotonic clock (system-wide on Linux, so every process's readings are on one timeline):

* ``acquired``: the hold's id, its slot and its fencing token, when ``acquire()`` returned;
* ``valid``: the hold, and ``lease.valid_until()``, the end of the validity the engine claims now; sent
  about every 20 ms while the hold lasts, so a holder killed or paused right after still has its last
  claim on record;
* ``ending``: the hold, when its work is over, before the release.

The checker, independent of timing: a hold's claimed interval runs from its ``acquired`` reading to the
latest end it claimed, cut at its ``ending`` reading if it had one (the release comes after it). A killed
holder's claim stands in full. A sweep over every interval's start and end gives the most valid at once,
which must not exceed the limit; within each slot, sorted by acquisition, each interval must end no later
than the next begins and the tokens must strictly increase. Recovery: after a holder is killed or paused,
its slot must be held again within a lease of observation and polls. Faults ``kill_holder`` (a fresh
worker replaces it) and ``pause_holder`` (SIGSTOP for 1.5 leases), one at a time, from a printed seed.
Memory is not drilled: its holders would be threads (tests/test_semaphore.py covers it).
"""

from __future__ import annotations

import os
import random
import signal
import time
from typing import Any, Callable, Optional

from . import workload
from .election_drill import Reporter, _election_client, receive, run_drill
from .harness import _Setup, stop_all

KEY = "slots"
LIMIT = 2
WORKERS = 5
REPORT_EVERY_S = 0.02
#: A killed or paused holder's slot must be held again within this long (a lease of observation after
#: the last renewal seen, polls, request timeouts).
RECOVERY_BOUND_S = 2 * workload.LEASE_S + 1.0


def _worker_main(store: str, target: str, stop_at: float, number: int, sender: Any) -> None:
    from fastlease import LockLost, LockNotAcquired, LockReleaseError, Semaphore

    client = _election_client(store, target)  # (DynamoDB with fencing: every slot has tokens)
    rng = random.Random(number)
    holds = 0
    try:
        while time.monotonic() < stop_at:  # bounded: each turn waits at most until the end
            guard = Semaphore(client, table=workload.TABLE, key=KEY, limit=LIMIT, lease_duration=workload.LEASE_S,
                              wait_timeout=max(0.0, stop_at - time.monotonic()), identity=f"worker-{number}")
            try:
                guard.acquire()
            except LockNotAcquired:
                continue
            hold = f"{number}.{holds}"
            holds += 1
            sender.send(("acquired", hold, guard.slot, guard.fencing_token, time.monotonic()))
            done = time.monotonic() + rng.uniform(0.05, 0.3)
            while time.monotonic() < done:
                until = guard.valid_until()
                if until is None:
                    break
                sender.send(("valid", hold, until))
                if guard.lost.wait(REPORT_EVERY_S):
                    break
            sender.send(("ending", hold, time.monotonic()))
            try:
                guard.release()
            except (LockLost, LockReleaseError):
                pass  # lost while paused: the claims on record say what it held
    finally:
        client.close()


def run(store: str, seconds: float, *, seed: Optional[int] = None, say: Callable[[str], None] = print) -> dict:
    """One drill on ``store``: the report of ``check``, with the faults' counts and the worst recovery."""
    return run_drill(store, seconds, seed, say, f"semaphore drill: {WORKERS} workers on {LIMIT} slots", _drill)


def _drill(setup: _Setup, seconds: float, rng: random.Random, seed: int) -> dict:
    deadline = time.monotonic() + seconds
    pool = [Reporter(_worker_main, setup.store, setup.target, deadline, n) for n in range(WORKERS)]
    events: list[tuple[Any, ...]] = []
    faults: list[tuple[float, str, int]] = []  # (when, kind, slot of the holder hit)
    resume: list[tuple[float, Reporter]] = []
    next_fault = time.monotonic() + 1.0 + rng.uniform(0.2, 0.8)
    try:
        while time.monotonic() < deadline + 15:  # bounded: workers stop at the deadline
            if all(w.finished for w in pool):
                break
            for worker, event in receive(pool, 0.05):
                events.append(event)
                if event[0] == "acquired":
                    worker.holding = (event[1], event[2])
                elif event[0] == "ending":
                    worker.holding = None
            now = time.monotonic()
            for when, worker in list(resume):
                if now >= when:
                    os.kill(worker.process.pid, signal.SIGCONT)
                    worker.stopped = False
                    resume.remove((when, worker))
            holders = [w for w in pool if w.holding is not None and not w.finished and w.process.is_alive()]
            if now < next_fault or now > deadline - RECOVERY_BOUND_S or resume or not holders:
                continue
            target = rng.choice(holders)
            slot = target.holding[1] if target.holding is not None else -1
            next_fault = now + workload.LEASE_S + rng.uniform(0.8, 1.6)
            if rng.random() < 0.5:
                os.kill(target.process.pid, signal.SIGKILL)
                target.process.join(10)
                faults.append((now, "kill_holder", slot))
                pool.append(Reporter(_worker_main, setup.store, setup.target, deadline, len(pool)))
            else:
                os.kill(target.process.pid, signal.SIGSTOP)
                target.stopped = True
                resume.append((now + 1.5 * workload.LEASE_S, target))
                faults.append((now, "pause_holder", slot))
    finally:
        stop_all(pool)
    report = check(events, faults, LIMIT)
    report.update(store=setup.store, seed=seed)
    return report


def check(events: list[tuple[Any, ...]], faults: list[tuple[float, str, int]], limit: int) -> dict:
    """The most holds valid at once (over ``limit`` is a violation), overlaps within a slot, tokens that
    did not strictly increase within a slot, and the worst time from a fault to its slot's next hold."""
    acquired: dict[str, tuple[int, Optional[int], float]] = {}  # hold -> (slot, token, when)
    claimed: dict[str, float] = {}
    ended: dict[str, float] = {}
    for event in events:
        if event[0] == "acquired":
            acquired[event[1]] = (event[2], event[3], event[4])
        elif event[0] == "valid":
            claimed[event[1]] = max(claimed.get(event[1], event[2]), event[2])
        else:
            ended[event[1]] = event[2]
    intervals = {hold: (when, min(claimed.get(hold, when), ended.get(hold, float("inf"))))
                 for hold, (_, _, when) in acquired.items()}
    # Ends sort before starts at the same instant: an interval that ends as another begins never overlaps it.
    sweep = sorted([(end, 0) for _, end in intervals.values()] + [(start, 1) for start, _ in intervals.values()])
    valid = most = 0
    for _, starts in sweep:
        valid += 1 if starts else -1
        most = max(most, valid)
    overlaps, decreasing = [], 0
    for slot in sorted({slot for slot, _, _ in acquired.values()}):
        order = sorted((h for h in acquired if acquired[h][0] == slot), key=lambda h: acquired[h][2])
        for a, b in zip(order, order[1:]):
            if intervals[a][1] > intervals[b][0]:
                overlaps.append((slot, a, b, intervals[a][1] - intervals[b][0]))
            token_a, token_b = acquired[a][1], acquired[b][1]
            decreasing += token_a is None or token_b is None or token_b <= token_a
    recoveries = []
    for when, _, slot in faults:
        following = [at for s, _, at in acquired.values() if s == slot and at > when]
        recoveries.append(min(following) - when if following else float("inf"))
    return {"holds": len(acquired), "most_valid_at_once": most, "over_limit": most > limit, "overlaps": overlaps,
            "decreasing": decreasing, "faults": len(faults), "kills": sum(k == "kill_holder" for _, k, _ in faults),
            "pauses": sum(k == "pause_holder" for _, k, _ in faults),
            "worst_recovery_s": max(recoveries, default=0.0)}


def line(report: dict) -> str:
    return (f"{report['store']}: {report['holds']} holds, {report['kills']} holders killed, {report['pauses']} "
            f"paused; most valid at once {report['most_valid_at_once']} (limit {LIMIT}), overlaps in a slot "
            f"{len(report['overlaps'])}, tokens out of order {report['decreasing']}, worst recovery "
            f"{report['worst_recovery_s']:.2f} s (bound {RECOVERY_BOUND_S:.1f} s), seed {report['seed']}")
