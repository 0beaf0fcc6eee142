"""A small in-process demo of fastlease on the in-memory store (the SQLite multi-process demo replaces it).

Six workers, each with its own client (as separate processes would have), share one store and
contend on three customer keys with a 1 s lease. Halfway through, one worker crashes while holding a
lease: its renewals stop and it never releases. Another worker takes that key over after observing
the abandoned row unchanged for one full lease. Run: ``make demo``.
"""

from __future__ import annotations

import random
import threading
import time

import fastlease
from fastlease import LockNotAcquired, MemoryClient, SyncDistributedLock
from fastlease.stores.memory import MemoryStore

WORKERS = 6
CUSTOMERS = ("acme", "globex", "initech")
LEASE_S = 1.0
RUN_S = 6.0


def main() -> None:
    store = MemoryStore()
    clients = [MemoryClient(store=store) for _ in range(WORKERS)]
    stats = {w: {"acquired": 0, "wait_ms": 0.0, "renewals": 0, "timeouts": 0} for w in range(WORKERS)}
    crash = threading.Event()
    crashed: dict[str, object] = {}
    takeover: dict[str, float] = {}
    stop_at = time.monotonic() + RUN_S
    print(f"fastlease {fastlease.__version__} demo, engine={fastlease.IMPLEMENTATION}: {WORKERS} workers, "
          f"customers {', '.join(CUSTOMERS)}, lease {LEASE_S:g}s, {RUN_S:g}s")

    def worker(index: int) -> None:
        client = clients[index]
        rng = random.Random(index)
        while time.monotonic() < stop_at:
            customer = rng.choice(CUSTOMERS)
            guard = SyncDistributedLock(client, table="demo_locks", key=f"customer:{customer}",
                                        lease_duration=LEASE_S, wait_timeout=2.0)
            try:
                guard.__enter__()
            except LockNotAcquired:
                stats[index]["timeouts"] += 1
                continue
            got_at = time.monotonic()
            if customer == crashed.get("customer") and "at" in crashed and customer not in takeover:
                takeover[customer] = got_at - crashed["at"]  # type: ignore[operator]
                print(f"  worker {index} took over customer:{customer} "
                      f"{takeover[customer]:.2f}s after worker {crashed['worker']} crashed")
            if crash.is_set() and not crashed:
                crashed.update(customer=customer, worker=index, at=time.monotonic())
                print(f"  worker {index} CRASHES holding customer:{customer}: no renewal, no release")
                client.close()  # the renewal thread stops, as if the process were killed
                return
            time.sleep(rng.uniform(0.05, 0.4))  # the work: longer than nothing, shorter than the lease
            guard.__exit__(None, None, None)
            metrics = guard.metrics
            stats[index]["acquired"] += 1
            stats[index]["wait_ms"] += metrics.wait_ms
            stats[index]["renewals"] += metrics.renewals

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(WORKERS)]
    for thread in threads:
        thread.start()
    for second in range(int(RUN_S)):
        time.sleep(1)
        if second == int(RUN_S) // 2 - 1:
            crash.set()
        total = sum(s["acquired"] for s in stats.values())
        print(f"  t={second + 1}s  acquisitions so far: {total}")
    for thread in threads:
        thread.join(5)
    for client in clients:
        client.close()

    print(f"\n{'worker':>6} {'acquired':>9} {'mean wait ms':>13} {'renewals':>9} {'timeouts':>9}")
    for index, s in stats.items():
        mean = s["wait_ms"] / s["acquired"] if s["acquired"] else 0.0
        note = "  (crashed)" if crashed.get("worker") == index else ""
        print(f"{index:>6} {s['acquired']:>9} {mean:>13.1f} {s['renewals']:>9} {s['timeouts']:>9}{note}")
    if takeover:
        for customer, seconds in takeover.items():
            print(f"takeover of customer:{customer}: {seconds:.2f}s after the crash (lease {LEASE_S:g}s; "
                  "at least one full lease of unchanged observation, plus a poll)")
    else:
        print("no takeover happened within the demo's time")


if __name__ == "__main__":
    main()
