"""Run as a script by tests/test_pulse.py: every method of a renewal pulse, from several threads at once,
while another thread closes it and the reading end of its pipe goes away (the renewal process's death),
trial after trial. A use of a freed or vanished pulse crashes the process (SIGSEGV, SIGABRT), which the
test sees in its exit status; a clean run prints one line of counts and exits 0.

    python tests/pulse_hammer.py TRIALS THREADS {c,py}

Every loop is bounded: a worker makes at most OPS_PER_WORKER calls, and stops early once the closer
has finished.
"""

from __future__ import annotations

import os
import random
import sys
import threading

#: Calls each worker makes at most, per trial.
OPS_PER_WORKER = 200
#: The closer lets the workers make about this many calls before it closes (so that close() lands in
#: the middle of their calls, at a different moment each trial).
CLOSE_AFTER_OPS = (0, 120)


class _Lease:
    """What ``register`` keeps in ``Pulse.leases``: any object."""


def _pulse_class(implementation: str) -> type:
    if implementation == "c":
        from fastlease import _core

        return _core.Pulse
    from fastlease import _core_fallback

    return _core_fallback.Pulse


def _worker(pulse: object, calls: list[int], closed: threading.Event, seed: int) -> None:
    rng = random.Random(seed)
    ids: list[int] = []
    lease = _Lease()
    for _ in range(OPS_PER_WORKER):
        if closed.is_set() and rng.random() < 0.5:
            break
        op = rng.randrange(7)
        if op == 0:
            frame_id = pulse.register(lease, "locks", "key", "owner", "version", 1000, None, 1, 2, 0, 3, 1)  # type: ignore[attr-defined]
            if frame_id:
                ids.append(frame_id)
        elif op == 1 and ids:
            pulse.take_back(ids.pop())  # type: ignore[attr-defined]
        elif op == 2:
            pulse.stage(rng.randrange(1, 1 << 20), b"x" * rng.randrange(64))  # type: ignore[attr-defined]
        elif op == 3:
            pulse.unstage(rng.randrange(1, 1 << 20))  # type: ignore[attr-defined]
        elif op == 4:
            pulse.child  # type: ignore[attr-defined]  # noqa: B018 - the property's C call is the point
        elif op == 5:
            pulse.pulses  # type: ignore[attr-defined]  # noqa: B018
        else:
            pulse.close()  # type: ignore[attr-defined]  # a second closer, from a worker
        calls[0] += 1


def trial(pulse_class: type, threads: int, rng: random.Random) -> int:
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    pulse = pulse_class(write_end, 1)  # a 1 ms interval: the pulse thread writes all the time
    os.close(write_end)  # the pulse writes to its own duplicate
    calls = [0]
    closed = threading.Event()
    workers = [threading.Thread(target=_worker, args=(pulse, calls, closed, rng.random())) for _ in range(threads)]
    for worker in workers:
        worker.start()
    close_after = rng.randrange(*CLOSE_AFTER_OPS)
    for _ in range(100_000):  # bounded: the workers make at most threads * OPS_PER_WORKER calls
        if calls[0] >= close_after or not any(worker.is_alive() for worker in workers):
            break
        os.sched_yield()
    if rng.random() < 0.5:
        os.close(read_end)  # the renewal process died: the pulse's writes now fail (EPIPE)
        read_end = -1
    pulse.close()
    closed.set()
    for worker in workers:
        worker.join(timeout=30)
        if worker.is_alive():
            raise SystemExit("a worker did not finish within 30 s")
    if read_end >= 0:
        os.close(read_end)
    del pulse  # the last Python reference: the pulse thread may still be running its last tick
    return calls[0]


def main(argv: list[str]) -> int:
    trials, threads, implementation = int(argv[0]), int(argv[1]), argv[2]
    pulse_class = _pulse_class(implementation)
    rng = random.Random(int.from_bytes(os.urandom(8), "little"))
    total = sum(trial(pulse_class, threads, rng) for _ in range(trials))
    print(f"{trials} trials, {threads} threads, {total} calls on {pulse_class.__module__}.Pulse")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
