# cython: language_level=3, embedsignature=True, freethreading_compatible=True, annotation_typing=False
"""The renewal scheduler: one thread per client, a heap of due renewals, a bounded pool of workers."""

from __future__ import annotations

import heapq
import threading
import time

from .timing import NEVER_SET, RENEWAL_WORKERS, SCHEDULER_IDLE_EXIT_MS, new_mutex

TYPE_CHECKING = False  # typing is not imported at run time: see _typing.py
if TYPE_CHECKING:  # annotations only
    from concurrent.futures import ThreadPoolExecutor
    from typing import Optional

    from .timing import Clock

BUILT_FROM = "" if __file__.endswith((".py", ".pyc")) else FASTLEASE_SOURCE_CRC.decode("ascii")  # type: ignore[name-defined]  # noqa: F821


# ---------------------------------------------------------------------------------------------
# Renewal scheduler: one thread per client, a heap of due renewals
# ---------------------------------------------------------------------------------------------
class Renewable:
    """What the scheduler asks of a lease (``lease.Lease`` is the one kind): its place in the heap, the
    renewal step, and whether it holds a key. The scheduler knows no more of a lease than this, so it
    sits below the lease in the engine's layers."""

    # Set by the lease when it is made, then read and written by the scheduler under its lock.
    _renew_at_ns: int  # due time of the live heap entry; 0 when unscheduled
    _renewing: bool  # a worker runs its renewal step now

    def renew_step(self, now_ns: int) -> int:
        """Run one renewal step; the monotonic time of the next one, or 0 for none."""
        raise NotImplementedError

    def holds_key(self, cache_key: tuple[str, str]) -> bool:
        """Whether this lease is held, on ``cache_key`` (table, key)."""
        raise NotImplementedError


class RenewalScheduler:
    """Renews every held lease of one client: one scheduler thread, a bounded pool of request workers.

    The heap holds (due_ns, sequence, lease). Cancelling is lazy: an entry is live only while
    ``lease._renew_at_ns == due_ns``; stale entries are dropped when popped, and the heap is compacted
    when they outnumber the live ones, so short holds cannot grow it without bound. A clock that
    drives the scheduler itself (``FakeClock``) gets no thread: it calls ``run_due`` as time moves.
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._heap: list[tuple[int, int, Renewable]] = []
        self._sequence = 0
        self._stale = 0
        self._mutex = new_mutex()  # guards the heap and the fields below; schedule and cancel on every hold
        # Set to wake the scheduler thread before its timed wait ends (an earlier renewal, close). The
        # thread clears it and then looks at the heap under _mutex, so a wake-up is never lost.
        self._wake = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._workers: Optional[ThreadPoolExecutor] = None  # made at the first dispatch
        self._closed = False
        self._manual = bool(clock.attach_scheduler(self))
        # Lateness of renewals (start time minus due time), under _mutex: count, max, total.
        self._late_count = 0
        self._late_max_ns = 0
        self._late_total_ns = 0

    def __len__(self) -> int:
        """Live scheduled renewals."""
        with self._mutex:
            return len(self._heap) - self._stale

    def heap_size(self) -> int:
        """Entries in the heap, stale ones included (they are compacted away as they accumulate)."""
        with self._mutex:
            return len(self._heap)

    def check_open(self) -> None:
        """Raise RuntimeError once the client is closed: nothing could renew a new lease."""
        if self._closed:
            raise RuntimeError("the client is closed: create a new client")

    def schedule(self, lease: Renewable, due_ns: int) -> None:
        """Renew ``lease`` at ``due_ns`` (monotonic); starts the thread on first use."""
        self._mutex.acquire()  # not `with`: on every hold's path (see lease.Lease.acquire)
        try:
            self.check_open()
            self._push_locked(lease, due_ns)
        finally:
            self._mutex.release()

    def _push_locked(self, lease: Renewable, due_ns: int) -> None:
        if lease._renew_at_ns:
            self._stale += 1
        lease._renew_at_ns = due_ns
        self._sequence += 1
        earliest = not self._heap or due_ns < self._heap[0][0]
        heapq.heappush(self._heap, (due_ns, self._sequence, lease))
        if self._manual:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="fastlease-renewal", daemon=True)
            self._thread.start()
        elif earliest:
            self._wake.set()

    def holds(self, cache_key: tuple[str, str], besides: Renewable) -> bool:
        """Whether a lease of this client other than ``besides`` holds ``cache_key`` now: every held
        lease has a renewal entry. Only for messages (a scan of the heap), never on a hold's path."""
        with self._mutex:
            for entry in self._heap:
                other = entry[2]
                if other is not besides and other.holds_key(cache_key):
                    return True
        return False

    def cancel(self, lease: Renewable) -> bool:
        """Unschedule ``lease``; True if a worker is running its renewal step right now."""
        self._mutex.acquire()  # not `with`: on every hold's path (see lease.Lease.acquire)
        try:
            if lease._renew_at_ns:
                lease._renew_at_ns = 0
                self._stale += 1
                if self._stale > 64 and self._stale * 2 > len(self._heap):
                    self._heap = [entry for entry in self._heap if entry[2]._renew_at_ns == entry[0]]
                    heapq.heapify(self._heap)
                    self._stale = 0
            return lease._renewing
        finally:
            self._mutex.release()

    def wait_idle(self, lease: Renewable, timeout_ns: int) -> bool:
        """Wait (up to ``timeout_ns``, real time) until no worker runs a renewal step of ``lease``;
        rare, so it polls with a growing pause instead of giving every lease an event."""
        deadline_ns = time.monotonic_ns() + timeout_ns
        pause_s = 0.0002
        while True:
            with self._mutex:
                if not lease._renewing:
                    return True
            if time.monotonic_ns() >= deadline_ns:
                return False
            NEVER_SET.wait(pause_s)
            pause_s = min(pause_s * 2, 0.005)

    def next_due_ns(self) -> int:
        """Due time of the earliest live renewal, or 0 when none is scheduled."""
        with self._mutex:
            heap = self._heap
            while heap and heap[0][2]._renew_at_ns != heap[0][0]:
                heapq.heappop(heap)
                self._stale -= 1
            return heap[0][0] if heap else 0

    def _pop_due(self, now_ns: int) -> Optional[Renewable]:
        """Under the lock: pop the next due live entry, or None."""
        heap = self._heap
        while heap and heap[0][0] <= now_ns:
            due_ns, _, lease = heapq.heappop(heap)
            if lease._renew_at_ns == due_ns:
                lease._renew_at_ns = 0
                lease._renewing = True
                late_ns = now_ns - due_ns
                self._late_count += 1
                self._late_total_ns += late_ns
                if late_ns > self._late_max_ns:
                    self._late_max_ns = late_ns
                return lease
            self._stale -= 1
        return None

    def lateness(self) -> tuple[int, int, int]:
        """(renewals started, max lateness ns, total lateness ns): how far behind their due times."""
        with self._mutex:
            return (self._late_count, self._late_max_ns, self._late_total_ns)

    def _renew(self, lease: Renewable, now_ns: int) -> None:
        """A worker thread: one renewal step, then the next due time back on the heap."""
        self._reschedule(lease, lease.renew_step(now_ns))

    def _dispatch(self, lease: Renewable, now_ns: int) -> None:
        if self._workers is None:
            from concurrent.futures import ThreadPoolExecutor

            self._workers = ThreadPoolExecutor(RENEWAL_WORKERS, thread_name_prefix="fastlease-renewer")
        try:
            self._workers.submit(self._renew, lease, now_ns)
        except RuntimeError:  # the pool was shut down by close(): leases lapse locally, as documented
            self._reschedule(lease, 0)

    def _reschedule(self, lease: Renewable, next_ns: int) -> None:
        """A renewal step has ended: schedule the next one (``next_ns``; 0 for none)."""
        with self._mutex:
            lease._renewing = False
            if next_ns and not self._closed:
                self._push_locked(lease, next_ns)

    def run_due(self) -> int:
        """Run every renewal due now in the calling thread; returns how many ran (manual clocks)."""
        ran = 0
        while True:
            now_ns = self._clock.monotonic_ns()
            with self._mutex:
                lease = self._pop_due(now_ns)
            if lease is None:
                return ran
            self._reschedule(lease, lease.renew_step(now_ns))
            ran += 1

    def _run(self) -> None:
        clock = self._clock
        while True:
            timeout_s = SCHEDULER_IDLE_EXIT_MS / 1000
            with self._mutex:
                if self._closed:
                    self._thread = None
                    return
                now_ns = clock.monotonic_ns()
                lease = self._pop_due(now_ns)
                if lease is None and self._heap:
                    timeout_s = (self._heap[0][0] - now_ns) / 1e9
            if lease is not None:
                self._dispatch(lease, now_ns)
                continue
            woken = self._wake.wait(timeout_s)  # releases the GIL while it waits
            self._wake.clear()
            if not woken:
                with self._mutex:
                    if not self._heap and not self._closed:
                        self._thread = None  # idle: exit; the next schedule() starts a new thread
                        return

    def close(self) -> None:
        """Stop the thread; held leases stop renewing and lapse locally at their validity."""
        with self._mutex:
            self._closed = True
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)
        if self._workers is not None:
            self._workers.shutdown(wait=False)

