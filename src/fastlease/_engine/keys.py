# cython: language_level=3, embedsignature=True, freethreading_compatible=True, annotation_typing=False
"""Lock keys: the check every key passes, the strict reading of the row a store keeps under one, and key
templates resolved from a call's arguments."""

from __future__ import annotations

from ..exceptions import KeyKindMismatch, MalformedLockRow
from .timing import MAX_DURATION_MS, MAX_KEY_BYTES, MIN_LEASE_MS, PROTOCOL_V1

TYPE_CHECKING = False  # typing is not imported at run time: see _typing.py
if TYPE_CHECKING:  # annotations only
    from typing import Any, Callable

BUILT_FROM = "" if __file__.endswith((".py", ".pyc")) else FASTLEASE_SOURCE_CRC.decode("ascii")  # type: ignore[name-defined]  # noqa: F821


# ---------------------------------------------------------------------------------------------
# Lock keys, and the rows stored under them
# ---------------------------------------------------------------------------------------------
def check_key(key: object) -> str:
    """Return ``key`` if it is a str of 1-2,048 UTF-8 bytes not beginning with NUL (reserved: the
    fencing counters of DynamoDB), else raise TypeError/ValueError."""
    if type(key) is not str:  # str subclasses too: their str() may not be the value stored
        raise TypeError(f"lock key must be a str, got {type(key).__name__}: {key!r:.80}")
    if key.isascii():
        size = len(key)
    else:
        try:
            size = len(key.encode("utf-8"))
        except UnicodeEncodeError:
            raise ValueError(f"lock key is not encodable as UTF-8 (lone surrogate?): {key!r:.80}") from None
    if not 1 <= size <= MAX_KEY_BYTES:
        raise ValueError(f"lock key must be 1-{MAX_KEY_BYTES} UTF-8 bytes, got {size}: {key!r:.80}")
    if key[0] == "\x00":
        raise ValueError(f"lock key must not begin with NUL (keys that do are fastlease's own), got {key!r:.80}")
    return key


def check_row(row: Any, key: str) -> None:
    """Strict protocol v1 parsing of a row read from a store: anything unexpected fails closed."""
    owner, version, lease_ms, protocol, waiting, fence = row
    if type(waiting) is not bool:
        raise MalformedLockRow(f"lock row for {key!r} has a non-boolean waiting hint {waiting!r}", key=key)
    if fence is not None and (type(fence) is not int or fence < 1):
        raise MalformedLockRow(f"lock row for {key!r} has fencing token {fence!r}, not a positive int", key=key)
    if protocol != PROTOCOL_V1 or type(protocol) is not int:
        raise MalformedLockRow(f"lock row for {key!r} has unsupported protocol {protocol!r}", key=key)
    if type(owner) is not str or not owner or type(version) is not str or not version:
        raise MalformedLockRow(f"lock row for {key!r} has an invalid owner or version", key=key)
    if type(lease_ms) is not int or not MIN_LEASE_MS <= lease_ms <= MAX_DURATION_MS:
        raise MalformedLockRow(f"lock row for {key!r} has lease_ms {lease_ms!r} outside 100-86400000", key=key)


#: Every owner id a semaphore's holder writes begins with this, its limit and ":" (``sem:3:``); a
#: lock's owner ids (UUID4s, after an election's ``identity/``) cannot.
SEMAPHORE_OWNER = "sem:"


def check_holder_kind(owner: str, kind: str, key: str) -> None:
    """Refuse a row held under another use of ``key``: ``kind`` is ``""`` for a lock, which refuses a
    semaphore's holder, or a semaphore's ``sem:<limit>:``, which refuses a lock's holder and another
    limit's. Both sides check, so a lock and a semaphore never both wait on, or take over, the other."""
    if owner.startswith(kind) and (kind or not owner.startswith(SEMAPHORE_OWNER)):
        return
    raise KeyKindMismatch(f"{key!r} is held by {holder_kind(owner)}, and this is {holder_kind(kind)}: "
                          "a lock and a semaphore, or semaphores of two limits, cannot share a key; "
                          "change one key (or the limit)", key=key)


def holder_kind(owner: str) -> str:
    """What an owner id (or a kind) says its holder is: ``a lock`` or ``a semaphore of limit N``."""
    if not owner.startswith(SEMAPHORE_OWNER):
        return "a lock"
    return f"a semaphore of limit {owner[len(SEMAPHORE_OWNER):].partition(':')[0]}"


# ---------------------------------------------------------------------------------------------
# Key templates
# ---------------------------------------------------------------------------------------------
class KeyTemplate:
    """A lock key template, parsed once: literal text, ``{name}`` placeholders, ``{{``/``}}`` braces.

    One placeholder inserts its value as is; two or more prefix each value with its UTF-8 byte length
    and a colon, so ``"{tenant}:{id}"`` with ("acme", "123") is ``"4:acme:3:123"`` and no pair of values
    can collide by containing the separator.
    """

    def __init__(self, template: object) -> None:
        if type(template) is not str:
            raise TypeError(f"key template must be a str, got {type(template).__name__}: {template!r:.80}")
        literals: list[str] = []
        names: list[str] = []
        text: list[str] = []
        i, n = 0, len(template)
        while i < n:
            ch = template[i]
            if ch == "{":
                if template.startswith("{{", i):
                    text.append("{")
                    i += 2
                    continue
                end = template.find("}", i + 1)
                name = template[i + 1 : end] if end >= 0 else ""
                if end < 0 or not name.isidentifier():
                    raise ValueError(
                        f"key template {template!r:.200}: placeholder at offset {i} must be {{argument_name}}"
                    )
                literals.append("".join(text))
                text = []
                names.append(name)
                i = end + 1
            elif ch == "}":
                if not template.startswith("}}", i):
                    raise ValueError(f"key template {template!r:.200}: single '}}' at offset {i}; write '}}}}'")
                text.append("}")
                i += 2
            else:
                text.append(ch)
                i += 1
        literals.append("".join(text))
        self.template = template
        self.names = tuple(names)
        self._literals = tuple(literals)
        if not names:
            check_key(literals[0])

    def resolve(self, values: tuple[Any, ...]) -> str:
        """Resolve with one str value per placeholder, in order; TypeError/ValueError on bad values."""
        names = self.names
        literals = self._literals
        if len(values) != len(names):
            raise TypeError(f"key template {self.template!r:.200} takes {len(names)} values, got {len(values)}")
        if not names:
            return literals[0]
        for name, value in zip(names, values):
            if type(value) is not str:
                raise TypeError(
                    f"lock key argument {name!r} must be a str, got {type(value).__name__}: {value!r:.80}"
                )
        if len(names) == 1:
            key = literals[0] + values[0] + literals[1]
        else:
            parts = [literals[0]]
            for name, value, literal in zip(names, values, literals[1:]):
                try:
                    size = len(value.encode("utf-8"))
                except UnicodeEncodeError:
                    raise ValueError(
                        f"lock key argument {name!r} is not encodable as UTF-8: {value!r:.80}"
                    ) from None
                parts.append(f"{size}:{value}{literal}")
            key = "".join(parts)
        return check_key(key)


class CallKey:
    """A template bound to a function signature: resolves the key from one call's arguments.

    ``binder`` takes the call's arguments as the function does and returns the placeholders'
    values in order (the decorator builds it from the signature, once), so the key is resolved from
    Python's own binding of the call, and a call the function would reject fails here, before any
    request.
    """

    def __init__(self, template: KeyTemplate, binder: Callable[..., tuple[Any, ...]]) -> None:
        if not callable(binder):
            raise TypeError(f"binder must be callable, got {type(binder).__name__}")
        self.template = template
        self._binder = binder

    def resolve(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        return self.template.resolve(self._binder(*args, **kwargs))

