# cython: language_level=3, embedsignature=True, freethreading_compatible=True, annotation_typing=False
"""A semaphore's acquisition: a lease on the first free one of ``limit`` slot keys.

A semaphore of limit N is N lease keys, its slots: the key itself, then ``<key>#slot1`` up to
``<key>#slot<N-1>``. Holding a slot is holding a lease on its key, so everything the protocol says
of a lease holds for it unchanged (validity, renewal and the renewal process, takeover only after a
whole lease of an unchanged row, reconciliation, the slot's own fencing token, release), and at most
N holders are valid at once because at most one is valid per slot. This module adds which key
an attempt writes: the slots in order, from the first, until one is held. The slots' holders write
owner ids that begin ``sem:<limit>:``, which is how a lock and a semaphore, or two limits, on one
key refuse each other (``keys.check_holder_kind``).

Where the store can name two keys in one step (``WaiterLine.shared_lines``: Redis on one node,
PostgreSQL), the semaphore keeps one line of waiters, on its key: a waiter's reads of any slot keep its
place there, a put on any slot is refused while a live waiter is ahead, and a slot's release wakes the
head of that line alone. Elsewhere (Redis Cluster, whose slots' keys hash apart) a slot's release wakes
every waiter, which reads.
"""

from __future__ import annotations

from ..exceptions import LockNotAcquired, StoreError
from .engine import describe_store_error
from .keys import SEMAPHORE_OWNER, check_key
from .lease import Lease
from .timing import MAX_KEY_BYTES, seconds_text
from .timing import NS_PER_MS as _NS_PER_MS

TYPE_CHECKING = False  # typing is not imported at run time: see _typing.py
if TYPE_CHECKING:  # annotations only
    from typing import Any, Callable, Optional

    from ..exceptions import LockLost
    from .contention import ReleaseSignals

BUILT_FROM = "" if __file__.endswith((".py", ".pyc")) else FASTLEASE_SOURCE_CRC.decode("ascii")  # type: ignore[name-defined]  # noqa: F821

#: The largest limit: a waiting attempt may read every slot, so the limit bounds its requests.
MAX_LIMIT = 256
#: Between a semaphore's key and a slot's number in the keys of its slots after the first.
SLOT_SEPARATOR = "#slot"


def check_limit(limit: object) -> int:
    """Return ``limit`` if it is an int of 1-256, else raise TypeError/ValueError."""
    if type(limit) is not int:
        raise TypeError(f"limit must be an int, got {type(limit).__name__}: {limit!r:.80}")
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be between 1 and {MAX_LIMIT} holders, got {limit!r}")
    return limit


def slot_keys(key: object, limit: object) -> tuple[str, ...]:
    """The keys of the slots of the semaphore ``key`` of ``limit``: ``key`` itself, then ``key#slot1``
    to ``key#slot<limit-1>``. Raises TypeError/ValueError for a bad key or limit, or when the last
    slot's key would be longer than a key may be."""
    base = check_key(key)
    count = check_limit(limit)
    # The last slot's suffix, the longest. (Not read back from the tuple below: Cython 3.3.1 types an item
    # taken by a constant index from a tuple display with a starred part as that part, here a list, and
    # slicing it as one crashed the compiled engine.)
    suffix = f"{SLOT_SEPARATOR}{count - 1}" if count > 1 else ""
    if len(base.encode("utf-8")) + len(suffix) > MAX_KEY_BYTES:
        raise ValueError(f"a semaphore's key must leave room for its slots' suffix ({suffix!r}) within "
                         f"{MAX_KEY_BYTES} UTF-8 bytes: shorten {base!r:.80}")
    return (base, *[f"{base}{SLOT_SEPARATOR}{slot}" for slot in range(1, count)])


class SlotLease(Lease):
    """One acquisition of one slot of a semaphore: a ``Lease`` whose attempts try the slots in order.

    Once held, it is the lease on its slot's key: ``key`` is that slot's key and ``slot`` its number
    (``semaphore_key`` stays the semaphore's). ``identity`` goes into the owner ids it writes after
    ``sem:<limit>:`` (for ``holders``). This client's waiters on any slot of the semaphore queue as one,
    so a slot released here wakes the oldest of them."""

    def __init__(
        self,
        client: Any,
        table: str,
        key: str,
        limit: int,
        lease_ms: int,
        wait_ms: int,
        max_hold_ms: int = 0,
        on_lost: Optional[Callable[[LockLost], object]] = None,
        identity: str = "",
    ) -> None:
        keys = slot_keys(key, limit)
        Lease.__init__(self, client, table, key, lease_ms, wait_ms, max_hold_ms, on_lost)
        self.semaphore_key = key
        self.limit = limit
        self.slot = 0
        self._slot_keys = keys
        self._slots_seen = [False] * limit  # which slots this acquisition has seen held: those it reads first
        self._kind = f"{SEMAPHORE_OWNER}{limit}:"
        self.owner_prefix = f"{self._kind}{identity}/"
        self._signal_key = (self.table, "\x00semaphore\x00" + key)  # (NUL: no lock's key can be it)
        self._slot_watches: list[Any] = []  # the release feed's watches of the slots the lease's own does not watch
        if getattr(self._store, "shared_lines", False):
            # The semaphore's line, kept on its key (slot 0's): waiters stand in it whichever slot they read,
            # a put on any slot is checked against it, and a slot's release wakes its head alone.
            self._line_key = keys[0]

    def acquire(self) -> None:
        """A lease's acquisition of the first free slot; the release feed's watches of the other slots
        end with it."""
        try:
            Lease.acquire(self)
        finally:
            watches, self._slot_watches = self._slot_watches, []
            for watch in watches:
                self._feed.unwatch(watch)

    def _attempt(self, deadline_ns: int) -> bool:
        """One step: each slot in order, from the first, as a lease's attempt; True once one is held.
        A write of unknown outcome is reconciled first: the step then starts at its slot. When every
        slot is held, ``_hint_ns`` is the shortest wait that any slot's holder asked for. In the
        semaphore's line, ``_attempt_in_line`` instead."""
        freed, self._freed_key = self._freed_key, None
        if self._waiter is not None and self._line_key is not None and self._pending is None:
            return self._attempt_in_line(freed, deadline_ns)
        first = self.slot if self._pending is not None else 0
        hint_ns = -1
        for slot in range(first, self.limit):
            self._aim(slot)
            if Lease._attempt(self, deadline_ns):
                return True
            self._slots_seen[slot] = self._row_seen
            if hint_ns < 0 or self._hint_ns < hint_ns:
                hint_ns = self._hint_ns
            if self._pending is not None:
                break  # a takeover of unknown outcome on this slot: the next step reconciles it here first
        self._hint_ns = hint_ns
        return False

    def _attempt_in_line(self, freed: Optional[str], deadline_ns: int) -> bool:
        """One step in the semaphore's line. On a turn, a put first on the slot whose release gave it
        (``freed``; None: slot 0, the key itself), without a read; a turn passed on by a put names no slot
        (``freed`` empty), so every slot is read instead. At the first step, a put on slot 0. Then, if not
        held, every slot in one read (``_attempt_every_slot``)."""
        if self._turn:
            if freed is None or freed in self._slot_keys:
                self._aim(0 if freed is None else self._slot_keys.index(freed))
                if Lease._attempt(self, deadline_ns):
                    return True
                if self._pending is not None:
                    return False  # a write of unknown outcome on this slot: the next step reconciles it here
            else:
                self._turn = False
        elif not self._reads:
            self._aim(0)
            if self._put_settled(deadline_ns):
                return True
        return self._attempt_every_slot(deadline_ns)

    def _attempt_every_slot(self, deadline_ns: int) -> bool:
        """A step in the semaphore's line: every slot read in one request (which keeps our place), each held
        one observed and taken over once seen unchanged for a whole lease, then a put on the first free one
        if the turn is ours. False with ``_hint_ns``: the shortest wait a holder asked for, or a poll while
        a free slot is another waiter's."""
        now_ns = self._mono()
        self._reads += 1
        try:
            rows, free = self._line.read_all_in_line(self.table, self._slot_keys, self._waiter,
                                                     self._timeout_s(deadline_ns, now_ns), self, self._line_key)
        except StoreError:
            self._request_failures += 1
            raise
        hint_ns = -1
        for slot in range(self.limit):
            row = rows[slot]
            if row is None:
                poll_ns = self._poll_ms() * _NS_PER_MS
                if free < 0 and (hint_ns < 0 or poll_ns < hint_ns):  # another waiter's turn: ours will come
                    hint_ns = poll_ns
                continue
            self._aim(slot)
            self._hint_ns = 0
            if self._contend(row, deadline_ns):
                return True
            self._slots_seen[slot] = True
            if self._pending is not None:
                return False  # a takeover of unknown outcome on this slot: the next step reconciles it here first
            if hint_ns < 0 or self._hint_ns < hint_ns:
                hint_ns = self._hint_ns
        if free >= 0:
            self._aim(free)
            self._turn = True
            if Lease._attempt(self, deadline_ns):
                return True
            if hint_ns < 0 or self._hint_ns < hint_ns:
                hint_ns = self._hint_ns
        self._hint_ns = hint_ns if hint_ns >= 0 else self._poll_ms() * _NS_PER_MS
        return False

    def _wait_turn(self, signals: ReleaseSignals, delay_ns: int, after_attempt: bool) -> None:
        """A lease's wait, woken by the release of any slot: where the store has a release feed, the first
        wait also watches every slot but the one the lease's own watch is on (the current one; in the
        semaphore's line, the semaphore's key, where the turn is announced). In the line, those other
        watches still hear a held slot's expiry (Redis) and the releases made when nobody was in line."""
        if self._feed is not None and self._watch is None:
            own = self.key if self._line_key is None else self._line_key
            self._slot_watches = [self._feed.watch(self.table, key, self._wake_on_release)
                                  for key in self._slot_keys if key != own]
        Lease._wait_turn(self, signals, delay_ns, after_attempt)

    def _aim(self, slot: int) -> None:
        """Point the lease at ``slot``: its key, its observations, and whether it was seen held."""
        self.slot = slot
        self.key = self._slot_keys[slot]
        self._cache_key = (self.table, self.key)
        self._row_seen = self._slots_seen[slot]

    def _wait_ran_out(self, last_error: Optional[BaseException], reached: bool) -> LockNotAcquired:
        """The wait budget is spent with every slot held: the error names the semaphore, and says how
        many of its slots this very client holds (guards are not reentrant)."""
        self._wait_timeouts += 1
        budget = seconds_text(self.wait_ms * _NS_PER_MS)
        message = (f"no slot of semaphore {self.semaphore_key!r} (limit {self.limit}) in table {self.table!r} "
                   f"acquired within {budget}")
        if last_error is not None:
            message += f"; last store error: {describe_store_error(last_error)}"
        else:
            mine = sum(1 for key in self._slot_keys if self._scheduler.holds((self.table, key), self))
            if mine:
                message += f"; this client holds {mine} of its {self.limit} slots itself"
        return LockNotAcquired(message, key=self.semaphore_key)
