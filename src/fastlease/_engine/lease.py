# cython: language_level=3, embedsignature=True, freethreading_compatible=True, annotation_typing=False
"""The lease: one acquisition of one key, the protocol's state machine. Acquisition (wait, take over,
reconcile) and release are here, with the strict reading of a stored row; its waiting between attempts
is ``waiting.WaitingLease``, and its state and renewal ``held.HeldLease``.

Stores below the engine are single atomic operations; the public API above it converts seconds to
milliseconds and shapes the guards. The rules are stated in ``docs/protocol.md``; the map of the
layers is ``docs/architecture.md``.
"""

from __future__ import annotations

from .._logging import get_logger
from .._typing import cast
from ..exceptions import LockLost, LockNotAcquired, LockReleaseError, StoreError
from ..stores.base import DELETED_WITH_WAITERS, HANDED_OVER, NOT_DELETED
from .engine import check_not_forked
from .held import ACQUIRING, FAILED, HELD, LOST, NEW, RELEASED, RELEASING, STATE_NAMES
from .keys import check_holder_kind, check_row
from .timing import (
    DELEGATE_MIN_LEASE_MS,
    ERROR_BACKOFF_MS,
    HANDED_FIRST_RENEWAL_MS,
    HANDED_LEASE_MS,
    NEVER_SET,
    WAITING_MARK_AFTER_MS,
    cleanup_budget_ns,
    jitter,
    new_token,
    next_backoff_ns,
    renew_interval_ns,
    request_timeout_ns,
    seconds_text,
    validity_ns,
)
from .timing import NS_PER_MS as _NS_PER_MS
from .waiting import WaitingLease

TYPE_CHECKING = False  # typing is not imported at run time: see _typing.py
if TYPE_CHECKING:  # annotations only
    from typing import Any, Callable, Optional

    from .engine import Observer  # noqa: F401  # named in cast() strings

BUILT_FROM = "" if __file__.endswith((".py", ".pyc")) else FASTLEASE_SOURCE_CRC.decode("ascii")  # type: ignore[name-defined]  # noqa: F821

_log = get_logger("fastlease.engine")


class Lease(WaitingLease):
    """One acquisition of one key: the protocol state machine. Single use."""

    # ---- acquisition (caller's thread) -------------------------------------------------------
    def acquire(self) -> None:
        """NEW -> HELD, or raise LockNotAcquired / MalformedLockRow / StoreError (state FAILED).

        The wait policy: one attempt; while contended, wait for the shorter of the poll interval and
        the time until a takeover could be allowed, or until this client releases the key; transient
        store errors back off exponentially. Never beyond the wait budget.
        """
        self._begin_acquisition()
        start_ns = self._acquire_start_ns = self._mono()
        deadline_ns = start_ns + self.wait_ms * _NS_PER_MS
        backoff_ns = ERROR_BACKOFF_MS * _NS_PER_MS
        last_error: Optional[BaseException] = None  # the last attempt's store error; None once one got through
        reached = False  # some attempt got an answer from the store
        signals = self._signals
        acquired = False
        if self.wait_ms and self._line is not None:
            self._prepare_a_place(signals, start_ns)
        try:
            # The store's line takes turns on its own; without one, a returning releaser lets others go first.
            if self.wait_ms and self._waiter is None and signals.should_yield(self._signal_key, start_ns):
                self._let_a_waiter_go_first(signals)
            while True:
                if self._ticket is not None:
                    self._ticket.clear()  # a wake-up from now on is for the next attempt
                try:
                    # Requests get their full timeout even when the wait budget is shorter (or 0):
                    # the budget limits waiting for contention, not the network.
                    if self._attempt(max(deadline_ns, self._mono() + request_timeout_ns(self.lease_ms))):
                        self._wait_ns = self._mono() - start_ns
                        if self._observer is not None:  # (inside the try: should it raise, nothing is held)
                            self._observed = self._observer.acquired(self, self._wait_ns)
                        acquired = True
                        return
                    delay_ns = min(self._hint_ns, int(self._poll_ms() * _NS_PER_MS * (0.5 + jitter())))
                    backoff_ns = ERROR_BACKOFF_MS * _NS_PER_MS
                    last_error = None
                    reached = True
                except StoreError as error:
                    last_error = error
                    delay_ns = int(backoff_ns * (0.5 + jitter()))
                    backoff_ns = next_backoff_ns(backoff_ns)
                remaining_ns = deadline_ns - self._mono()
                if self.wait_ms == 0 or remaining_ns <= 0 or self._cancelled:
                    break
                # A wait that would cross the deadline is cut to it, then one last attempt is made.
                self._wait_turn(signals, min(delay_ns, remaining_ns), True)
                if self._cancelled:
                    break
        except BaseException as error:
            self._fail_acquisition(start_ns, error)
            raise
        finally:
            self._end_wait(signals, acquired)
        self._fail_acquisition(start_ns, None)
        if self._cancelled:
            raise LockNotAcquired(f"acquisition of {self.key!r} in table {self.table!r} was cancelled", key=self.key)
        raise self._wait_ran_out(last_error, reached) from last_error

    def _begin_acquisition(self) -> None:
        """NEW -> ACQUIRING, in the process and on the client that made the guard (single use)."""
        check_not_forked(self._pid)
        self._scheduler.check_open()
        self._mutex.acquire()  # not `with`: on every hold's path, where it costs half as much compiled
        try:
            if self.state != NEW:
                raise RuntimeError("lease guards are single-use: create a new guard for each acquisition")
            self.state = ACQUIRING
        finally:
            self._mutex.release()

    def _fail_acquisition(self, start_ns: int, error: Optional[BaseException]) -> None:
        """The acquisition is abandoned (budget spent or cancelled: ``error`` None; an error, an
        interrupt): leave nothing behind."""
        with self._mutex:
            state = self.state
            if state in (ACQUIRING, HELD):
                self.state = FAILED
        self._wait_ns = self._mono() - start_ns
        pending, self._pending = self._pending, None
        if state == HELD:
            # Interrupted after the row was confirmed (say, KeyboardInterrupt while scheduling its
            # renewal): the caller never got the guard, so stop renewing and delete the row.
            self._scheduler.cancel(self)
            self._delete_owned(self.owner, cleanup_budget_ns(self.lease_ms))
        elif pending is not None:
            # A put that may have committed: remove it if it did, so nobody waits a lease for it.
            self._delete_owned(pending[0], cleanup_budget_ns(self.lease_ms))
        if self._observer is not None:
            self._observer.acquire_failed(self, self._wait_ns, error)

    def _attempt(self, deadline_ns: int) -> bool:
        """One acquisition step. True when held; False with ``_hint_ns`` set when contended."""
        handed, self._handed = self._handed, None
        if handed is not None and self._take_handed(handed[0], handed[1]):
            return True  # a release handed the lease over to us: held without a request
        turn, self._turn = self._turn, False
        if self._pending is not None:
            row = self._reconcile_acquisition(deadline_ns)
        elif self._row_seen and not turn:
            # Polling a held key costs a read, not a failed conditional write.
            row = self._read(deadline_ns, True)
        else:
            row = None
        if row is None:
            row = self._put_or_read(deadline_ns)
            # Released between our put and our read: it earns one more put (in a line, only on our turn).
            if row is None and (self._waiter is None or self._turn):
                row = self._put_or_read(deadline_ns)
        if row is True:
            return True
        self._hint_ns = 0
        if row is None:
            if self._waiter is not None and not self._turn:
                self._hint_ns = self._poll_ms() * _NS_PER_MS  # free, but another waiter's turn: ours will come
            return False
        return self._contend(row, deadline_ns)

    def _contend(self, row: Any, deadline_ns: int) -> bool:
        """The key is held (``row``, as read): observe the row, and take it over once seen unchanged for a
        whole stored lease. True when taken over; else False, ``_hint_ns`` how long to wait (0: at once)."""
        check_row(row, self.key)
        if self._offer_owner is not None and row[0] == self._offer_owner and self._take_handed(row[1], row[5]):
            return True  # handed over to us, and the feed's message has not come (or was lost)
        self._row_seen = True
        owner, version, stored_lease_ms, _, waiting, _ = row
        check_holder_kind(owner, self._kind, self.key)  # a lock's row to a semaphore, or the reverse
        now_ns = self._mono()
        seen_ns = self._observations.observe(self._cache_key, owner, version, stored_lease_ms, now_ns)
        self._seen_unchanged_ns, self._seen_lease_ms = seen_ns, stored_lease_ms
        self._last_seen = (owner, version)
        if self._first_seen is None:
            self._first_seen = self._last_seen
        remaining_ns = stored_lease_ms * _NS_PER_MS - seen_ns
        if remaining_ns > 0:
            self._hint_ns = remaining_ns
            if waiting:
                if owner != self._marked_owner:
                    # Another contender has waited a while too: after our turn, we yield to it.
                    self._others_waiting = True
            elif (self.wait_ms and self._waiter is None  # (in a line, the store keeps the turns)
                  and now_ns - self._acquire_start_ns >= WAITING_MARK_AFTER_MS * _NS_PER_MS):
                self._mark_waiting(owner, version, deadline_ns)
            return False
        return self._take_over(owner, version, deadline_ns)

    def _put_or_read(self, deadline_ns: int) -> Any:
        """Put a fresh row; if the key is taken, read it. True when held, else the row (or None)."""
        if self._put_settled(deadline_ns):
            return True
        return self._read(deadline_ns, True)

    def _put_settled(self, deadline_ns: int) -> bool:
        """Put a fresh row: True when held, False when the key is taken. A put whose outcome stays unknown
        (the reconciling read failed too) raises a StoreError that may have committed: the caller backs off."""
        if self._put(deadline_ns):
            return True
        if self._pending is not None:
            raise StoreError(f"acquisition of {self.key!r} unconfirmed", key=self.key, maybe_committed=True)
        return False

    def _read(self, deadline_ns: int, in_line: bool = False) -> Any:
        """The row (None when free). ``in_line``: a waiter's read, which also keeps its place in the key's
        line where the store keeps one, and sets ``_turn`` when the key is free and the turn is ours."""
        now_ns = self._mono()
        self._reads += 1
        try:
            if in_line and self._waiter is not None:
                offer = None if self._offer_owner is None else self._new_offer(now_ns)
                row, self._turn = self._line.read_in_line(self.table, self.key, self._waiter,
                                                          self._timeout_s(deadline_ns, now_ns), self, self._line_key,
                                                          offer)
                return row
            return self._store.read(self.table, self.key, self._timeout_s(deadline_ns, now_ns), self)
        except StoreError:
            self._request_failures += 1
            raise

    def _new_offer(self, mono_ns: int) -> tuple[str, str, int, int]:
        """Our offer to take the lease over on its release (the store's ``Offer``), for a read in line that
        starts now: a new version each time, stamped (``mono_ns`` and the wall clock) before that read."""
        version = new_token()
        self._offers = ((version, mono_ns, self._wall()), *self._offers[:1])
        return cast(str, self._offer_owner), version, self.lease_ms, min(self.lease_ms, HANDED_LEASE_MS)

    def _take_handed(self, version: str, fence: Optional[int]) -> bool:
        """A release handed the lease over to us, in our offer's owner and ``version``: HELD, its validity
        counted from the stamp taken before the read that left that offer, over the span the handover wrote
        (HANDED_LEASE_MS at most) until the first renewal sets the lease. The release may have taken either of
        our last two offers (the newer one's read still in flight); an older version is not counted."""
        for offered, mono_ns, wall_ns in self._offers:
            if offered == version:
                shift_ns = validity_ns(self.lease_ms) - validity_ns(min(self.lease_ms, HANDED_LEASE_MS))
                return self._confirm(cast(str, self._offer_owner), version, mono_ns, wall_ns, fence, shift_ns)
        return False

    def _put(self, deadline_ns: int) -> bool:
        return self._acquisition_write(deadline_ns, None, None)

    def _take_over(self, seen_owner: str, seen_version: str, deadline_ns: int) -> bool:
        return self._acquisition_write(deadline_ns, seen_owner, seen_version)

    def _acquisition_write(self, deadline_ns: int, seen_owner: Optional[str], seen_version: Optional[str]) -> bool:
        """Write a fresh row: a put if absent, or (with a seen row) a takeover conditioned on it."""
        owner, version = self.owner_prefix + new_token(), new_token()
        mono_ns, wall_ns = self._mono(), self._wall()  # the stamp validity counts from
        timeout_s = self._timeout_s(deadline_ns, mono_ns)
        self._writes += 1
        try:
            if seen_owner is None and (self._waiter is not None or self._line_key is not None):
                # (A slot's put, even without a place in line, is checked against the semaphore's line, as
                # a lock's put against its key's own.)
                applied = self._store.put_in_turn(
                    self.table, self.key, owner, version, self.lease_ms, self._waiter or "", timeout_s, self,
                    self._line_key,
                )
            elif seen_owner is None:
                applied = self._store.put_if_absent(
                    self.table, self.key, owner, version, self.lease_ms, timeout_s, self
                )
            else:
                applied = self._store.replace_if(
                    self.table, self.key, seen_owner, seen_version, owner, version, self.lease_ms, timeout_s, self
                )
        except StoreError as error:
            self._request_failures += 1
            _log.debug("acquisition write of %r failed (maybe committed: %s): %s", self.key,
                       error.maybe_committed, error)
            if not error.maybe_committed:
                raise
            self._pending = (owner, version, mono_ns, wall_ns)
            return self._reconcile_or_keep_pending(deadline_ns)
        if applied is None:
            self._conditional_failures += 1
            return False
        if type(applied) is not int or applied < 0:
            # Fail closed on a store that breaks the contract (an old one's False would read as written).
            raise TypeError(f"{type(self._store).__name__} answered an acquisition write with {applied!r:.80}; "
                            "a LockStore returns None (not written) or the fencing token, an int >= 0")
        if seen_owner is None:
            return self._confirm(owner, version, mono_ns, wall_ns, applied or None)  # 0: the store keeps no token
        _log.debug("took over %r in %r from owner %s", self.key, self.table, seen_owner)
        confirmed = self._confirm(owner, version, mono_ns, wall_ns, applied or None)
        if confirmed and self._waiter is not None and self._reads:
            # A put in turn takes its waiter out of the line; a takeover does not, and the place left there
            # would be the head that our own release names, which nobody would answer.
            self._leave_line()
        return confirmed

    def _reconcile_or_keep_pending(self, deadline_ns: int) -> bool:
        """Right after an ambiguous write: one consistent read. A failed read keeps it pending."""
        try:
            return self._reconcile_acquisition(deadline_ns) is True
        except StoreError:
            return False

    def _reconcile_acquisition(self, deadline_ns: int) -> Any:
        """Resolve a pending write by a consistent read: True if the row holds exactly our owner and
        version (and the confirmation is still valid), else the row as read (None when absent)."""
        row = self._read(deadline_ns)
        # Only called with a write pending (``_attempt`` checks, ``_acquisition_write`` has just set it).
        owner, version, mono_ns, wall_ns = cast("tuple[str, str, int, int]", self._pending)
        if row is not None and row[0] == owner and row[1] == version:
            self._pending = None
            return True if self._confirm(owner, version, mono_ns, wall_ns, row[5]) else None
        self._pending = None
        return row

    def _confirm(self, owner: str, version: str, mono_ns: int, wall_ns: int, fence: Optional[int],
                 shift_ns: int = 0) -> bool:
        """A write of ours is confirmed: HELD with validity from the stamp taken before the write (counted
        ``shift_ns`` earlier for a lease handed over with a shorter PX than its own: validity ends that much
        sooner, and the first renewal is due HANDED_FIRST_RENEWAL_MS after the stamp).

        A confirmation that arrives after that validity ended (a very slow response), or after the
        acquisition was cancelled, does not count: the row is ours, so it is deleted.
        """
        counted_mono_ns, counted_wall_ns = mono_ns - shift_ns, wall_ns - shift_ns
        if shift_ns:  # handed over: L/3 after the counted stamp is overdue, yet not at once (HANDED_FIRST_...)
            renew_at_ns = mono_ns + HANDED_FIRST_RENEWAL_MS * _NS_PER_MS
        else:
            renew_at_ns = counted_mono_ns + renew_interval_ns(self.lease_ms)
        with self._mutex:
            if self.state != ACQUIRING:
                return False  # a late success never revives a failed or cancelled guard
            self._set_validity(counted_mono_ns, counted_wall_ns)
            if self._cancelled or not self._valid_at(self._mono(), self._wall()):
                stale = True
            else:
                stale = False
                self.owner = owner
                self.version = version
                self.fencing_token = fence
                self.state = HELD
                if self.max_hold_ms:
                    self._hold_until_ns = mono_ns + self.max_hold_ms * _NS_PER_MS
        if stale:
            self._delete_owned(owner, cleanup_budget_ns(self.lease_ms))
            self._hint_ns = 0
            return False
        if self._row_seen:  # only an acquisition that observed the key can have left a sighting
            self._observations.forget(self._cache_key)
        if self._link is not None and self.lease_ms >= DELEGATE_MIN_LEASE_MS:
            pulse = self._link.fast_pulse  # the link's checks are done: the registration is one C call
            if pulse is not None:
                link_id = pulse.register(self, self.table, self.key, owner, version, self.lease_ms, fence,
                                         counted_mono_ns, counted_wall_ns, self._hold_until_ns, renew_at_ns,
                                         self._link.store_id)
            else:
                link_id = self._link.register(self, counted_mono_ns, counted_wall_ns, self._hold_until_ns, renew_at_ns)
            if link_id:
                with self._mutex:
                    # The renewal process may have ended while this was being staged, handing its
                    # registrations back (this one too, before it was ours to clear): renewals stay here.
                    if self._link.registered(self, link_id):
                        self._link_id = link_id
        self._scheduler.schedule(self, renew_at_ns)
        return True

    # ---- release (caller's thread) -------------------------------------------------------------
    def release(self) -> None:
        """HELD/LOST -> RELEASED (or stays LOST). Raises LockLost if ownership ended before the
        release: the row was no longer ours (``stolen``), or validity lapsed while the block ran (the
        row, still ours, is deleted; another owner may have acted meanwhile), also when the delete then
        stayed unconfirmed (the LockReleaseError is its ``__cause__``); LockReleaseError if the delete of a
        valid lease stayed unconfirmed."""
        check_not_forked(self._pid)  # a forked child must not delete the row its parent still holds
        if self._begin_release():  # the block outlived validity, perhaps before any renewal step noticed
            self._mark_lost(self._lapse_cause())
        if self._scheduler.cancel(self):
            # A renewal write is in flight: let it finish, so that no renewal lands after the release.
            self._scheduler.wait_idle(self, 2 * request_timeout_ns(self.lease_ms))
        if self._link_id:  # told, not waited for: one still starting would hold the release (_Hub.stop)
            self._end_delegation(False)
        budget_ns = cleanup_budget_ns(self.lease_ms)
        try:
            deleted = self._delete_owned(self.owner, budget_ns, raise_on_failure=True)
        except LockReleaseError as failure:
            if self.lost_cause is None:
                if self._observed is not None:
                    self._hold_ended(failure)
                raise
            # Ownership had already ended (lost or lapsed): what the caller must hear is LockLost, with
            # the unconfirmed release as its cause; only a release of a valid lease is LockReleaseError.
            ended = LockLost(f"lease on {self.key!r} in table {self.table!r} was lost ({self.lost_cause}) before "
                             f"the block ended, and its release stayed unconfirmed: {failure}",
                             key=self.key, cause=self.lost_cause)
            if self._observed is not None:
                self._hold_ended(ended)
            raise ended from failure
        except BaseException as failure:
            if self._observed is not None:
                self._hold_ended(failure)
            raise
        finally:
            self._mutex.acquire()
            try:
                if self.state == RELEASING:
                    self.state = RELEASED
            finally:
                self._mutex.release()
        lost = self._loss_at_release(deleted)
        if self._observed is not None:
            self._hold_ended(lost)
        if lost is not None:
            raise lost

    def _begin_release(self) -> bool:
        """HELD -> RELEASING, or LOST stays: True if validity has lapsed (the state then stays HELD for
        the caller to mark the loss). Any other state cannot be released."""
        lapsed = synced = False
        while True:  # at most twice: again only after the renewal process's reports are applied
            self._mutex.acquire()  # (not `with`: see acquire)
            try:
                state = self.state
                if state == HELD:
                    lapsed = not self._valid_at(self._mono(), self._wall())
                    if not lapsed:
                        self.state = RELEASING
                elif state != LOST:
                    raise RuntimeError(f"lease on {self.key!r} cannot be released in state {STATE_NAMES[state]}")
            finally:
                self._mutex.release()
            if not lapsed or synced or not self._link_id:
                return lapsed
            # Validity here looks over, but reports may extend it (valid here means valid, so a hold
            # that ends in time reads no report: no system call on the release's path).
            self._link.sync()
            synced = True

    def _loss_at_release(self, deleted: bool) -> Optional[LockLost]:
        """After the release's delete: None if the lease was held to the end, else the LockLost that
        says how ownership ended before it."""
        if deleted:
            self._signals.released(self._signal_key, self._others_waiting, self._mono())
            cause = self.lost_cause
            if cause is None:
                return None
            # Ownership lapsed during the block (expired, unreachable, or max_hold's cancelled). The
            # row was still ours, but nobody can tell whether another owner acted in between.
            return LockLost(
                f"lease on {self.key!r} in table {self.table!r} lapsed before the block ended ({cause}): "
                "its row is deleted, but another owner may have acted meanwhile",
                key=self.key, cause=cause)
        # The row was not ours any more: someone took over (or removed it). Fail closed.
        self.note_stolen()
        cause = cast(str, self.lost_cause)  # set by note_stolen(), or before, with the state LOST
        return LockLost(f"lease on {self.key!r} was lost before release: {cause}", key=self.key, cause=cause)

    def _hold_ended(self, error: Optional[BaseException]) -> None:
        """Tell the observer, once, that the hold is over (``error``: what the release raised)."""
        with self._mutex:
            observed, self._observed = self._observed, None
        if observed is not None:  # (checked again: another thread may have ended it since the caller looked)
            cast("Observer", self._observer).released(self, observed, error)

    def released_by_store(self) -> None:
        """HELD/LOST -> RELEASED without a request: the caller's own atomic write, conditioned on our
        ownership, has just deleted the row (idempotency's completion). Renewals stop; this client's
        waiters are woken as on a release."""
        check_not_forked(self._pid)
        with self._mutex:
            if self.state not in (HELD, LOST):
                raise RuntimeError(f"lease on {self.key!r} cannot be released in state {STATE_NAMES[self.state]}")
            self.state = RELEASED
        self._scheduler.cancel(self)
        self._end_delegation()
        self._signals.released(self._signal_key, False, self._mono())
        if self._observed is not None:
            self._hold_ended(None)

    def release_by_write(self, write: Callable[[float], bool], landed: Callable[[float], bool]) -> None:
        """Release through the caller's own atomic write, conditioned on our ownership, that also
        deletes the row (idempotency's completion stores its record and frees the key in one request).

        ``write(timeout_s)`` sends it: True if applied, False if the row was not ours. After a write
        whose outcome is unknown, ``landed(timeout_s)`` reads whether it did. The write is sent only
        while the lease is valid (LockLost before any request otherwise); transient errors are retried
        within the cleanup budget. The store refusing it raises LockLost (stolen); an outcome still
        unknown at the end of the budget raises the last StoreError. On success: RELEASED, as after
        ``released_by_store``.
        """
        check_not_forked(self._pid)
        if self._link_id:
            self.raise_if_lost()  # (applies the renewal process's last confirmations first)
            self._end_delegation()  # no renewal lands after the write that ends the lease
        outcome = self._write_reconciled(None, write, landed, self._mono() + cleanup_budget_ns(self.lease_ms))
        if outcome is False:
            raise self.lost_to_store("the store refused the write that ends the lease")
        if outcome is not True:
            raise outcome  # the last StoreError: the outcome is still unknown at the end of the budget
        self.released_by_store()

    def _pause_before_retry(self, backoff_ns: int, deadline_ns: int) -> int:
        """Sleep ``backoff_ns`` before retrying after a transient store error, if that ends before
        ``deadline_ns``; return the next back-off, or 0 (no sleep) when the budget is spent."""
        if self._mono() + backoff_ns >= deadline_ns:
            return 0
        self._clock.wait(NEVER_SET, backoff_ns / 1e9)
        return next_backoff_ns(backoff_ns)

    def _delete_owned(self, owner: Optional[str], budget_ns: int, raise_on_failure: bool = False) -> bool:
        """Delete the row if ``owner`` still holds it, retrying transient errors within the budget.

        True: our row is gone (deleted now, or confirmed absent after an ambiguous delete).
        False: the row belongs to someone else or was absent. Raises LockReleaseError when the
        outcome stays unknown and ``raise_on_failure`` is set; otherwise logs and returns True.
        """
        outcome = self._write_reconciled(owner, None, None, self._mono() + budget_ns)
        if outcome is True or outcome is False:
            return bool(outcome)
        message = f"release of {self.key!r} in table {self.table!r} unconfirmed after {seconds_text(budget_ns)}"
        if raise_on_failure:
            raise LockReleaseError(message, key=self.key) from outcome
        _log.warning("%s; the row is recovered by observation", message)
        return True

    def _write_reconciled(self, owner: Optional[str], write: Optional[Callable[[float], bool]],
                          landed: Optional[Callable[[float], bool]], deadline_ns: int) -> Any:
        """The one loop of a write that ends the lease: send it, and after a failure that may have
        committed, read whether it did before sending it again; back off after transient errors until
        ``deadline_ns``. The write is ``delete_if_owner`` of ``owner`` or, for ``release_by_write``, the
        caller's ``write`` (sent only while the lease is valid) with its ``landed`` read.

        True: applied (or found applied). False: the store refused it (conditional failure). Else the
        last StoreError: the outcome is unknown at the deadline (counted as a cleanup failure).
        """
        backoff_ns = ERROR_BACKOFF_MS * _NS_PER_MS
        ambiguous = False
        while True:
            now_ns = self._mono()
            try:
                if ambiguous:
                    self._reads += 1
                    timeout_s = self._timeout_s(deadline_ns, now_ns)
                    if write is None:
                        row = self._store.read(self.table, self.key, timeout_s, self)
                        landed_now = row is None or row[0] != owner
                    else:
                        landed_now = cast("Callable[[float], bool]", landed)(timeout_s)
                    if landed_now:
                        return True
                    ambiguous = False
                    now_ns = self._mono()
                if write is None:
                    self._writes += 1
                    timeout_s = self._timeout_s(deadline_ns, now_ns)
                    if self._line_key is None:
                        deletion = self._store.delete_if_owner(self.table, self.key, owner, timeout_s, self)
                    else:  # a slot's release wakes the head of the semaphore's line
                        deletion = self._store.free_in_line(self.table, self.key, owner, self._line_key, timeout_s,
                                                            self)
                    if type(deletion) is not int or not NOT_DELETED <= deletion <= HANDED_OVER:
                        raise TypeError(f"{type(self._store).__name__} answered a release with {deletion!r:.80}; a "
                                        "LockStore returns NOT_DELETED, DELETED, DELETED_WITH_WAITERS or HANDED_OVER")
                    applied = deletion != NOT_DELETED
                    if deletion == DELETED_WITH_WAITERS:
                        self._others_waiting = True
                    elif deletion == HANDED_OVER:
                        self._signals.handed_over(self._signal_key, now_ns)
                else:
                    self.raise_if_lost()  # never write on a lapsed lease: a successor may be running
                    self._writes += 1
                    applied = write(self._timeout_s(deadline_ns, now_ns))
                if applied:
                    return True
                self._conditional_failures += 1
                return False
            except StoreError as failure:
                self._request_failures += 1
                _log.debug("write ending the lease on %r failed (maybe committed: %s): %s", self.key,
                           failure.maybe_committed, failure)
                ambiguous = ambiguous or failure.maybe_committed
                backoff_ns = self._pause_before_retry(backoff_ns, deadline_ns)
                if not backoff_ns:
                    self._cleanup_failures += 1
                    return failure
