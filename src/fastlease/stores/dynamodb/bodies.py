"""Request bodies: the JSON encoder the fast path sends with, and shapes, the bodies of the requests a
lease cycle sends on every hold, filled in as text instead of encoded from dicts.

A lock request's parameters are nested dicts of DynamoDB's typed values (``{"key": {"S": ...}}``).
Encoding them is most of what the store and the fast path do per request when warm: about 6 µs of
the fenced acquisition's 18 µs (``bench/dynamodb_cycle.py``, the no-network line). Yet the structure of
each hot request never changes, only a few string values do. So each is described once, as a function
that builds its parameters from those values (a ``Shape``), and both transports send what that one
function describes:

* boto3 (``Boto3Transport``) calls it with the values: the parameters as a dict;
* the fast path fills the values into the text that the encoder made of the same function's
  parameters, built once with a marker in place of each value: byte for byte the encoding of the dict
  (``tests/stores/test_dynamodb_bodies.py`` checks it against ``json.dumps`` for values of every kind).

The rule that makes the two agree: a shape's function puts each of its arguments, unchanged, as a
string somewhere in the parameters (numbers are passed already as their decimal text, as DynamoDB's
``N`` values are strings), and the structure does not depend on the values. ``Shape`` refuses a
function that drops an argument.
"""

from __future__ import annotations

import json
import re
from json.encoder import encode_basestring_ascii as quote  # (C) a JSON string literal, ASCII, as the encoder writes it
from operator import itemgetter
from types import CodeType
from typing import Any, Callable, Optional

__all__ = ["Body", "Shape", "as_params", "as_text", "encode_json"]


def _no_default(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _make_encoder() -> Callable[[Any], str]:
    """``json.dumps(params, separators=(",", ":"))`` (ASCII, as botocore sends bodies), byte for byte.

    ``JSONEncoder.encode`` builds a new C encoder on every call; this one is built once. No circular-reference
    check (``markers`` None): the bodies are the store's own dicts of strings and numbers. Without the C
    accelerator (not CPython) it is JSONEncoder.encode itself.
    """
    c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
    if c_make_encoder is None:
        return json.JSONEncoder(separators=(",", ":")).encode
    chunks = c_make_encoder(None, _no_default, json.encoder.encode_basestring_ascii, None, ":", ",",
                            False, False, True)
    join = "".join

    def encode(value: Any) -> str:
        return join(chunks(value, 0))

    return encode


encode_json = _make_encoder()


class Shape:
    """One hot request's parameters, described once by ``build(*values)`` (see the module docstring).

    ``text(values)`` is ``encode_json(build(*values))`` without the dicts: the encoded parameters of a
    build with markers, cut at the markers, made at the first use. Each call quotes the values (C),
    picks them in the order the text needs them, and joins them between the constant pieces: 1.6 µs
    for the fenced acquisition's 1 KB, Body included, against 7.9 µs to build and encode its dicts
    (``timeit``, best of 5 × 50,000, 2026-12-05).
    """

    __slots__ = ("build", "_arity", "_form")

    def __init__(self, build: Callable[..., dict[str, Any]]) -> None:
        self.build = build
        code: CodeType = build.__code__  # (a function: one parameter per value)
        self._arity = code.co_argcount
        # (the pieces list with a slot between every two constant pieces, the getter of the quoted
        # values in the slots' order); None until the first use
        self._form: Optional[tuple[list[str], Callable[[tuple[str, ...]], Any]]] = None

    def text(self, values: tuple[str, ...]) -> str:
        """The request body as JSON text, for ``values`` (strings, as ``build`` takes them)."""
        pieces, pick = self._form or self._compile()
        pieces = pieces.copy()
        pieces[1::2] = pick(tuple(map(quote, values)))
        return "".join(pieces)

    def _compile(self) -> tuple[list[str], Callable[[tuple[str, ...]], Any]]:
        # NUL is in no constant of a request (keys may not begin with it, and table names cannot hold
        # it), so a marker's encoding is found only where build put that marker.
        markers = [f"\x00argument {index}\x00" for index in range(self._arity)]
        quoted = {quote(marker): index for index, marker in enumerate(markers)}
        text = encode_json(self.build(*markers))
        pattern = re.compile("|".join(map(re.escape, quoted)))
        order = [quoted[match.group()] for match in pattern.finditer(text)]
        constants = pattern.split(text)
        if sorted(set(order)) != list(range(self._arity)):
            raise ValueError(f"the request shape {self.build.__name__} does not use each of its {self._arity} "
                             f"arguments")
        if any("\\u0000" in constant for constant in constants):
            raise ValueError(f"the request shape {self.build.__name__} changes an argument before using it")
        pieces = [""] * (2 * len(order) + 1)
        pieces[::2] = constants
        # itemgetter of one index returns the item, not a 1-tuple: a slice of one slot takes a list
        pick = itemgetter(*order) if len(order) > 1 else (lambda quoted_values: [quoted_values[order[0]]])
        form = (pieces, pick)
        self._form = form  # one attribute store: threads racing here store equal forms
        return form


class Body:
    """A request's parameters as a shape and its values: ``params()`` for boto3, ``text()`` for the
    fast path. Transports take one wherever they take a dict of parameters."""

    __slots__ = ("shape", "values")

    def __init__(self, shape: Shape, *values: str) -> None:
        self.shape = shape
        self.values = values

    def params(self) -> dict[str, Any]:
        return self.shape.build(*self.values)

    def text(self) -> str:
        return self.shape.text(self.values)


def as_params(request: dict[str, Any] | Body) -> dict[str, Any]:
    """A request (parameters, or a Body) as its parameters: what boto3 sends."""
    return request.params() if type(request) is Body else request  # type: ignore[return-value]


def as_text(request: dict[str, Any] | Body) -> str:
    """A request (parameters, or a Body) as its JSON text: what the fast path sends."""
    return request.text() if type(request) is Body else encode_json(request)
