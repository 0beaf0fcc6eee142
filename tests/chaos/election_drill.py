"""The election drill: candidate processes run ``Election.run`` on one key while the drill SIGKILLs and
SIGSTOPs whoever leads; then the checker proves, from what the leaders claimed, that no two terms were
valid at once and that terms strictly increased.

Each candidate reports on its pipe, with readings of the monotonic clock (system-wide on Linux, so every
process's readings are on one timeline):

* ``elected``: the term's number, when ``campaign()`` returned;
* ``valid``: the term, and ``term.valid_until()``, the end of the validity the engine claims now; sent
  about every 20 ms while the leader works, so a leader that is killed or paused right after still has
  its last claim on record;
* ``ending``: the term, when the leader's work returned, before the resignation.

The checker, independent of timing: a term's claimed interval runs from its ``elected`` reading to the
latest end it claimed, cut at its ``ending`` reading if it had one (the release comes after it, and
nobody else can be elected before the release). Sorted by the time they were elected, the terms'
numbers must strictly increase, and each term's interval must end no later than the next term was
elected. A killed leader's claim stands in full: its successor must have been elected after it ran out.
Faults: ``kill_leader`` (SIGKILL; a fresh candidate replaces it) and ``pause_leader`` (SIGSTOP for 1.5
leases, then SIGCONT), one at a time, from a printed seed. Memory is not drilled: its candidates would
be threads, which cannot be killed or stopped (tests/test_election.py covers it).
"""

from __future__ import annotations

import os
import random
import signal
import tempfile
import threading
import time
from multiprocessing.connection import wait as wait_for_pipes
from typing import Any, Callable, Optional

from . import workload
from .harness import SPAWN, _Setup, stop_all

STORES = ("sqlite", "redis", "redis-cluster", "dynamodb", "postgres")
KEY = "leader"
CANDIDATES = 3
REPORT_EVERY_S = 0.02
#: A new leader must be elected within this long of a kill or pause (a lease of observation after the
#: last renewal seen, polls, request timeouts).
FAILOVER_BOUND_S = 2 * workload.LEASE_S + 1.0


def _election_client(store: str, target: str) -> Any:
    if store == "dynamodb":
        from fastlease.dynamodb import DynamoDBClient

        return DynamoDBClient(workload.plain_client(store, target), fencing=True)  # terms need tokens
    return workload.make_client(store, target, None)


def _candidate_main(store: str, target: str, stop_at: float, number: int, sender: Any) -> None:
    from fastlease.election import Election

    client = _election_client(store, target)
    election = Election(client, table=workload.TABLE, key=KEY, lease_duration=workload.LEASE_S,
                        identity=f"candidate-{number}")
    timer = threading.Timer(max(0.0, stop_at - time.monotonic()), election.stop)
    timer.daemon = True
    timer.start()

    def lead(term: Any) -> None:
        sender.send(("elected", term.number, time.monotonic()))
        while True:  # bounded: the term ends at its loss, or at stop() when the run ends
            until = term.valid_until()
            if until is None:
                break
            sender.send(("valid", term.number, until))
            if term.wait(REPORT_EVERY_S):
                break
        sender.send(("ending", term.number, time.monotonic()))

    try:
        election.run(lead)
    finally:
        client.close()


class Reporter:
    """A drill's process (``main(*args, sender)``) and the pipe it reports on; ``stop_all`` ends it."""

    def __init__(self, main: Callable[..., None], *args: Any) -> None:
        receiver, sender = SPAWN.Pipe(duplex=False)
        self.events = receiver
        self.process = SPAWN.Process(target=main, args=(*args, sender), daemon=True)
        self.process.start()
        sender.close()
        self.stopped = False
        self.finished = False  # its pipe reached end of file: it exited, everything read
        self.holding: Any = None  # what the drill knows it holds now


def receive(pool: list[Reporter], timeout: float) -> list[tuple[Reporter, tuple[Any, ...]]]:
    """The events the live processes of ``pool`` have reported, waiting up to ``timeout`` for the first;
    a process whose pipe ends (it exited, or was killed, cutting a message short) is marked finished."""
    alive = [reporter for reporter in pool if not reporter.finished]
    received = []
    for ready in wait_for_pipes([reporter.events for reporter in alive], timeout=timeout):
        reporter = next(r for r in alive if r.events is ready)
        try:
            received.append((reporter, ready.recv()))
        except (EOFError, OSError):
            reporter.finished = True
    return received


def run_drill(store: str, seconds: float, seed: Optional[int], say: Callable[[str], None], title: str,
              drill: Callable[[_Setup, float, random.Random, int], dict]) -> dict:
    """Set ``store`` up, say ``title`` with the seed, run ``drill`` on it, and tear the store down."""
    if store not in STORES:
        raise ValueError(f"store must be one of {STORES}, got {store!r}")
    seed = random.SystemRandom().randrange(2**32) if seed is None else seed
    say(f"{title} on {store}, {seconds:g} s, seed {seed}")
    with tempfile.TemporaryDirectory(prefix="fastlease-drill-") as directory:
        setup = _Setup(store, directory)
        try:
            return drill(setup, seconds, random.Random(seed), seed)
        finally:
            setup.close()


def run(store: str, seconds: float, *, seed: Optional[int] = None, say: Callable[[str], None] = print) -> dict:
    """One drill on ``store``: the report of ``check``, with the faults' counts and the worst failover."""
    return run_drill(store, seconds, seed, say, f"election drill: {CANDIDATES} candidates", _drill)


def _drill(setup: _Setup, seconds: float, rng: random.Random, seed: int) -> dict:
    deadline = time.monotonic() + seconds
    pool = [Reporter(_candidate_main, setup.store, setup.target, deadline, n) for n in range(CANDIDATES)]
    events: list[tuple[str, int, float]] = []
    faults: list[tuple[float, str]] = []
    leader: dict[int, Reporter] = {}  # term -> the candidate that reported it
    resume: list[tuple[float, Reporter]] = []
    next_fault = time.monotonic() + 1.0 + rng.uniform(0.2, 0.8)
    try:
        while time.monotonic() < deadline + 15:  # bounded: candidates stop at the deadline
            if all(c.finished for c in pool):
                break
            for candidate, event in receive(pool, 0.05):
                events.append(event)
                if event[0] == "elected":
                    leader[event[1]] = candidate
            now = time.monotonic()
            for when, candidate in list(resume):
                if now >= when:
                    os.kill(candidate.process.pid, signal.SIGCONT)
                    candidate.stopped = False
                    resume.remove((when, candidate))
            # No fault later than a failover's bound before the end: candidates stop campaigning at the
            # deadline, and a fault must leave time for the next election it is measured by.
            if now < next_fault or now > deadline - FAILOVER_BOUND_S or resume or not leader:
                continue
            target = leader[max(leader)]
            if not target.process.is_alive() or target.finished:
                continue
            next_fault = now + workload.LEASE_S + rng.uniform(0.8, 1.6)
            if rng.random() < 0.5:
                os.kill(target.process.pid, signal.SIGKILL)
                target.process.join(10)
                faults.append((now, "kill_leader"))
                pool.append(Reporter(_candidate_main, setup.store, setup.target, deadline, len(pool)))
            else:
                os.kill(target.process.pid, signal.SIGSTOP)
                target.stopped = True
                resume.append((now + 1.5 * workload.LEASE_S, target))
                faults.append((now, "pause_leader"))
    finally:
        stop_all(pool)
    report = check(events, faults)
    report.update(store=setup.store, seed=seed)
    return report


def check(events: list[tuple[str, int, float]], faults: list[tuple[float, str]]) -> dict:
    """Overlaps (a term claimed validity after the next term was elected), terms that did not strictly
    increase in the order they were elected, and the worst time from a fault to the next election."""
    elected: dict[int, float] = {}
    claimed: dict[int, float] = {}
    ended: dict[int, float] = {}
    repeated = 0
    for kind, term, when in events:
        if kind == "elected":
            repeated += term in elected
            elected[term] = when
        elif kind == "valid":
            claimed[term] = max(claimed.get(term, when), when)
        else:
            ended[term] = when
    order = sorted(elected, key=lambda term: elected[term])
    decreasing = repeated + sum(1 for a, b in zip(order, order[1:]) if b <= a)
    overlaps = []
    for a, b in zip(order, order[1:]):
        end = min(claimed.get(a, elected[a]), ended.get(a, float("inf")))
        if end > elected[b]:
            overlaps.append((a, b, end - elected[b]))
    failovers = []
    for when, _ in faults:
        following = [elected[t] for t in order if elected[t] > when]
        failovers.append(following[0] - when if following else float("inf"))
    return {"terms": len(order), "overlaps": overlaps, "decreasing": decreasing, "faults": len(faults),
            "kills": sum(kind == "kill_leader" for _, kind in faults),
            "pauses": sum(kind == "pause_leader" for _, kind in faults),
            "worst_failover_s": max(failovers, default=0.0)}


def line(report: dict) -> str:
    return (f"{report['store']}: {report['terms']} terms, {report['kills']} leaders killed, {report['pauses']} "
            f"paused; overlapping terms {len(report['overlaps'])}, terms out of order {report['decreasing']}, "
            f"worst failover {report['worst_failover_s']:.2f} s (bound {FAILOVER_BOUND_S:.1f} s), "
            f"seed {report['seed']}")
