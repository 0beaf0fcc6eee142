# cython: language_level=3, embedsignature=True, freethreading_compatible=True, annotation_typing=False
"""A lease while it exists, and how it is kept: its fields and states, the validity rule applied to
them, loss, what callers read, and renewal, by this process's scheduler (``renew_step``) or by the
client's renewal process (whose confirmations the holder applies, and whose copy is adopted there).
``lease.Lease`` adds acquisition and release.

Units: integers carry their unit in their name (``lease_ms``, ``deadline_ns``); every clock reading is
an ``int`` of nanoseconds.
"""

from __future__ import annotations

import threading

from .._logging import get_logger
from .._typing import cast
from ..exceptions import LockLost, StoreError
from ..stores.base import check_table
from .engine import check_not_forked
from .keys import check_key
from .scheduler import Renewable
from .timing import (
    DELEGATE_MIN_LEASE_MS,
    check_lease_arguments,
    new_mutex,
    new_token,
    renew_interval_ns,
    renew_retry_ns,
    request_timeout_ns,
    validity_ns,
)

TYPE_CHECKING = False  # typing is not imported at run time: see _typing.py
if TYPE_CHECKING:  # annotations only
    from typing import Any, Callable, Optional

    from .engine import (
        Engine,
        Observer,  # noqa: F401  # named in cast() strings
    )
    from .timing import Clock

BUILT_FROM = "" if __file__.endswith((".py", ".pyc")) else FASTLEASE_SOURCE_CRC.decode("ascii")  # type: ignore[name-defined]  # noqa: F821

_log = get_logger("fastlease.engine")


# ---------------------------------------------------------------------------------------------
# Lease states
# ---------------------------------------------------------------------------------------------
NEW = 0
ACQUIRING = 1
HELD = 2
RELEASING = 3
RELEASED = 4
LOST = 5  # ownership ended without a release: stolen, expired or unreachable
FAILED = 6  # acquisition gave up: budget spent, malformed row or store error
STATE_NAMES = ("new", "acquiring", "held", "releasing", "released", "lost", "failed")


class HeldLease(Renewable):
    """A lease's fields, the rules every part of the protocol reads them by, and its renewal.

    Thread ownership of fields: the caller's thread drives enter and exit; the client's renewal
    thread runs ``renew_step``. Fields both of them write are guarded by ``_mutex``; each thread has
    its own request counters so neither overwrites the other's increments.
    """

    def __init__(self, client: Any, table: str, key: str, lease_ms: int, wait_ms: int, max_hold_ms: int = 0,
                 on_lost: Optional[Callable[[LockLost], object]] = None) -> None:
        check_lease_arguments(lease_ms, wait_ms, max_hold_ms, on_lost)
        self._bind(client.engine)
        self.table = check_table(table)
        self.key = check_key(key)
        self.lease_ms = lease_ms
        self.wait_ms = wait_ms
        self.max_hold_ms = max_hold_ms
        self._on_lost = on_lost  # taken (set to None) by the one call that announces the loss
        self._lost_event: Optional[threading.Event] = None  # made on first use; installed under _mutex
        self._hold_until_ns = 0  # written by the caller before renewal is scheduled; 0: no max_hold
        self._renewal_stopped = False  # max_hold reached; renewal thread only
        self._client = client  # handed back by the ``client`` property; the engine reads only ``engine``
        self._cache_key = (table, key)
        self._signal_key = self._cache_key  # where this client's waiters queue: a semaphore's slots share one
        self._mutex = new_mutex()
        # The observer's record of this hold (what Observer.acquired returned), or None: set by the
        # caller's thread at the acquisition, taken (back to None) by the end of the hold.
        self._observed: object = None
        self._init_ownership()
        self._init_renewal()
        self._init_waiting()
        self._init_counters()

    def _init_ownership(self) -> None:
        """What this lease holds, and until when: nothing yet."""
        # Written by the caller's thread, and by the renewal thread only to move HELD -> LOST.
        self.state = NEW
        self.lost_cause: Optional[str] = None
        # Written once by the caller's thread before renewal is scheduled; read-only afterwards.
        self.owner: Optional[str] = None
        # Put before each new owner id (an election's candidate identity and "/"; else empty): set
        # before the acquisition, by the layer above.
        self.owner_prefix = ""
        self._kind = ""  # whose rows may hold the key: "" a lock's; a semaphore's slots, "sem:<limit>:"
        # Written under _mutex by whichever thread confirms a write (acquire: caller; renew: renewal).
        self.version: Optional[str] = None
        # The store's fencing token of this acquisition (strictly increasing per key), where the store
        # keeps one; None otherwise. Written with owner.
        self.fencing_token: Optional[int] = None
        self._valid_until_mono_ns = 0
        self._wall_stamp_ns = 0
        self._valid_until_wall_ns = 0
        # An acquisition write whose outcome is unknown: (owner, version, mono_ns, wall_ns). Caller only.
        self._pending: Optional[tuple[str, str, int, int]] = None

    def _init_renewal(self) -> None:
        """The renewal's state: not scheduled, nothing pending, not delegated."""
        # A renewal write whose outcome is unknown: (version, mono_ns, wall_ns). Renewal thread only.
        self._renew_pending: Optional[tuple[str, int, int]] = None
        self._renew_errors = 0  # consecutive failed renewal requests; renewal thread only
        self._renew_at_ns = 0  # due time of the live heap entry; 0 when unscheduled (under scheduler lock)
        self._renewing = False  # a worker runs its renewal step now (under scheduler lock)
        # What this lease counted (renew writes, reads, conditional and request failures, renewals) before a
        # hand-back to a renewal process, whose reports count from 0: written under _mutex.
        self._delegation_base = (0, 0, 0, 0, 0)
        # The renewal process renews this lease: its registration id with the client's link, else 0.
        # Set by the caller's thread before renewal is scheduled; cleared once, under _mutex.
        self._link_id = 0

    def _init_waiting(self) -> None:
        """What the caller's thread learns while it waits for the key: nothing seen yet."""
        self._hint_ns = 0  # how long the last failed attempt suggests waiting; caller only
        self._row_seen = False  # the last attempt found the key held; caller only
        # How long this client has seen that row unchanged, and the lease it stores (what a takeover
        # needs): for the message of a wait that ends before the takeover could come. Caller only.
        self._seen_unchanged_ns = 0
        self._seen_lease_ms = 0
        self._first_seen: Optional[tuple[str, str]] = None  # (owner, version) at this wait's first sighting
        self._last_seen: Optional[tuple[str, str]] = None  # and at its last; caller only
        self._acquire_start_ns = 0  # when acquire() began; caller only
        # Others wait for the key: our deleted row carried a waiting mark, or while waiting for this
        # turn we saw a mark we had not made. Caller only.
        self._others_waiting = False
        self._marked_owner: Optional[str] = None  # the holder whose row we marked; caller only
        self._cancelled = False  # set by cancel() from any thread (a cancelled task); read by the caller's
        self._ticket: Optional[threading.Event] = None  # our place in the client's wait queue; caller
        self._watch: Any = None  # our watch on the store's release feed while waiting; caller only
        self._waiter: Optional[str] = None  # our id in the store's line of waiters for the key; caller only
        # Our turn in the key's line (set by the feed on a release to us, or a read in line): write first.
        self._turn = False
        self._freed_key: Optional[str] = None  # the slot key whose release gave us the turn (a semaphore's)
        # Where the store hands a released lease over to the head of its line (WaiterLine.hands_over): the
        # owner our reads in line offer to take it in (set with our place: a lock's waiter's, else None); their
        # last two offers, newest first, each (version, monotonic and wall stamps taken before its read); a
        # handover the feed announced, (version, fence).
        self._offer_owner: Optional[str] = None
        self._offers: tuple[tuple[str, int, int], ...] = ()
        self._handed: Optional[tuple[str, int]] = None  # set by the feed's thread, taken by the caller's

    def _init_counters(self) -> None:
        """The request counters behind ``metrics``, each written by one thread, all at zero."""
        # Caller-thread counters.
        self._writes = 0
        self._reads = 0
        self._conditional_failures = 0
        self._request_failures = 0
        self._wait_timeouts = 0
        self._cleanup_failures = 0
        self._wait_ns = 0
        # Renewal-thread counters.
        self._renew_writes = 0
        self._renew_reads = 0
        self._renew_conditional_failures = 0
        self._renew_request_failures = 0
        self._renewals = 0
        # Capacity reported by stores from either thread; under _mutex.
        self._rcu = 0.0
        self._wcu = 0.0

    def _bind(self, engine: Engine) -> None:
        """Take the client's engine state: the only thing of the client that a lease reads."""
        check_not_forked(engine.pid)
        self._pid = engine.pid
        self._store = engine.store
        self._clock: Clock = engine.clock
        # The clock's readings as callables, looked up once: a lease reads them a dozen times a hold.
        self._mono: Callable[[], int] = engine.clock.monotonic_ns
        self._wall: Callable[[], int] = engine.clock.time_ns
        self._observations = engine.observations
        self._scheduler = engine.scheduler
        self._signals = engine.signals
        # The store's feed of releases made anywhere (Redis pub/sub), or None; our watch while waiting.
        self._feed = engine.release_feed
        self._line = engine.line  # the store, where it keeps a line of waiters per key; else None
        self._line_key: Optional[str] = None  # the key whose line we wait in and wake, if not ours (SlotLease)
        # The client's renewal process (``_renewal_link.RenewalLink``), or None: renewals stay here.
        self._link = engine.link
        # Told of every confirmed renewal (the renewal process reports them to the holder), or None.
        self._listener = engine.renewal_listener
        # Told of this lease's events (an Observer), or None: each event checks it, or _observed, once.
        self._observer = engine.observer

    # ---- small helpers ---------------------------------------------------------------------
    def add_capacity(self, rcu: float, wcu: float) -> None:
        """Stores report consumed capacity of successful responses here."""
        with self._mutex:
            self._rcu += rcu
            self._wcu += wcu

    def _timeout_s(self, deadline_ns: int, now_ns: int) -> float:
        return max(min(request_timeout_ns(self.lease_ms), deadline_ns - now_ns), 1_000_000) / 1e9

    def _valid_at(self, mono_ns: int, wall_ns: int) -> bool:
        # A backwards wall jump (wall_ns < stamp) invalidates: we cannot tell how much time passed.
        return (
            mono_ns < self._valid_until_mono_ns
            and self._wall_stamp_ns <= wall_ns < self._valid_until_wall_ns
        )

    def _set_validity(self, mono_ns: int, wall_ns: int) -> None:
        span = validity_ns(self.lease_ms)
        self._valid_until_mono_ns = mono_ns + span
        self._wall_stamp_ns = wall_ns
        self._valid_until_wall_ns = wall_ns + span

    def _mark_lost(self, cause: str) -> bool:
        """HELD -> LOST once; returns True if this call made the transition."""
        with self._mutex:
            if self.state != HELD:
                return False
            self.state = LOST
            self.lost_cause = cause
        self._announce_lost(cause)
        return True

    def note_stolen(self) -> None:
        """The store proved another owner has the row (a failed release, a rejected check_in): the
        lease is lost with cause ``stolen``, even if it had already lapsed locally as ``expired``."""
        with self._mutex:
            first = self.lost_cause is None
            if self.state in (HELD, LOST, RELEASING, RELEASED):
                self.state = LOST
                self.lost_cause = "stolen"
        if first:
            self._announce_lost("stolen")

    def lost_to_store(self, detail: str) -> LockLost:
        """The one path for "the store says we lost it" (a rejected check_in, a cancelled transaction,
        a completion the store refused): the lease is lost with cause ``stolen``, and the LockLost to
        raise is returned (the caller raises it, ``from`` its store error where there is one)."""
        self.note_stolen()
        return LockLost(f"lease on {self.key!r} in table {self.table!r} was lost: stolen ({detail})",
                        key=self.key, cause="stolen")

    def _lapse_cause(self) -> str:
        """Why validity ran out without a conditional failure."""
        if self._renewal_stopped:
            return "cancelled"  # max_hold: renewal stopped on purpose
        return "unreachable" if self._renew_errors else "expired"

    def _announce_lost(self, cause: str) -> None:
        """Runs once per lease, in the thread that found the loss (usually the renewal thread): stop
        renewing, log, tell the observer, set the ``lost`` event, call ``on_lost`` (its exceptions are
        logged, not raised)."""
        self._scheduler.cancel(self)
        self._end_delegation()
        _log.warning("lease lost: table=%s key=%r cause=%s", self.table, self.key, cause)
        observed = self._observed
        if observed is not None:
            cast("Observer", self._observer).lost(self, observed, cause)
        with self._mutex:
            event = self._lost_event
            callback, self._on_lost = self._on_lost, None
        if event is not None:
            event.set()
        if callback is not None:
            try:
                callback(LockLost(f"lease on {self.key!r} was lost: {cause}", key=self.key, cause=cause))
            except BaseException:  # noqa: BLE001 - a callback must not break the renewal thread
                _log.warning("on_lost callback for %r raised", self.key, exc_info=True)

    @property
    def lost_event(self) -> threading.Event:
        """A ``threading.Event`` set when the lease is lost (already set if it has been)."""
        fresh = threading.Event()
        with self._mutex:
            if self._lost_event is None:
                self._lost_event = fresh
                if self.lost_cause is not None:
                    fresh.set()
            return self._lost_event

    # ---- public state ----------------------------------------------------------------------
    @property
    def client(self) -> Any:
        """The client this lease belongs to."""
        return self._client

    @property
    def renewal_link(self) -> Any:
        """The client's renewal link (``_renewal_link.RenewalLink``), or None: renewals stay here."""
        return self._link

    @property
    def request_timeout_s(self) -> float:
        """The bound on each request of this lease (s): the engine's rule, min(lease/3, 5 s)."""
        return request_timeout_ns(self.lease_ms) / 1e9

    @property
    def state_name(self) -> str:
        return STATE_NAMES[self.state]

    def check_process(self) -> None:
        """RuntimeError in a forked child: the lease, and any use of its ownership, is the parent's."""
        check_not_forked(self._pid)

    def is_valid(self) -> bool:
        """True while the lease is held and within its validity on both clocks. RuntimeError in a
        forked child: the lease is its parent's."""
        check_not_forked(self._pid)
        if self._link_id:
            self._link.sync()  # renewals the renewal process confirmed meanwhile count first
        with self._mutex:
            return self.state == HELD and self._valid_at(self._mono(), self._wall())

    def holds_key(self, cache_key: tuple[str, str]) -> bool:
        """Whether this lease is held, on ``cache_key`` (table, key): for the scheduler's messages."""
        return self._cache_key == cache_key and self.state == HELD

    def valid_until_ns(self) -> int:
        """The ``time.monotonic_ns()`` reading at which local validity ends (the earlier of its two
        clocks' ends), or 0 when the lease is not valid now. Reports of the renewal process are applied
        first, as for ``is_valid``. RuntimeError in a forked child: the lease is its parent's."""
        check_not_forked(self._pid)
        if self._link_id:
            self._link.sync()
        with self._mutex:
            mono_ns, wall_ns = self._mono(), self._wall()
            if self.state != HELD or not self._valid_at(mono_ns, wall_ns):
                return 0
            return mono_ns + min(self._valid_until_mono_ns - mono_ns, self._valid_until_wall_ns - wall_ns)

    def raise_if_lost(self) -> None:
        """Raise LockLost unless ownership is still valid now (a local check, no request): with the
        cause of the loss, or ``not_held`` before the acquisition and after a release. RuntimeError
        in a forked child: the lease is its parent's, whatever its state."""
        check_not_forked(self._pid)
        if self._link_id:
            self._link.sync()  # renewals the renewal process confirmed meanwhile count first
        with self._mutex:
            state = self.state
            if state == HELD:
                if self._valid_at(self._mono(), self._wall()):
                    return
        if state == HELD:
            self._mark_lost(self._lapse_cause())
        elif self.lost_cause is None:
            raise LockLost(f"lease on {self.key!r} in table {self.table!r} is not held (it is {STATE_NAMES[state]})",
                           key=self.key, cause="not_held")
        cause = self.lost_cause
        raise LockLost(f"lease on {self.key!r} was lost: {cause}", key=self.key, cause=cause or "expired")

    def counters(self) -> tuple[int, int, int, int, int, int, int, int, bool, float, float]:
        """(write_requests, read_requests, renewals, wait_ns, conditional_failures, request_failures,
        wait_timeouts, cleanup_failures, lost, consumed_rcu, consumed_wcu). RuntimeError in a forked
        child, as for every use of the lease there."""
        check_not_forked(self._pid)
        if self._link_id:
            self._link.sync()  # the renewal process's reports so far count
        with self._mutex:
            rcu, wcu = self._rcu, self._wcu
            lost = self.lost_cause is not None
        return (
            self._writes + self._renew_writes,
            self._reads + self._renew_reads,
            self._renewals,
            self._wait_ns,
            self._conditional_failures + self._renew_conditional_failures,
            self._request_failures + self._renew_request_failures,
            self._wait_timeouts,
            self._cleanup_failures,
            lost,
            rcu,
            wcu,
        )

    # ---- the renewal process's registration ------------------------------------------------
    def _end_delegation(self, wait: bool = True) -> None:
        """Stop the renewal process renewing this lease: after a loss and at ``max_hold`` waiting until it
        has (its last confirmed renewal applied); before a release (``wait`` False) only telling it, since
        a renewal sent after the release can never land (see ``_renewal_link._Hub.stop``). No-op otherwise."""
        with self._mutex:
            link_id, self._link_id = self._link_id, 0
        if link_id:
            self._link.stop(self, link_id, wait)  # (a registration not written yet is taken back, with no request)

    def delegation_ended(self) -> None:
        """The renewal process is gone (it died or could not start): renewals are this process's again."""
        with self._mutex:
            self._link_id = 0

    # ---- renewal (renewal thread) ------------------------------------------------------------
    def renew_step(self, now_ns: int) -> int:
        """Run one due renewal; return the next due time in ns, or 0 when no more renewals are needed.

        Never raises: any failure becomes a lost lease with a cause, because an exception escaping
        the renewal thread would silently stop every lease of the client.
        """
        try:
            return self._renew_step(now_ns)
        except BaseException as error:  # noqa: BLE001 - see docstring
            _log.warning("renewal of %r failed unexpectedly: %r", self.key, error)
            self._mark_lost("unreachable")
            return 0

    def _renew_step(self, now_ns: int) -> int:
        if self._link_id:
            self._link.sync()  # the renewal process's confirmations count first
        with self._mutex:
            if self.state != HELD:
                return 0
            owner, version = self.owner, self.version
            deadline_ns = self._valid_until_mono_ns
            valid = self._valid_at(self._mono(), self._wall())
        if not valid:
            self._mark_lost(self._lapse_cause())
            return 0
        if self._hold_until_ns and now_ns >= self._hold_until_ns:
            # max_hold reached: no more renewals; come back when validity ends to mark the loss.
            self._end_delegation()
            self._renewal_stopped = True
            return deadline_ns
        if self._link_id:
            # The renewal process renews it (if it ended, sync() gave renewals back to this step): here
            # only the watch above, every lease/3 and at the end of validity.
            self._link.refresh()
            return min(now_ns + renew_interval_ns(self.lease_ms), deadline_ns)
        retry_ns = renew_retry_ns(self.lease_ms)
        if self._renew_pending is not None:
            # The previous renewal's outcome is unknown: read before writing again, because a retry
            # conditioned on the old version would fail if the previous write did land.
            pending_version, p_mono, p_wall = self._renew_pending
            self._renew_reads += 1
            try:
                row = self._store.read(self.table, self.key, self._timeout_s(deadline_ns, now_ns), self)
            except StoreError:
                self._renew_request_failures += 1
                self._renew_errors += 1
                return min(self._mono() + retry_ns, deadline_ns)
            self._renew_pending = None
            if row is not None and row[0] == owner and row[1] == pending_version:
                return self._confirm_renewal(version, pending_version, p_mono, p_wall)
            if row is None or row[0] != owner or row[1] != version:
                self._mark_lost("stolen")
                return 0
        return self._write_renewal(cast(str, owner), cast(str, version), deadline_ns, retry_ns)  # HELD: both set

    def _write_renewal(self, owner: str, version: str, deadline_ns: int, retry_ns: int) -> int:
        """The renewal's conditional write of a new version on (owner, version), validity counted from a
        stamp taken before it; returns when the renewal step is due again (0: lost)."""
        new_version = new_token()
        mono_ns, wall_ns = self._mono(), self._wall()
        self._renew_writes += 1
        try:
            applied = self._store.update_version_if(self.table, self.key, owner, version, new_version,
                                                    self._timeout_s(deadline_ns, mono_ns), self, self.lease_ms)
        except StoreError as error:
            self._renew_request_failures += 1
            self._renew_errors += 1
            _log.debug("renewal of %r failed (maybe committed: %s): %s", self.key, error.maybe_committed, error)
            if error.maybe_committed:
                self._renew_pending = (new_version, mono_ns, wall_ns)
            return min(self._mono() + retry_ns, deadline_ns)
        if applied:
            next_ns = self._confirm_renewal(version, new_version, mono_ns, wall_ns)
            if next_ns and self._link is not None and self.lease_ms >= DELEGATE_MIN_LEASE_MS:
                self._hand_back(mono_ns, wall_ns, next_ns)
            return next_ns
        self._renew_conditional_failures += 1
        self._mark_lost("stolen")
        return 0

    def _hand_back(self, mono_ns: int, wall_ns: int, renew_at_ns: int) -> None:
        """Right after a renewal confirmed here, on the renewal thread (so no renewal of this lease is in
        flight in this process): if a renewal process is ready again (the last one died, or none could
        start at the acquisition), register the lease with it, with this renewal's version and stamps and
        the next renewal's due time; it renews from there, and this thread only watches again."""
        link = self._link
        if not link.takes_back():
            return
        link_id = link.register(self, mono_ns, wall_ns, self._hold_until_ns, renew_at_ns)
        if not link_id:
            return
        with self._mutex:
            taken = (self.state == HELD and not self._link_id and not self._renewal_stopped
                     and link.registered(self, link_id))
            if taken:
                self._link_id = link_id
                # Its reports count from 0 again: what was counted here so far stays.
                self._delegation_base = (self._renew_writes, self._renew_reads, self._renew_conditional_failures,
                                         self._renew_request_failures, self._renewals)
        if not taken:  # released, lost or at max_hold meanwhile: the renewal process must not renew it
            link.stop(self, link_id)

    def _confirm_renewal(self, old_version: Optional[str], new_version: str, mono_ns: int, wall_ns: int) -> int:
        with self._mutex:
            if self.state != HELD or self.version != old_version:
                return 0  # released or lost meanwhile: a late success never revives it
            # A confirmation that arrives after validity ended does not count (docs/protocol.md,
            # "Validity"): the block may have run unowned meanwhile, so the lease is lost, not renewed.
            lapsed = not self._valid_at(self._mono(), self._wall())
            if not lapsed:
                self.version = new_version
                self._set_validity(mono_ns, wall_ns)
        if lapsed:
            self._mark_lost(self._lapse_cause())
            return 0
        self._renewals += 1
        self._renew_errors = 0
        observed = self._observed
        if observed is not None:
            cast("Observer", self._observer).renewed(self, observed, 1)
        if self._listener is not None:
            self._listener(self)
        return mono_ns + renew_interval_ns(self.lease_ms)

    # ---- renewal by the client's renewal process ----------------------------------------------
    def apply_renewal(self, version: str, mono_ns: int, wall_ns: int, counters: tuple[int, int, int, int, int]) -> None:
        """A renewal the renewal process confirmed: validity from the stamp taken before its write.

        Applied only while the lease is held and that stamp lies within the validity it extends, so a
        late confirmation never revives a lapsed or lost lease.
        """
        renewed = 0
        with self._mutex:
            # A renewal counts only if its write was sent within the validity it extends: the
            # renewal process itself never reports one confirmed after validity ended.
            if self._valid_at(mono_ns, wall_ns):
                renewed = self._delegation_base[4] + counters[4] - self._renewals
                self._renewals = self._delegation_base[4] + counters[4]
                if self.state == HELD and self._link_id:
                    self.version = version
                    self._set_validity(mono_ns, wall_ns)
            self._count_delegated_requests(counters)
        observed = self._observed
        if observed is not None and renewed > 0:
            cast("Observer", self._observer).renewed(self, observed, renewed)

    def apply_loss(self, cause: str, counters: tuple[int, int, int, int, int]) -> None:
        """The renewal process lost the lease (the store refused a renewal, or it lapsed there). Its
        request counters count; its renewals only as far as reports extended validity here."""
        with self._mutex:
            self._link_id = 0
            self._count_delegated_requests(counters)
        self._mark_lost(cause)

    def _count_delegated_requests(self, counters: tuple[int, int, int, int, int]) -> None:
        """Under _mutex: the renewal process's request counters (its own lease's, from 0 at its adoption),
        on top of what this lease counted before it was handed over."""
        base = self._delegation_base
        self._renew_writes = base[0] + counters[0]
        self._renew_reads = base[1] + counters[1]
        self._renew_conditional_failures = base[2] + counters[2]
        self._renew_request_failures = base[3] + counters[3]

    def adopt(self, owner: str, version: str, fence: Optional[int], mono_ns: int, wall_ns: int,
              hold_until_ns: int, renew_at_ns: int) -> bool:
        """NEW -> HELD from another process's confirmed acquisition (the renewal process renews it):
        validity from that write's stamps, the first renewal due at ``renew_at_ns`` as the holder scheduled
        it. False if already lapsed."""
        with self._mutex:
            if self.state != NEW:
                raise RuntimeError("only a new lease can adopt an acquisition")
            self._set_validity(mono_ns, wall_ns)
            if not self._valid_at(self._mono(), self._wall()):
                self.state = FAILED
                return False
            self.owner, self.version, self.fencing_token = owner, version, fence
            self._hold_until_ns = hold_until_ns
            self.state = HELD
        self._scheduler.schedule(self, renew_at_ns)
        return True

    def renewal_state(self) -> tuple[str, int, int, tuple[int, int, int, int, int]]:
        """(version, monotonic and wall stamps its validity counts from, renewal counters): what the
        renewal process reports to the holder after each confirmed renewal."""
        with self._mutex:
            return (cast(str, self.version), self._valid_until_mono_ns - validity_ns(self.lease_ms),
                    self._wall_stamp_ns, (self._renew_writes, self._renew_reads, self._renew_conditional_failures,
                                          self._renew_request_failures, self._renewals))

    def stop_renewing(self) -> None:
        """HELD -> RELEASED without a request, and return once no renewal write of it is in flight:
        the renewal process, when the holder releases (the holder sends the release itself)."""
        with self._mutex:
            if self.state == HELD:
                self.state = RELEASED
        self._scheduler.cancel(self)
        self._scheduler.wait_idle(self, 2 * request_timeout_ns(self.lease_ms))
