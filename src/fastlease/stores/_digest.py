"""Hash constructors that do not load OpenSSL: for modules the renewal process imports.

``hashlib`` loads OpenSSL's libcrypto (about 3.5 MiB resident), which the renewal process needs for
nothing else. So where hashlib is not loaded yet, CPython's own implementations are used (``_sha1``,
``_sha2`` from 3.12, ``_sha256`` on 3.11); where it is (every process that made a boto3 client), its
OpenSSL ones, about three times as fast; and hashlib on an interpreter without CPython's modules.
"""

from __future__ import annotations

import sys
from importlib import import_module

TYPE_CHECKING = False  # typing is not imported at run time: see _typing.py
if TYPE_CHECKING:
    from typing import Any

#: CPython's own module of each hash, newest name first.
_BUILTIN_MODULES = {"sha1": ("_sha1",), "sha256": ("_sha2", "_sha256")}


def constructor(name: str) -> Any:
    """The constructor of hash ``name`` (``sha1`` or ``sha256``), as ``hashlib.new`` would give it."""
    if "hashlib" not in sys.modules:
        for module in _BUILTIN_MODULES[name]:
            try:
                return getattr(import_module(module), name)
            except ImportError:
                continue
    import hashlib

    return getattr(hashlib, name)
