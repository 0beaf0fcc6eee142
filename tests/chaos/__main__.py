"""``python -m tests.chaos --store S --seconds N``: one chaos run; exit status 1 on any violation.
``--election`` runs the election drill (``election_drill.py``) instead, ``--semaphore`` the semaphore drill
(``semaphore_drill.py``), ``--gil`` the GIL drill (``gil_drill.py``)."""

from __future__ import annotations

import argparse
import os
import sys

# The drills share the tests' helpers (``tests/helpers``), as pytest finds them: tests/ on the path, which
# the drills' spawned processes inherit.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from . import election_drill, gil_drill, semaphore_drill  # noqa: E402 - after the path above
from .harness import RECOVERY_BOUND_S, STORES, run


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--store", choices=STORES + ("all",), default="all")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=None, help="replay a run (each run prints its seed)")
    parser.add_argument("--faults", default="", help="comma-separated fault kinds to inject alone (default: all, "
                        "mixed): kill_holder, kill_waiter, pause_holder, clock_jump, lost_response, late_commit, "
                        "stall, partition, reset (DynamoDB, Redis), drop_connection (PostgreSQL, Redis Cluster), "
                        "migrate_slot (Redis Cluster)")
    parser.add_argument("--election", action="store_true", help="the election drill: leaders killed and paused")
    parser.add_argument("--semaphore", action="store_true", help="the semaphore drill: holders killed and paused")
    parser.add_argument("--gil", action="store_true", help="the GIL drill: a holder in a GIL-holding call, a contender")
    args = parser.parse_args()
    if args.election:
        return _elections(args.store, args.seconds, args.seed)
    if args.semaphore:
        return _semaphores(args.store, args.seconds, args.seed)
    if args.gil:
        return _gil(args.store, args.seconds, args.seed)
    failed = False
    for store in (STORES if args.store == "all" else (args.store,)):
        report = run(store, args.seconds, workers=args.workers, seed=args.seed,
                     faults=set(filter(None, args.faults.split(","))) or None,
                     say=lambda line: print(line, flush=True))
        print(report.line(), flush=True)
        print(f"  errors seen by workers: {report['errors']}", flush=True)
        if "dropped_backends" in report:
            print(f"  backends of holders terminated: {report['dropped_backends']}", flush=True)
        if "migrations" in report:
            print(f"  client connections dropped: {report['dropped_clients']}; slot migrations: "
                  f"{report['migrations']}", flush=True)
        bad = (report["lost_updates"] or report["double_commits"] or report["stale_commits"]
               or report["worst_recovery_s"] > RECOVERY_BOUND_S or report["commits"] == 0)
        failed = failed or bool(bad)
    return 1 if failed else 0


def _elections(store: str, seconds: float, seed: int | None) -> int:
    failed = False
    for each in (election_drill.STORES if store == "all" else (store,)):
        report = election_drill.run(each, seconds, seed=seed, say=lambda line: print(line, flush=True))
        print(election_drill.line(report), flush=True)
        failed = failed or bool(report["overlaps"] or report["decreasing"] or report["terms"] == 0
                                or report["worst_failover_s"] > election_drill.FAILOVER_BOUND_S)
    return 1 if failed else 0


def _semaphores(store: str, seconds: float, seed: int | None) -> int:
    failed = False
    for each in (election_drill.STORES if store == "all" else (store,)):
        report = semaphore_drill.run(each, seconds, seed=seed, say=lambda line: print(line, flush=True))
        print(semaphore_drill.line(report), flush=True)
        failed = failed or bool(report["over_limit"] or report["overlaps"] or report["decreasing"]
                                or report["holds"] == 0
                                or report["worst_recovery_s"] > semaphore_drill.RECOVERY_BOUND_S)
    return 1 if failed else 0


def _gil(store: str, seconds: float, seed: int | None) -> int:
    failed = False
    for each in (election_drill.STORES if store == "all" else (store,)):
        report = gil_drill.run(each, seconds, seed=seed, say=lambda line: print(line, flush=True))
        print(gil_drill.line(report), flush=True)
        for claimed_for, held, took in report["overlaps"]:
            print(f"  OVERLAP: acquired {claimed_for:.3f} s inside the holder's claim: {held} {took}", flush=True)
        failed = failed or bool(report["overlaps"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
