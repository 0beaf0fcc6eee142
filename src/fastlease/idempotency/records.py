"""What a finished call leaves in the record table: a :class:`Record` in one of the terminal states,
kept for ``DEFAULT_TTL`` seconds unless the call says otherwise. :class:`Record` itself is defined with
the store protocol (``stores/base.py``), since every store reads and writes it; it is re-exported here."""

from __future__ import annotations

from ..stores.base import Record

__all__ = ["COMPLETED", "DEFAULT_TTL", "FAILED", "RETRY_AFTER_S", "Record"]

#: The state of a record whose call returned: its result is stored.
COMPLETED = "COMPLETED"
#: The state of a record whose call failed terminally (outside ``retry_on``): its failure is stored.
FAILED = "FAILED"
#: How long COMPLETED and FAILED records are kept by default (24 h).
DEFAULT_TTL = 86_400.0
#: ``IdempotencyInProgress.retry_after`` when nothing better is known.
RETRY_AFTER_S = 1.0
