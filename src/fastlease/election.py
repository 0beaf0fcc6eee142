"""Leader election on one key: a campaign is a lease acquisition, and a term is the lease it holds.

The term's number is the lease's fencing token, so terms strictly increase from leader to leader and a
destination that refuses an older token refuses an old leader (``fastlease.fencing``). Nothing here adds
to the protocol: at most one candidate holds a valid term for the same reason that at most one guard
holds a valid lease (docs/protocol.md, "Why it is safe"); a resignation is a release, so the stores that
wake waiters on a release (Redis, PostgreSQL) hand leadership over at once; a process that exits
cleanly resigns the terms it still holds (an ``atexit`` hook); a leader that dies is replaced once its
lease has been seen unchanged for a whole lease.

* ``Election``: ``campaign()`` blocks until elected and returns the ``Term`` (a ``with`` block resigns
  at its end); ``run(on_elected, on_revoked)`` is the runner for a process whose job is to lead;
  ``leader()`` reads who leads now; ``stop()`` ends a campaign or a runner from any thread.
* ``AsyncElection``: the same over the async guard, ``async with election.campaign() as term:``;
  ``cancel_on_lost=True`` cancels the leader's body at the loss, as ``DistributedLock`` does.

The candidate's identity (the host and process by default) is put before each owner id it writes,
``identity/owner-uuid``, so that any process can read who leads (``leader()``, ``fastlease status``).
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, NamedTuple, Optional, Self

from .client import LeaseClient
from .exceptions import LockLost, LockNotAcquired, LockReleaseError
from .lock import DEFAULT_LEASE_DURATION, LeaseOptions, LeaseView, SyncDistributedLock, check_client, guard_options
from .stores.base import check_table

if TYPE_CHECKING:
    from types import TracebackType

    from .aio import DistributedLock

__all__ = ["AsyncElection", "Election", "Leader", "Term"]

#: Between the identity and the owner's own id in the owner ids a candidate writes.
IDENTITY_SEPARATOR = "/"
MAX_IDENTITY_CHARS = 128
#: A campaign without a limit waits in rounds of this long (the engine's waits are finite); the
#: client's observation of the leader's row carries over from round to round.
CAMPAIGN_ROUND_S = 3_600.0
RESIGNED = "resigned"  # on_revoked's cause for a term that ended by its own resignation
CANCELLED = "cancelled"  # on_revoked's cause when AsyncElection.run's task is cancelled while leading


class Leader(NamedTuple):
    """Who holds an election's key now, as read from the store (``Election.leader()``)."""

    identity: Optional[str]  # the candidate's identity; None for a holder that is not a candidate
    term: Optional[int]  # the term (its lease's fencing token)
    owner: str  # the holder's owner id


def default_identity() -> str:
    """This host's name and this process's id: ``host:pid``."""
    return f"{os.uname().nodename}:{os.getpid()}"


def check_identity(identity: object) -> str:
    """Return ``identity`` if it is 1-128 printable characters, not beginning ``sem:`` (a semaphore's
    holders' mark), else raise TypeError/ValueError."""
    if type(identity) is not str:
        raise TypeError(f"identity must be a str, got {type(identity).__name__}: {identity!r:.80}")
    if not 1 <= len(identity) <= MAX_IDENTITY_CHARS or not identity.isprintable():
        raise ValueError(f"identity must be 1-{MAX_IDENTITY_CHARS} printable characters, got {identity!r:.80}")
    if identity.startswith("sem:"):  # (keys.SEMAPHORE_OWNER: every reader would take it for a semaphore's slot)
        raise ValueError(f"identity must not begin with 'sem:', which marks a semaphore's holders, "
                         f"got {identity!r:.80}")
    return identity


def identity_of(owner: str) -> Optional[str]:
    """The candidate identity at the head of an owner id, or None for an owner that is not a candidate's."""
    identity, separator, _ = owner.rpartition(IDENTITY_SEPARATOR)
    return identity if separator else None


def leader_of(client: LeaseClient, table: str, key: str) -> Optional[Leader]:
    """The holder of ``key`` as a Leader (one read), or None when nobody holds it."""
    row = client.holder(table, key)
    if row is None:
        return None
    owner = str(row["owner"])
    fence = row.get("fence")
    return Leader(identity_of(owner), fence if type(fence) is int else None, owner)


class _Candidacy:
    """What both forms share: the checked arguments, the guard options, the campaign's rounds."""

    def __init__(self, client: LeaseClient, table: str, key: str, lease_duration: float,
                 identity: Optional[str]) -> None:
        self.client = check_client(client)
        if getattr(client.store, "fencing", True) is False:  # DynamoDB without fencing tokens
            raise ValueError("an election's terms are fencing tokens, and this DynamoDBClient keeps none: make it "
                             "with DynamoDBClient(..., fencing=True)")
        self.table, self.key = table, client.engine_module.check_key(key)
        self.identity = check_identity(default_identity() if identity is None else identity)
        self.options = guard_options(lease_duration, CAMPAIGN_ROUND_S, None, None)
        check_table(table)

    def round_options(self, deadline: Optional[float], on_lost: Optional[Callable[[LockLost], object]],
                      first: bool) -> Optional[LeaseOptions]:
        """The options of the campaign's next round, or None when its deadline has passed (the first
        round always runs: a campaign with ``wait_timeout=0`` makes one attempt)."""
        left = CAMPAIGN_ROUND_S if deadline is None else min(CAMPAIGN_ROUND_S, deadline - time.monotonic())
        if left <= 0 and not first:
            return None
        return self.options._replace(wait_ms=max(0, int(left * 1000)), on_lost=on_lost)

    def not_elected(self, wait_timeout: Optional[float]) -> LockNotAcquired:
        return LockNotAcquired(f"not elected on {self.key!r} in table {self.table!r} within {wait_timeout:g} s",
                               key=self.key)

    def prefix(self) -> str:
        return self.identity + IDENTITY_SEPARATOR

    def began(self, guard: LeaseView, started: float) -> Optional[_TermReport]:
        """Report a term won to the client's telemetry (``fastlease.otel``), if it has any."""
        observer = self.client.engine.observer
        if observer is None or not hasattr(observer, "term_began"):
            return None
        span = observer.term_began(self.table, self.key, self.identity, term_number(guard),
                                   time.monotonic() - started)
        return _TermReport(observer, self.table, span)

    def failed(self, started: float) -> None:
        """Report a campaign that ended without a term."""
        observer = self.client.engine.observer
        if observer is not None and hasattr(observer, "campaign_failed"):
            observer.campaign_failed(self.table, time.monotonic() - started)


class _TermReport:
    """A term as the telemetry saw it begin; ended once, with how it ended."""

    __slots__ = ("_observer", "_table", "_span")

    def __init__(self, observer: Any, table: str, span: Any) -> None:
        self._observer, self._table, self._span = observer, table, span

    def ended(self, term: LeaseView) -> None:
        span, self._span = self._span, None
        if span is not None:
            self._observer.term_ended(self._table, span, term.lost_cause or RESIGNED)


def term_number(term: LeaseView) -> int:
    """A held term's number: its lease's fencing token (every store an election runs on keeps one)."""
    token = term.fencing_token
    if token is None:
        raise RuntimeError(f"the term on {term.key!r} has no number: its lease has no fencing token")
    return token


def _ender(ended: threading.Event) -> Callable[[LockLost], object]:
    """A guard's on_lost that tells its term it is over."""
    return lambda error: ended.set()


def _deadline(wait_timeout: Optional[float]) -> Optional[float]:
    if wait_timeout is None:
        return None
    if isinstance(wait_timeout, bool) or not isinstance(wait_timeout, (int, float)) or not 0 <= wait_timeout < 1e9:
        raise ValueError(f"wait_timeout must be None or a number of seconds >= 0, got {wait_timeout!r:.80}")
    return time.monotonic() + wait_timeout


class Term(LeaseView):
    """One leadership term: the lease of the candidate that won. ``number`` is the term (the lease's
    fencing token: pass it to what the leader writes). ``wait(timeout)`` returns True once the term is
    over (lost, or the election stopped), so a leader's loop reads ``while not term.wait(10): ...``.
    ``resign()`` (or leaving its ``with`` block) releases it: on Redis and PostgreSQL the next
    candidate is woken at once. Everything a lease offers is here too: ``lost``, ``raise_if_lost()``,
    ``remaining()``, ``check_in``."""

    __slots__ = ("_guard", "_ended", "identity", "_report")

    def __init__(self, guard: SyncDistributedLock, ended: threading.Event, identity: str,
                 report: Optional[_TermReport]) -> None:
        self._guard = guard
        self._lease = guard._lease
        self._ended = ended
        self.identity = identity
        self._report = report

    @property
    def number(self) -> int:
        """The term: the lease's fencing token, higher than every earlier leader's."""
        return term_number(self)

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait up to ``timeout`` seconds for the term to end: True once it is lost or the election is
        stopped (at once if it already is), else False."""
        return self._ended.wait(timeout) or not self.is_valid()

    def resign(self) -> None:
        """Hand leadership over: release the lease. LockLost if the term had already been lost (its cause
        says why), LockReleaseError if the release stayed unconfirmed; a second call does nothing."""
        self._ended.set()
        _HELD.discard(self)
        try:
            if self.state in ("held", "lost"):
                self._guard.release()
        finally:
            if self._report is not None:
                self._report.ended(self)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: Optional[type[BaseException]], exc: Optional[BaseException],
                 traceback: Optional[TracebackType]) -> None:
        self._ended.set()
        _HELD.discard(self)
        try:
            if self.state in ("held", "lost"):
                self._guard.__exit__(exc_type, exc, traceback)
        finally:
            if self._report is not None:
                self._report.ended(self)


class Election:
    """Leader election on ``key`` of lock table ``table``, for one candidate (this process).

    ``lease_duration`` is the term's lease (seconds): a leader that dies is replaced once its lease has
    been seen unchanged for that long, and it counts its term as valid for 90% of it since its last
    renewal. ``identity`` names the candidate for ``leader()`` (default ``host:pid``). On DynamoDB the
    client must be made with ``fencing=True`` (terms are fencing tokens).
    """

    def __init__(self, client: LeaseClient, *, table: str, key: str,
                 lease_duration: float = DEFAULT_LEASE_DURATION, identity: Optional[str] = None) -> None:
        self._candidacy = _Candidacy(client, table, key, lease_duration, identity)
        self._stopping = threading.Event()
        self._mutex = threading.Lock()
        self._campaign: Optional[SyncDistributedLock] = None  # the acquisition in progress, for stop()
        self._term_ended: Optional[threading.Event] = None  # the current term's, for stop()

    @property
    def identity(self) -> str:
        """This candidate's identity, put before its owner ids (``leader()`` reads it back)."""
        return self._candidacy.identity

    def leader(self) -> Optional[Leader]:
        """Who leads now, and in which term: one read of the key's row (no campaign). A leader that died
        is still listed until it is replaced (at most a lease later), and on Redis until its key expires."""
        return leader_of(self._candidacy.client, self._candidacy.table, self._candidacy.key)

    def campaign(self, wait_timeout: Optional[float] = None) -> Term:
        """Block until elected, and return the Term, held (use it in a ``with`` block, which resigns at its
        end). LockNotAcquired after ``wait_timeout`` seconds (None: no limit), or once ``stop()`` is called."""
        deadline = _deadline(wait_timeout)
        candidacy = self._candidacy
        started = time.monotonic()
        try:
            guard, ended = self._campaign_rounds(deadline, wait_timeout)
        except LockNotAcquired:
            candidacy.failed(started)
            raise
        term = Term(guard, ended, candidacy.identity, candidacy.began(guard, started))
        _HELD.add(term)
        return term

    def _campaign_rounds(self, deadline: Optional[float], wait_timeout: Optional[float]
                         ) -> tuple[SyncDistributedLock, threading.Event]:
        """Acquire in rounds until held: the guard, and the event its loss sets."""
        candidacy = self._candidacy
        first = True
        while True:
            ended = threading.Event()
            options = candidacy.round_options(deadline, _ender(ended), first)
            first = False
            if options is None:
                raise candidacy.not_elected(wait_timeout)
            guard = SyncDistributedLock.with_options(candidacy.client, table=candidacy.table, key=candidacy.key,
                                                     options=options)
            guard._lease.owner_prefix = candidacy.prefix()
            with self._mutex:
                if self._stopping.is_set():
                    raise LockNotAcquired(f"the election on {candidacy.key!r} was stopped", key=candidacy.key)
                self._campaign, self._term_ended = guard, ended
            try:
                guard.acquire()
            except LockNotAcquired:
                if self._stopping.is_set():
                    raise LockNotAcquired(f"the election on {candidacy.key!r} was stopped",
                                          key=candidacy.key) from None
                if deadline is not None and time.monotonic() >= deadline:
                    raise candidacy.not_elected(wait_timeout) from None
                continue  # a round of an unlimited campaign ran out: the next one goes on watching
            finally:
                with self._mutex:
                    self._campaign = None
            return guard, ended

    def run(self, on_elected: Callable[[Term], object],
            on_revoked: Optional[Callable[[str], object]] = None) -> None:
        """Lead whenever elected, until ``stop()``: campaign; call ``on_elected(term)``, the leader's work,
        which should return when ``term.wait(...)`` says the term is over; resign; call
        ``on_revoked(cause)`` (``stolen``, ``expired``, ``unreachable``, ``cancelled``, or ``resigned``
        when the term ended by its resignation); campaign again. A ``LockLost`` raised by the work ends
        the term like a loss; any other exception ends it too (resigned) and is raised from ``run``."""
        while not self._stopping.is_set():
            try:
                term = self.campaign()
            except LockNotAcquired:
                if self._stopping.is_set():
                    return
                raise
            _serve(term, on_elected, on_revoked)

    def stop(self) -> None:
        """From any thread: end a campaign in progress (it raises LockNotAcquired), tell the current term
        that it is over (``term.wait`` returns True), and make ``run`` return after the work returns."""
        with self._mutex:
            self._stopping.set()
            campaign, ended = self._campaign, self._term_ended
        if campaign is not None:
            campaign.cancel()
        if ended is not None:
            ended.set()


#: Sync terms won and not yet ended by their holder: resigned at the interpreter's exit if still held.
_HELD: set[Term] = set()


@atexit.register
def _resign_at_exit() -> None:
    """A process that exits cleanly resigns, so that the next leader need not wait out its lease (one
    killed by a signal cannot: its lease runs out)."""
    for term in list(_HELD):
        if term.state == "held":
            try:
                term.resign()
            except Exception:  # noqa: BLE001, S110 - nothing to tell at exit; the lease runs out on its own
                pass


def _serve(term: Term, on_elected: Callable[[Term], object], on_revoked: Optional[Callable[[str], object]]) -> None:
    """One term of ``Election.run``: the work, the resignation, then ``on_revoked`` with the cause."""
    cause = None
    try:
        on_elected(term)
    except LockLost as lost:
        cause = lost.cause
    finally:
        try:
            term.resign()
        except LockLost as lost:
            cause = cause or lost.cause
        except LockReleaseError:
            cause = cause or "unreachable"
        if on_revoked is not None:
            on_revoked(cause or term.lost_cause or RESIGNED)


class AsyncElection:
    """The async form of :class:`Election`, over the async guard (``fastlease.DistributedLock``): the
    same arguments, plus ``cancel_on_lost``. ``async with election.campaign() as term:`` campaigns on
    entry and resigns at the block's end; with ``cancel_on_lost=True`` the task running the block is
    cancelled at the loss of the term, and the block ends with ``LockLost``. ``await
    election.run(on_elected, on_revoked)`` leads whenever elected until its task is cancelled;
    ``on_elected`` is a coroutine function, cancelled at the loss when ``cancel_on_lost`` is True."""

    def __init__(self, client: LeaseClient, *, table: str, key: str,
                 lease_duration: float = DEFAULT_LEASE_DURATION, identity: Optional[str] = None,
                 cancel_on_lost: bool = False) -> None:
        from .lock import check_cancel_on_lost

        self._candidacy = _Candidacy(client, table, key, lease_duration, identity)
        self._cancel_on_lost = check_cancel_on_lost(cancel_on_lost)

    @property
    def identity(self) -> str:
        """This candidate's identity, put before its owner ids (``leader()`` reads it back)."""
        return self._candidacy.identity

    async def leader(self) -> Optional[Leader]:
        """``Election.leader``, on a worker thread."""
        from ._offloop import run, shielded

        candidacy = self._candidacy
        return await shielded(run(candidacy.client, leader_of, candidacy.client, candidacy.table, candidacy.key))

    def campaign(self, wait_timeout: Optional[float] = None) -> AsyncCampaign:
        """``async with election.campaign() as term:``, elected on entry (LockNotAcquired after
        ``wait_timeout`` seconds; None: no limit); the term is resigned at the block's end."""
        return AsyncCampaign(self._candidacy, _deadline(wait_timeout), wait_timeout, self._cancel_on_lost)

    async def run(self, on_elected: Callable[[AsyncTerm], Awaitable[object]],
                  on_revoked: Optional[Callable[[str], object]] = None) -> None:
        """Lead whenever elected until this task is cancelled: as ``Election.run``, with ``on_elected``
        awaited inside ``async with election.campaign()``. A cancellation while leading resigns and calls
        ``on_revoked("cancelled")`` before it goes on up; one during a campaign calls nothing."""
        import asyncio  # here, not at the top: a sync Election must not pay for asyncio's import

        while True:
            cause = None
            leading = False
            try:
                async with self.campaign() as term:
                    leading = True
                    await on_elected(term)
            except LockLost as lost:
                cause = lost.cause
            except asyncio.CancelledError:
                if leading and on_revoked is not None:
                    on_revoked(CANCELLED)  # the term was resigned by the block's end
                raise
            if on_revoked is not None:
                on_revoked(cause or RESIGNED)


class AsyncTerm(LeaseView):
    """The async form's Term: ``number``, ``identity``, and what a lease offers (``lost``,
    ``raise_if_lost()``, ``remaining()``); resigned when its ``async with`` block ends."""

    __slots__ = ("identity",)

    def __init__(self, guard: DistributedLock, identity: str) -> None:
        self._lease = guard._lease
        self.identity = identity

    @property
    def number(self) -> int:
        """The term: the lease's fencing token, higher than every earlier leader's."""
        return term_number(self)


class AsyncCampaign:
    """``AsyncElection.campaign()``: rounds of async acquisitions until one holds; the guard's own exit
    (with ``cancel_on_lost``'s handling) ends the block."""

    def __init__(self, candidacy: _Candidacy, deadline: Optional[float], wait_timeout: Optional[float],
                 cancel_on_lost: bool) -> None:
        self._candidacy, self._deadline, self._wait_timeout = candidacy, deadline, wait_timeout
        self._cancel_on_lost = cancel_on_lost
        self._guard: Any = None
        self._report: Optional[_TermReport] = None

    async def __aenter__(self) -> AsyncTerm:
        started = time.monotonic()
        try:
            guard = await self._rounds()
        except LockNotAcquired:
            self._candidacy.failed(started)
            raise
        self._guard = guard
        self._report = self._candidacy.began(guard, started)
        return AsyncTerm(guard, self._candidacy.identity)

    async def _rounds(self) -> DistributedLock:
        from .aio import DistributedLock

        candidacy = self._candidacy
        first = True
        while True:
            options = candidacy.round_options(self._deadline, None, first)
            first = False
            if options is None:
                raise candidacy.not_elected(self._wait_timeout)
            guard = DistributedLock.with_options(candidacy.client, table=candidacy.table, key=candidacy.key,
                                                 options=options, cancel_on_lost=self._cancel_on_lost)
            guard._lease.owner_prefix = candidacy.prefix()
            try:
                await guard.__aenter__()
            except LockNotAcquired:
                if self._deadline is not None and time.monotonic() >= self._deadline:
                    raise candidacy.not_elected(self._wait_timeout) from None
                continue
            return guard

    async def __aexit__(self, exc_type: Optional[type[BaseException]], exc: Optional[BaseException],
                        traceback: Optional[TracebackType]) -> None:
        try:
            await self._guard.__aexit__(exc_type, exc, traceback)
        finally:
            if self._report is not None:
                self._report.ended(self._guard)
