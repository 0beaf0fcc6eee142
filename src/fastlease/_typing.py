"""Run-time stand-ins for the few :mod:`typing` constructs that the modules ``import fastlease`` loads
use outside annotations: ``NamedTuple``, ``Protocol`` and ``cast``.

Importing typing costs about 9 ms, a third of what ``import fastlease`` would cost, and Lambda cold
starts and every CLI call pay for it. Type checkers read the ``TYPE_CHECKING`` branch and see the
real constructs; at run time ``NamedTuple`` builds a ``collections.namedtuple`` (fields from the
class's annotations, defaults from its assignments, methods and docstring kept), ``Protocol`` is a
plain base for interfaces that are documentation (none is checked with ``isinstance``), and
``cast`` returns its value. Everything else from typing is only named in annotations, which
``from __future__ import annotations`` leaves unevaluated, behind ``if TYPE_CHECKING:``.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NamedTuple as NamedTuple
    from typing import Protocol as Protocol
    from typing import cast as cast
else:
    import collections

    def cast(kind, value):
        """Return ``value``: the type is for type checkers only."""
        return value

    class Protocol:
        """Base of an interface that documents what an implementation provides (duck-typed)."""

        __slots__ = ()

    #: Class attributes of the statement itself, never copied onto the tuple.
    _CLASS_KEYS = frozenset({"__annotations__", "__module__", "__qualname__", "__orig_bases__"})

    class _NamedTupleMeta(type):
        def __new__(mcls, name, bases, namespace):
            if not bases:  # the NamedTuple root below
                return super().__new__(mcls, name, bases, namespace)
            fields = tuple(namespace.get("__annotations__", {}))
            defaults = [namespace[field] for field in fields if field in namespace]
            built = collections.namedtuple(name, fields, defaults=defaults, module=namespace["__module__"])
            built.__qualname__ = namespace.get("__qualname__", name)
            for key, value in namespace.items():
                if key not in _CLASS_KEYS and key not in fields:
                    setattr(built, key, value)
            return built

    class NamedTuple(metaclass=_NamedTupleMeta):
        """``class Row(NamedTuple): field: type = default`` makes a ``collections.namedtuple``."""
