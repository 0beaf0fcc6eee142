"""Hostile input, generated: 40,000 key templates, argument values, keys, tables and durations
(unicode, surrogates, huge strings, NaN, inf, negatives, bools posing as ints, other types).

For every case: the compiled and the interpreted engine (one source) give the same outcome (the same result, or
the same exception type and message); the only exceptions are the documented TypeError and ValueError,
each with a message that names the problem; nothing crashes. Hypothesis runs derandomised, so CI sees
the same cases every time.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastlease import MemoryClient, Semaphore, SyncDistributedLock, _impl
from fastlease.idempotency import IdempotentCall

compiled = _impl.load("c")  # built by make test; missing, the module fails to collect (never skips)
interpreted = _impl.load("py")

pytestmark = pytest.mark.slow  # about 25 s of generated cases

CASES = settings(max_examples=4_000, deadline=None, derandomize=True, database=None,
                 suppress_health_check=list(HealthCheck))

#: Any code point, surrogates included.
any_char = st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=())
text = st.one_of(
    st.text(any_char, max_size=40),
    st.text(st.sampled_from("{}ab_:9 é"), max_size=30),  # brace-heavy: the template grammar's edges
    st.builds(lambda s, n: s * n, st.text(any_char, min_size=1, max_size=3), st.integers(600, 3000)),  # huge
)
values = st.one_of(
    text, st.integers(-(2**70), 2**70), st.booleans(), st.none(), st.floats(allow_nan=True, allow_infinity=True),
    st.binary(max_size=10), st.lists(st.integers(), max_size=3),
)
durations = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**70), 2**70), st.booleans(), st.none(),
    st.text(max_size=5), st.decimals(allow_nan=True, allow_infinity=True), st.fractions(),
    st.sampled_from([0.1, 0.0999999, 86_400, 86_400.0001, 1e-9, -0.0, 30]),
)


#: Guards are only built here, never entered: one client per implementation serves every case.
CLIENTS = {compiled: MemoryClient(_engine_module=compiled), interpreted: MemoryClient(_engine_module=interpreted)}


def outcome(action: Callable[[], Any]) -> tuple:
    """("ok", result) or (exception type name, message). Only TypeError and ValueError may escape."""
    try:
        return ("ok", action())
    except (TypeError, ValueError) as error:
        message = str(error)
        assert message and len(message) < 5000, f"unclear message for {type(error).__name__}: {message!r:.200}"
        return (type(error).__name__, message)


def same(action: Callable[[Any], Any]) -> tuple:
    """The outcome with the compiled engine, checked equal to the interpreted one's."""
    with_c, with_py = outcome(lambda: action(compiled)), outcome(lambda: action(interpreted))
    assert with_c == with_py
    return with_c


@CASES
@given(template=st.one_of(text, values))
def test_key_templates(template):
    parsed = same(lambda core: core.KeyTemplate(template).names)
    if parsed[0] == "ok":
        assert all(name.isidentifier() for name in parsed[1])


@CASES
@given(template=st.text(st.sampled_from("ab{}_:x"), max_size=12).map(lambda t: t + "{a}:{b}"),
       first=values, second=values)
def test_key_templates_resolved_with_any_values(template, first, second):
    def resolve(core: Any) -> str:
        return core.KeyTemplate(template).resolve((first, second))

    resolved = same(resolve)
    if resolved[0] == "ok":
        assert isinstance(resolved[1], str) and 1 <= len(resolved[1].encode("utf-8")) <= 2048


@CASES
@given(lease_ms=durations, wait_ms=durations, max_hold_ms=durations)
def test_engine_durations(lease_ms, wait_ms, max_hold_ms):
    def build(core: Any) -> str:
        return str(core.Lease(CLIENTS[core], "locks", "k", lease_ms, wait_ms, max_hold_ms).state_name)

    same(build)


@CASES
@given(table=st.one_of(text, values), key=st.one_of(text, values), lease_duration=durations,
       wait_timeout=durations, max_hold=durations)
def test_public_guards(table, key, lease_duration, wait_timeout, max_hold):
    def guard(core: Any) -> str:
        return SyncDistributedLock(CLIENTS[core], table=table, key=key, lease_duration=lease_duration,
                                   wait_timeout=wait_timeout, max_hold=max_hold).state

    same(guard)


@CASES
@given(key=st.one_of(text, values), limit=st.one_of(values, st.integers(-3, 300)), identity=st.one_of(text, values))
def test_semaphores(key, limit, identity):
    def guard(core: Any) -> tuple:
        built = Semaphore(CLIENTS[core], table="locks", key=key, limit=limit, identity=identity)
        return (built.state, built.limit, built.semaphore_key)

    built = same(guard)
    if built[0] == "ok":
        assert built[1][1] == limit and 1 <= limit <= 256


@settings(max_examples=2_000, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(key=st.one_of(text, values), ttl=durations, wait=durations)
def test_idempotent_calls(key, ttl, wait):
    result = outcome(lambda: IdempotentCall(CLIENTS[compiled], table="payments", key=key, ttl=ttl, wait=wait).state)
    assert result[0] in ("ok", "TypeError", "ValueError")
