"""The hot requests' bodies (``stores/dynamodb/bodies.py``): the text the fast path fills in is, byte for
byte, what botocore and the encoder make of the same shape's parameters, for values of every kind."""

from __future__ import annotations

import json
import random

import pytest

from fastlease.stores.dynamodb import store
from fastlease.stores.dynamodb.bodies import Body, Shape, encode_json

SHAPES = {name: getattr(store, name) for name in
          ("ACQUIRE", "FENCED_ACQUIRE", "TAKEOVER", "FENCED_TAKEOVER", "RENEWAL", "RELEASE", "READ")}
#: What a value may hold: JSON's escapes (quote, backslash, control characters), braces and percent
#: signs (format syntax), non-ASCII in and beyond the BMP, U+2028, and NUL (a counter's key begins with it).
ALPHABET = 'ab"\\{}%\x00\x01\x1f\x7f\n\t/é\u2028\U0001f600 09:#'


def values_for(shape: Shape, rng: random.Random) -> tuple[str, ...]:
    return tuple("".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 12))) for _ in range(shape._arity))


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_the_filled_text_is_the_encoded_parameters(name):
    shape = SHAPES[name]
    rng = random.Random(name)
    for _ in range(300):
        body = Body(shape, *values_for(shape, rng))
        expected = json.dumps(body.params(), separators=(",", ":"))  # as botocore serialises it
        assert body.text() == expected == encode_json(body.params())


def test_the_store_sends_the_cycle_through_its_shapes():
    """The lease cycle's requests are Bodies, so the fast path sends them as filled text."""
    sent: list[tuple[str, object]] = []

    class Recording:
        def call(self, operation, params, timeout_s):
            sent.append((operation, params))
            return {}

    for fencing in (False, True):
        adapter = store.DynamoDBStore(Recording(), fencing)
        adapter.put_if_absent("t", "k", "o", "v", 1000, 1.0, store.NO_USAGE)
        adapter.replace_if("t", "k", "o", "v", "o2", "v2", 1000, 1.0, store.NO_USAGE)
        adapter.update_version_if("t", "k", "o2", "v2", "v3", 1.0, store.NO_USAGE)
        adapter.delete_if_owner("t", "k", "o2", 1.0, store.NO_USAGE)
        adapter.read("t", "k", 1.0, store.NO_USAGE)
    shapes = [params.shape for _, params in sent if type(params) is Body]
    assert shapes == [store.ACQUIRE, store.TAKEOVER, store.RENEWAL, store.RELEASE, store.READ,
                      store.FENCED_ACQUIRE, store.FENCED_TAKEOVER, store.RENEWAL, store.RELEASE, store.READ]
    fenced = next(params for operation, params in sent if operation == "TransactWriteItems")
    put, counter = fenced.params()["TransactItems"]
    assert put["Put"]["Item"]["fence"] == counter["Update"]["ExpressionAttributeValues"][":fence"]
    assert counter["Update"]["Key"] == {"key": {"S": store.fence_key("k")}}


def test_a_shape_must_place_every_argument_unchanged():
    def drops(table, key):
        return {"TableName": table}

    with pytest.raises(ValueError, match="request shape drops does not use each of its 2 arguments"):
        Shape(drops).text(("t", "k"))
    with pytest.raises(ValueError, match="does not use each of its 1 arguments"):
        Shape(lambda key: {"Key": key.upper()}).text(("k",))
    with pytest.raises(ValueError, match="changes an argument before using it"):
        Shape(lambda key: {"Key": key, "Other": "<" + key + ">"}).text(("k",))
    one = Shape(lambda key: {"Key": {"S": key}, "Again": key})
    assert one.text(('"',)) == '{"Key":{"S":"\\""},"Again":"\\""}'
