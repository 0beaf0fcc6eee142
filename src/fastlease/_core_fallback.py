"""The pure-Python stand-ins for ``_core.pyx``, used by the interpreted engine: same names, same
results (the suite compares the two)."""

from __future__ import annotations

import threading
import uuid

#: The lock of the engine's short critical sections (``_core.Mutex`` compiled).
Mutex = threading.Lock


def new_token() -> str:
    """A random UUID4 string: used for every owner and every version."""
    return str(uuid.uuid4())
