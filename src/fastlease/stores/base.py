"""The store interface: the single atomic operations every lock store provides.

A store is an adapter. It never loops, sleeps, retries, generates ids or reads the protocol's clocks
(a transport may time its own requests): the engine (``fastlease._engine``) does all of that, once, for
every store. A lost race is a return value (``False``, ``None`` or ``NOT_DELETED``, as each operation
says); a failed request raises :class:`~fastlease.exceptions.StoreError` whose ``maybe_committed`` says
whether a write could still have been applied (a timeout after sending, a dropped response), so the
engine knows to reconcile it with a consistent read.

``timeout_s`` bounds the request; ``usage`` receives consumed capacity of successful responses.

What a store may run besides its requests: a *release feed* (``ReleaseFeed``, Redis pub/sub) keeps one
listener connection with its own thread, and reconnects with back-off when it drops. That is not a
protocol step: a feed only wakes waiters early, and whatever it does or fails to do, a waiter still
has to win a conditional write, so it can never grant, extend or end ownership. Nothing else in a
store runs in the background.
"""

from __future__ import annotations

from .._typing import NamedTuple, Protocol

TYPE_CHECKING = False  # typing is not imported at run time: see fastlease/_typing.py
if TYPE_CHECKING:
    from typing import Any, Callable, Optional, Sequence


def check_table(table: object) -> str:
    """Table names follow DynamoDB's rule on every store, so code moves between stores unchanged: 3-255
    characters of A-Z a-z 0-9 _ . -. Stores check names they build from (SQL identifiers, Redis keys);
    the engine checks every name a lease is given."""
    if type(table) is not str:
        raise TypeError(f"table must be a str, got {type(table).__name__}: {table!r:.80}")
    # Every lease checks its table: str methods, not a loop over the characters. ASCII, and alphanumeric
    # once each allowed separator is replaced by a letter.
    if not (3 <= len(table) <= 255 and table.isascii()
            and table.replace("_", "a").replace(".", "a").replace("-", "a").isalnum()):
        raise ValueError(f"table must be 3-255 characters of A-Z a-z 0-9 _ . -, got {table!r:.80}")
    return table


class LockRow(NamedTuple):
    """A lock row as stored: protocol v1 attributes, already converted to Python types.

    ``waiting`` is fastlease's optional hint attribute: a contender that has waited a while marks the
    holder's row (see ``LockStore.mark_waiting``) so that the holder, on release, lets the others have
    the next turn. The lock protocol never depends on it, and pydynox ignores it.

    ``fence`` is the row's fencing token on stores that keep one (a per-key counter that every
    acquisition and takeover increments and release keeps), else None.
    """

    owner: str
    version: str
    lease_ms: int
    protocol: int
    waiting: bool = False
    fence: Optional[int] = None


#: What ``delete_if_owner`` did, one int for the four outcomes. Nothing was deleted: the row was absent
#: or another owner's.
NOT_DELETED = 0
#: The row was ours and is deleted (freed, on stores that keep the fence counter in it).
DELETED = 1
#: As DELETED, and the row carried the ``waiting`` hint: a contender asked for the next turn.
DELETED_WITH_WAITERS = 2
#: Ours, and handed over by the same atomic step to the head of the key's line (stores that
#: ``hands_over``): the key is held again, by that waiter.
HANDED_OVER = 3


class UsageMeter(Protocol):
    """Where a store reports the capacity consumed by a successful response."""

    def add_capacity(self, rcu: float, wcu: float) -> None:
        """Add the read (``rcu``) and write (``wcu``) capacity units one successful response consumed."""
        ...


class _NoUsage:
    """A ``UsageMeter`` that discards capacity: for calling a store's operations directly."""

    def add_capacity(self, rcu: float, wcu: float) -> None:
        pass


#: Pass as ``usage`` when calling a store operation directly (``store.read("locks", "k", 5.0, NO_USAGE)``).
NO_USAGE = _NoUsage()


class LockStore(Protocol):
    """Single atomic operations on lock rows keyed by (table, key)."""

    #: True if a request can block (network, disk): the async API then runs it on a worker thread.
    blocking: bool

    def put_if_absent(
        self, table: str, key: str, owner: str, version: str, lease_ms: int, timeout_s: float, usage: UsageMeter
    ) -> Optional[int]:
        """Create the row (protocol 1) only if no row exists for the key. None if not created; else the
        new row's fencing token (an int >= 1), or 0 on a store that keeps none."""
        ...

    def replace_if(
        self,
        table: str,
        key: str,
        expected_owner: str,
        expected_version: str,
        owner: str,
        version: str,
        lease_ms: int,
        timeout_s: float,
        usage: UsageMeter,
    ) -> Optional[int]:
        """Overwrite the whole row only if it holds exactly (expected_owner, expected_version). Returns
        as ``put_if_absent`` does: None if not written, else the new fencing token (0 if none is kept)."""
        ...

    def update_version_if(
        self, table: str, key: str, owner: str, version: str, new_version: str, timeout_s: float, usage: UsageMeter,
        lease_ms: int = 0,
    ) -> bool:
        """Set version to new_version only if the row holds (owner, version). ``lease_ms`` is the lease's own
        (0: not given), which a store whose handover writes a shorter one (PostgreSQL) writes back; the
        others leave the row's lease_ms untouched."""
        ...

    def mark_waiting(
        self, table: str, key: str, owner: str, version: str, timeout_s: float, usage: UsageMeter
    ) -> bool:
        """Set the row's ``waiting`` hint only if it holds (owner, version) and is not marked yet;
        nothing else changes (owner, version and lease_ms stay, so observations stay valid)."""
        ...

    def delete_if_owner(
        self, table: str, key: str, owner: str, timeout_s: float, usage: UsageMeter
    ) -> int:
        """Delete the row only if its owner is ``owner``, whatever its version: ``NOT_DELETED`` if it was
        absent or another owner's, else ``DELETED``, or ``DELETED_WITH_WAITERS`` if the deleted row
        carried the ``waiting`` hint (read in the same atomic step as the delete), or ``HANDED_OVER`` where
        that step handed the lease over to the head of the key's line instead (stores that ``hands_over``)."""
        ...

    def read(self, table: str, key: str, timeout_s: float, usage: UsageMeter) -> Optional[LockRow]:
        """Strongly consistent read of the row, or None. Mistyped attributes raise MalformedLockRow."""
        ...


class ReleaseFeed(Protocol):
    """Optional: releases made by any process, reported to this one (Redis pub/sub). A client whose
    store has one sets ``client.engine.release_feed``; a waiting lease then watches its key and is woken at
    once instead of at its next poll. Only a hint: a lost report leaves the waiter to its poll. A feed may
    also offer ``wait_reading(ticket, timeout_s)`` (``_release_feed.ListenerFeed``): the engine then waits
    there, in a key's line on the system clock, reading the feed on the waiting thread itself."""

    def watch(self, table: str, key: str, wake: Callable[[], None]) -> Any:
        """Call ``wake()`` whenever the key is released, until ``unwatch``. Returns a watch with
        ``ready`` (an Event, set once reports flow) and ``was_ready`` (whether they already did: if
        not, a release since the caller's last read may have gone unreported). Never raises or waits."""
        ...

    def unwatch(self, watch: Any) -> None:
        """End a watch that ``watch`` returned: its ``wake`` is not called again. Never raises or waits."""
        ...


#: How long a waiter keeps its place in a key's line after its last read (the server's clock). A waiter
#: in line reads at least every 0.56 s (the engine's POLL_IN_LINE_MS, jittered), so only a dead, stopped
#: or departed one loses it; its place is then skipped this long after its last read at most.
LINE_ALIVE_MS = 1500


#: A waiter's offer to take a lease over on its release, where the store ``hands_over``: the owner and
#: version the lease is to be written in, its lease_ms, and the PX of the write (at most lease_ms; on
#: PostgreSQL, whose rows do not expire, the row's lease_ms), which the taker's first renewal sets to the
#: full lease.
Offer = tuple[str, str, int, int]


class WaiterLine(Protocol):
    """Optional, with a ReleaseFeed: a line of waiters per key, kept by the store (Redis, PostgreSQL). A client whose
    store has one sets ``client.engine.line``; a waiting lease then takes a place in the key's line with
    each read, and the store refuses every acquisition of the free key but that of the first live waiter,
    whose turn the release announces on the feed (a watch made with that waiter's id calls its ``turn``).
    Only liveness rests on it: the acquisition's write and its conditions are unchanged.

    ``line_key`` names another key's line to stand in, put against and wake (a semaphore's slots share the
    semaphore key's), where ``shared_lines`` says the store can name both in one step; None, the key's own."""

    #: Whether ``line_key`` may name another key than ``key`` (False on Redis Cluster: another key's line
    #: may live on another node).
    shared_lines: bool
    #: Whether a release hands the lease over to the head of the line, where that waiter's last read left
    #: an ``offer`` (Redis, PostgreSQL): the waiter is told the version and fencing token on the feed, or
    #: sees its own owner in the row at its next read, and holds the lease without a write of its own.
    #: Such a release answers ``HANDED_OVER``.
    hands_over: bool

    def read_in_line(
        self, table: str, key: str, waiter: str, timeout_s: float, usage: UsageMeter, line_key: Optional[str] = None,
        offer: Optional[Offer] = None,
    ) -> tuple[Optional[LockRow], bool]:
        """As ``read``, and ``waiter`` takes a place at the end of the line (or keeps its own) for a bounded
        time, leaving its ``offer`` where the store ``hands_over`` (a lock's waiter; none is given elsewhere).
        The row, and whether the key is free and ``waiter`` first in line."""
        ...

    def read_all_in_line(
        self, table: str, keys: Sequence[str], waiter: str, timeout_s: float, usage: UsageMeter, line_key: str
    ) -> tuple[list[Optional[LockRow]], int]:
        """``read_in_line`` of every one of ``keys`` (a semaphore's slots) in one request, the place kept once
        in ``line_key``'s line (where ``shared_lines``). The rows, and the index of the first free key if the
        turn is ``waiter``'s, else -1."""
        ...

    def put_in_turn(
        self, table: str, key: str, owner: str, version: str, lease_ms: int, waiter: str, timeout_s: float,
        usage: UsageMeter, line_key: Optional[str] = None,
    ) -> Optional[int]:
        """As ``put_if_absent``, also refused unless nobody waits in line or ``waiter`` is first among the
        live waiters; a put that is applied takes ``waiter`` out of the line in the same step."""
        ...

    def free_in_line(
        self, table: str, key: str, owner: str, line_key: str, timeout_s: float, usage: UsageMeter
    ) -> int:
        """As ``delete_if_owner``, and the release wakes the first live waiter of ``line_key``'s line alone
        (with nobody in it, every waiter on ``key``)."""
        ...

    def leave_line(
        self, table: str, key: str, waiter: str, timeout_s: float, line_key: Optional[str] = None,
        offered_owner: Optional[str] = None,
    ) -> None:
        """``waiter`` gives up its place (and its offer, deleting a lease handed over to it meanwhile in
        ``offered_owner``); if it had the turn and the key is free, the next is woken."""
        ...


class Record(NamedTuple):
    """An idempotency record as stored (in a table of its own, never a lock table).

    ``state`` is ``"COMPLETED"`` or ``"FAILED"`` (an in-flight call is a held lease, not a record);
    ``fingerprint`` hashes the call's payload; ``result`` is the serialised result or failure;
    ``expires_at_ms`` is the wall-clock expiry in Unix milliseconds, 0 for never; ``owner`` is the
    lease owner that wrote it (how a writer recognises its own record after an ambiguous write).
    """

    state: str
    fingerprint: str
    result: bytes
    expires_at_ms: int
    owner: str


class RecordStore(Protocol):
    """The two single atomic operations idempotency adds to a store."""

    #: The largest serialised result a record can hold on this store (None: no limit of its own).
    max_result_bytes: Optional[int]

    def read_record(self, table: str, key: str, timeout_s: float) -> Optional[Record]:
        """Strongly consistent read of the record, or None. Expired records may be returned: the
        caller compares ``expires_at_ms`` (stores with native expiry also drop them on their own)."""
        ...

    def finish_if_owner(
        self, lock_table: str, key: str, table: str, record: Record, now_ms: int, timeout_s: float
    ) -> bool:
        """Only while ``record.owner`` holds the lease on ``key`` in ``lock_table``, atomically: store
        ``record`` (replacing any) and delete the lease row (a release), with the fencing counter the store
        keeps for the key, if any: an idempotency key leaves only its record. False if it does not hold it.

        ``now_ms`` is the caller's wall clock (Unix ms), for stores that count an expiry from now: a
        store never reads a clock of its own, so an injected clock governs records as it does leases."""
        ...


def outcome_for_log(result: object) -> str:
    """How a store's DEBUG line names a request's outcome: the kind of answer, never the data in it (a
    record's result may be private, and an error's text may quote what the caller sent)."""
    if isinstance(result, BaseException):
        maybe_committed = getattr(result, "maybe_committed", False)
        return type(result).__name__ + (" (may have committed)" if maybe_committed else "")
    if result is None or isinstance(result, (bool, int)):
        return repr(result)  # a lost race (False, None), a fencing token, a deletion's outcome
    if isinstance(result, LockRow):
        return "row"
    if isinstance(result, Record):
        return f"record {result.state}"
    return "ok"
