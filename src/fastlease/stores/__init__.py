"""Store adapters: single atomic operations, no protocol logic (see ``base.LockStore``)."""

from .base import LockRow, LockStore, UsageMeter

__all__ = ["LockRow", "LockStore", "UsageMeter"]
