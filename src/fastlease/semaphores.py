"""Counted semaphores: at most ``limit`` holders of one key at once, each with a lease of its own.

A semaphore of limit N is N slots, each a lease key (``key``, then ``key#slot1`` ... ``key#slot<N-1>``),
and a holder is the holder of one slot's lease (``fastlease._engine.slots``). So everything a lease
guarantees, a slot guarantees, store by store, with the same argument: at most one valid holder per
slot, hence at most N per semaphore (docs/protocol.md, "Semaphores"). Each holder renews its slot in
the background, has the slot's own fencing token (``lease.fencing_token``: it grows with every
acquisition of that slot, so a destination keeps the last token seen per slot, ``lease.key``), and
ends with ``LockLost`` if it lost the slot during the block.

* ``Semaphore``: the sync guard (``with``, ``acquire()``/``release()``), with every member of
  ``SyncDistributedLock`` plus ``slot``, ``limit`` and ``semaphore_key``;
* ``AsyncSemaphore`` (in ``aio``, with the other async forms): the async guard, with
  ``cancel_on_lost`` as ``DistributedLock``'s;
* ``holders(client, table, key)``: who holds which slot now (also ``fastlease holders``).

The decorator is ``fastlease.semaphore(client, table=..., key=..., limit=N)``, in ``decorator``.
"""

from __future__ import annotations

import os

from .client import LeaseClient
from .lock import (
    DEFAULT_LEASE_DURATION,
    DEFAULT_WAIT_TIMEOUT,
    LeaseOptions,
    SyncDistributedLock,
    check_client,
    guard_options,
)

TYPE_CHECKING = False  # typing is not imported at run time: see _typing.py
if TYPE_CHECKING:
    from typing import Any, Callable, Optional, Self

    from .exceptions import LockLost

__all__ = ["Semaphore", "holders"]

MAX_IDENTITY_CHARS = 128


def check_identity(identity: object) -> str:
    """Return ``identity`` if it is 1-128 printable characters without "/", else raise TypeError/ValueError;
    None stands for this host and process (``host:pid``)."""
    if identity is None:
        return f"{os.uname().nodename}:{os.getpid()}"
    if type(identity) is not str:
        raise TypeError(f"identity must be a str, got {type(identity).__name__}: {identity!r:.80}")
    if not 1 <= len(identity) <= MAX_IDENTITY_CHARS or not identity.isprintable() or "/" in identity:
        raise ValueError(f"identity must be 1-{MAX_IDENTITY_CHARS} printable characters without '/', "
                         f"got {identity!r:.80}")
    return identity


def slot_lease(client: LeaseClient, table: str, key: str, limit: int, options: LeaseOptions,
               identity: Optional[str]) -> Any:
    """The engine's acquisition of one slot of ``key``'s semaphore (validated: TypeError/ValueError)."""
    return check_client(client).engine_module.SlotLease(client, table, key, limit, *options,
                                                        identity=check_identity(identity))


class SlotMembers:
    """What a semaphore's guards add to a lease's members (``lease.key`` is the slot's key)."""

    __slots__ = ()
    _lease: Any

    @property
    def semaphore_key(self) -> str:
        """The semaphore's key, as given (``key`` is the key of the slot held)."""
        return str(self._lease.semaphore_key)

    @property
    def limit(self) -> int:
        """How many holders the semaphore admits at once."""
        return int(self._lease.limit)

    @property
    def slot(self) -> Optional[int]:
        """The number of the slot held (0 to limit-1), or None while no slot is held."""
        return int(self._lease.slot) if self._lease.owner is not None else None


class Semaphore(SlotMembers, SyncDistributedLock):
    """At most ``limit`` holders of ``key`` at once: ``with Semaphore(client, table="locks",
    key="reports", limit=4) as lease:`` waits (up to ``wait_timeout``) for a free slot, holds it with a
    renewed lease for the block, and frees it at the end. Arguments, members and exceptions are those
    of :class:`~fastlease.SyncDistributedLock`, plus ``limit`` (1-256) and ``identity`` (who holds the
    slot, as ``holders`` shows it; this host and process by default). A key used as a lock, or with
    another limit, raises :class:`~fastlease.exceptions.KeyKindMismatch` when a slot is found held by
    that other use."""

    __slots__ = ()

    def __init__(
        self,
        client: LeaseClient,
        *,
        table: str,
        key: str,
        limit: int,
        lease_duration: float = DEFAULT_LEASE_DURATION,
        wait_timeout: float = DEFAULT_WAIT_TIMEOUT,
        max_hold: Optional[float] = None,
        on_lost: Optional[Callable[[LockLost], object]] = None,
        identity: Optional[str] = None,
    ) -> None:
        options = guard_options(lease_duration, wait_timeout, max_hold, on_lost)
        self._lease = slot_lease(client, table, key, limit, options, identity)

    @classmethod
    def for_slots(cls, client: LeaseClient, *, table: str, key: str, limit: int, options: LeaseOptions,
                  identity: Optional[str] = None) -> Self:
        """A guard from options validated once for many guards (the decorator's path)."""
        return cls._from_lease(slot_lease(client, table, key, limit, options, identity))


def holders(client: LeaseClient, table: str, key: str, limit: Optional[int] = None) -> list[dict[str, Any]]:
    """Who holds the semaphore ``key`` now, slot by slot: ``client.holders(table, key, limit)``."""
    return check_client(client).holders(table, key, limit)
