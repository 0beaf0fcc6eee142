"""Results to bytes and back (the :class:`Serializer` protocol and its JSON default), and the payload
fingerprints (over :func:`canonical_json`) that tell a reused key from a duplicate."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Protocol

__all__ = ["JSON", "JSONSerializer", "Serializer", "canonical_json", "payload_fingerprint"]


class Serializer(Protocol):
    """What ``serializer=`` takes: results to bytes and back (:class:`JSONSerializer` is the default)."""

    def dumps(self, value: Any) -> bytes:
        """Serialise a call's result; raise TypeError if it cannot be (nothing is stored then)."""

    def loads(self, data: bytes) -> Any:
        """Rebuild a stored result: what a replayed call returns."""


class JSONSerializer:
    """The default serialiser: JSON (UTF-8). Any object with ``dumps(value) -> bytes`` and
    ``loads(bytes) -> value`` can replace it. A replayed result is what ``loads`` returns (a tuple
    comes back as a list)."""

    def dumps(self, value: Any) -> bytes:
        """``value`` as compact UTF-8 JSON. TypeError if it is not JSON data (NaN and infinities included)."""
        try:
            return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
        except (TypeError, ValueError) as error:
            raise TypeError(
                f"the result is not JSON-serialisable ({error}); return JSON data or pass serializer="
            ) from error

    def loads(self, data: bytes) -> Any:
        """The value of UTF-8 JSON ``data``."""
        return json.loads(data.decode("utf-8"))


JSON = JSONSerializer()


def canonical_json(value: Any, *, allow_nan: bool = False) -> bytes:
    """``value`` as canonical JSON: sorted keys, no spaces, UTF-8. Two JSON texts that differ only in
    spacing, key order or escapes have the same canonical form. TypeError or ValueError if ``value``
    is not JSON data (NaN and infinities too, unless ``allow_nan``)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=allow_nan).encode("utf-8")


def payload_fingerprint(payload: Any) -> str:
    """A stable hash of a payload: the SHA-256 hex digest of the bytes, or of canonical JSON (sorted keys,
    no spaces). TypeError if the payload is neither bytes nor JSON data."""
    if isinstance(payload, (bytes, bytearray, memoryview)):
        data = bytes(payload)
    else:
        try:
            data = canonical_json(payload)
        except (TypeError, ValueError) as error:
            raise TypeError(
                f"the idempotency payload must be bytes or JSON data (dict, list, str, int, float, bool, None): "
                f"{error}; choose the fields that identify the request with payload="
            ) from error
    return hashlib.sha256(data).hexdigest()
