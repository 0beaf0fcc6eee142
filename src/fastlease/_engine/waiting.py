# cython: language_level=3, embedsignature=True, freethreading_compatible=True, annotation_typing=False
"""A lease while it waits for its key: how long it sleeps and who wakes it (this client's queue, the
store's release feed, and the store's line of waiters where it keeps one), the waiting mark, the
courtesy yield of a returning releaser, cancellation, and the message of a wait that ran out.
``lease.Lease`` adds the acquisition's attempts and the release.
"""

from __future__ import annotations

import threading

from .._logging import get_logger
from ..exceptions import LockNotAcquired, StoreError
from .engine import describe_store_error
from .held import HeldLease
from .timing import NS_PER_MS as _NS_PER_MS
from .timing import (
    POLL_IN_LINE_MS,
    POLL_INTERVAL_MS,
    SYSTEM_CLOCK,
    jitter,
    new_token,
    request_timeout_ns,
    seconds_text,
)

TYPE_CHECKING = False  # typing is not imported at run time: see _typing.py
if TYPE_CHECKING:  # annotations only
    from typing import Optional

    from .contention import ReleaseSignals

BUILT_FROM = "" if __file__.endswith((".py", ".pyc")) else FASTLEASE_SOURCE_CRC.decode("ascii")  # type: ignore[name-defined]  # noqa: F821

_log = get_logger("fastlease.engine")

#: The longest sleep between polls outside a line (POLL_INTERVAL_MS, jittered up to 150%).
_LONGEST_POLL_NS = POLL_INTERVAL_MS * 3 // 2 * _NS_PER_MS


class WaitingLease(HeldLease):
    """A lease's waiting between attempts (``lease.Lease`` makes the attempts)."""

    def _prepare_a_place(self, signals: ReleaseSignals, start_ns: int) -> None:
        """Our id in the store's line for the key, if we have to wait; a lock's waiter, where the store hands
        leases over, also offers an owner to take the lease in. A semaphore's waiters stand in the semaphore
        key's line, where the store can name it beside a slot's."""
        if self._kind and self._line_key is None:
            return
        self._waiter = new_token()
        if self._line_key is None and self._line.hands_over:
            self._offer_owner = self.owner_prefix + new_token()
            # Our release just handed the key over: its new holder has it, so look (in line) first.
            self._row_seen = signals.look_first(self._signal_key, start_ns)

    def _let_a_waiter_go_first(self, signals: ReleaseSignals) -> None:
        """Others are waiting for this key (``ReleaseSignals.should_yield``): let one go first.
        The wait outlasts the longest poll interval, so every waiter polls at least once meanwhile."""
        courtesy_ns = int(POLL_INTERVAL_MS * _NS_PER_MS * (1.5 + 0.25 * jitter()))
        self._wait_turn(signals, min(courtesy_ns, self.wait_ms * _NS_PER_MS), False)

    def _wait_ran_out(self, last_error: Optional[BaseException], reached: bool) -> LockNotAcquired:
        """The wait budget is spent: the error that says why, from what the wait saw (the last store
        error, whether the store was ever reached, this client's own hold, a row that never changed)."""
        self._wait_timeouts += 1
        budget = seconds_text(self.wait_ms * _NS_PER_MS)
        message = f"lease on {self.key!r} in table {self.table!r} not acquired within {budget}"
        if last_error is not None:
            message += f"; last store error: {describe_store_error(last_error)}"
            if not reached:
                _log.warning("the store could not be reached for the whole wait: %s", message)
        elif self._scheduler.holds(self._cache_key, self):
            message += ("; this client already holds that key (guards are not reentrant: the holder may be "
                        "an outer block of this very thread)")
        elif self._row_seen and self.wait_ms < self._seen_lease_ms and self._first_seen == self._last_seen:
            message += self._takeover_advice()  # (the row never changed while we waited: its holder may be dead)
        return LockNotAcquired(message, key=self.key)

    def _takeover_advice(self) -> str:
        """For a wait shorter than the holder's lease: how long the row was seen unchanged of what a
        takeover needs, and the wait that would take over a crashed holder's lease in one run."""
        return (f"; its row was seen unchanged for {self._seen_unchanged_ns / 1e9:.1f} s of the "
                f"{self._seen_lease_ms / 1000:g} s a takeover needs (one whole lease, on this client's clock): if its "
                f"holder crashed, a wait_timeout of at least {(self._seen_lease_ms + 2 * POLL_INTERVAL_MS) / 1000:g} s "
                "takes it over in one run, on any host")

    def cancel(self) -> None:
        """Give up an acquisition from any thread. The waiting stops at its next step, and a write
        confirmed after this is deleted rather than held: a late success never revives a cancelled
        guard. No effect once the lease is held (release it instead)."""
        self._cancelled = True
        ticket = self._ticket
        if ticket is not None:
            ticket.set()

    def _wait_turn(self, signals: ReleaseSignals, delay_ns: int, after_attempt: bool) -> None:
        """Sleep up to delay_ns in this client's queue for the key (woken early on our turn, or when
        the store's feed reports a release anywhere)."""
        if self._ticket is None:
            self._ticket = threading.Event()
        if self._watch is None and self._feed is not None:
            watched = self.key if self._line_key is None else self._line_key  # (where our turn is announced)
            if self._waiter is None:
                watch = self._watch = self._feed.watch(self.table, watched, self._wake_on_release)
            else:
                watch = self._watch = self._feed.watch(self.table, watched, self._wake_on_release, self._waiter,
                                                       self._wake_in_turn)
            if not watch.was_ready:
                # A new subscription: a release between our last read and the server's confirmation
                # would not reach us. Wait for the confirmation (briefly: no longer than a usual poll,
                # since the delay of a waiter in line assumed it), then look again at once.
                self._clock.wait(watch.ready, min(delay_ns, _LONGEST_POLL_NS) / 1e9)
                if after_attempt:
                    return
        reader = None
        watch = self._watch
        if self._waiter is not None and watch is not None and watch.ready.is_set() and self._clock is SYSTEM_CLOCK:
            # In line, with the feed's reports flowing: our turn comes as a message, so wait reading the
            # feed ourselves where the feed can (no thread switch between the message and our write).
            reader = getattr(self._feed, "wait_reading", None)
        signals.wait(self._clock, self._signal_key, self._ticket, delay_ns / 1e9, reader)

    def _wake_on_release(self) -> None:
        """The feed saw the key released somewhere: wake this client's oldest waiter on it."""
        self._signals.notify(self._signal_key)

    def _wake_in_turn(self, freed: Optional[str] = None) -> None:
        """The feed saw the key released to us, the head of its line: write at once, without a read (a
        semaphore's waiter is told which slot's key was ``freed``, and writes there). To a lock's waiter
        that offered to take the lease over, "=<version> <fence>" says the release handed it over to us."""
        version, _, fence = (freed or "")[1:].partition(" ")
        if self._offer_owner is not None and freed and freed[0] == "=" and fence.isdigit():
            self._handed = (version, int(fence))
        else:
            self._freed_key = freed
            self._turn = True
        ticket = self._ticket
        if ticket is not None:
            ticket.set()

    def _poll_ms(self) -> int:
        """How often to look again while contended: less often in the store's line while the feed has
        our watch confirmed, or is about to make it (the release that gives us the turn then wakes us);
        else the usual poll (a Redis Cluster without sharded pub/sub, say, delivers no wake-up, and the
        turn comes by polls). A watch yet to be made is waited on for a usual poll at most (_wait_turn).

        In line, the longer poll is capped at an eighth of the holder's lease: a takeover comes a lease
        after the first read that saw the holder's last renewal, so a crashed holder is taken over up
        to 1.5 polls late, which must stay small beside the lease (a 1 s lease: the usual 125 ms poll)."""
        watch = self._watch
        if self._waiter is not None and self._feed is not None and (watch is None or watch.ready.is_set()):
            lease_ms = self._seen_lease_ms if self._seen_lease_ms else self.lease_ms
            return max(POLL_INTERVAL_MS, min(POLL_IN_LINE_MS, lease_ms // 8))
        return POLL_INTERVAL_MS

    def _end_wait(self, signals: ReleaseSignals, acquired: bool) -> None:
        """The acquisition is over, held or not: leave this client's queue, the store's line (without
        the lease: holding it, the put has taken us out) and the feed."""
        if self._ticket is not None:
            signals.leave(self._signal_key, self._ticket, acquired)
        if self._waiter is not None and not acquired and self._reads:
            self._leave_line()
        if self._watch is not None:
            self._feed.unwatch(self._watch)
            self._watch = None

    def _leave_line(self) -> None:
        """The wait ended without the lease: give up our place in the key's line (waking the next waiter
        if we had the turn). Best effort: a place not given up is skipped after the store's ALIVE_MS, and a
        lease handed over to us then expires with the handover's PX (timing.HANDED_LEASE_MS)."""
        try:
            # (With our offer's owner, a lease handed over to us meanwhile, which we did not take, is deleted.)
            self._line.leave_line(self.table, self.key, self._waiter, request_timeout_ns(self.lease_ms) / 1e9,
                                  self._line_key, self._offer_owner)
        except StoreError as error:
            _log.debug("leaving the line for %r failed: %s", self.key, error)

    def _mark_waiting(self, owner: str, version: str, deadline_ns: int) -> None:
        """Tell the holder (in any process) that we have been waiting: it yields the next turn on
        release. Only a hint: any outcome is fine, and a failure never ends the wait."""
        self._writes += 1
        try:
            timeout_s = self._timeout_s(deadline_ns, self._mono())
            if not self._store.mark_waiting(self.table, self.key, owner, version, timeout_s, self):
                self._conditional_failures += 1  # renewed, marked or released meanwhile
            else:
                self._marked_owner = owner
                # The holder will yield its next turn: look again soon, so the contender that has
                # waited longest (only such a one marks) is the likeliest to take it.
                soon_ns = int(POLL_INTERVAL_MS * _NS_PER_MS * (0.0625 + 0.125 * jitter()))
                self._hint_ns = min(self._hint_ns, soon_ns)
        except StoreError as error:
            self._request_failures += 1
            _log.debug("waiting mark on %r failed: %s", self.key, error)
