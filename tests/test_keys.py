"""Key templates (README.md, "The decorator and the async forms"; docs/protocol.md, "Limits"): parsing,
framing, limits and binding to call arguments."""

from __future__ import annotations

import pytest

from fastlease import SyncDistributedLock, distributed_lock


@pytest.mark.parametrize(
    ("template", "values", "expected"),
    [
        ("customer:{customer_id}", ("123",), "customer:123"),
        ("{tenant}:{id}", ("acme", "123"), "4:acme:3:123"),
        ("{tenant}:{id}", ("é", "x"), "2:é:1:x"),
        ("{a}{b}", ("", ""), "0:0:"),
        ("{a}|{b}", ("x|y", "z"), "3:x|y|1:z"),
        ("{a}:{b}", ("1:x", ""), "3:1:x:0:"),
        ("job:{name}", ("",), "job:"),
        ("lit{{x}}:{id}", ("1",), "lit{x}:1"),
        ("{{{id}}}", ("7",), "{7}"),
        ("import:daily", (), "import:daily"),
        ("}}{{", (), "}{"),
        ("{a}{a}", ("x", "y"), "1:x1:y"),
        ("k:{v}", ("日本",), "k:日本"),
        ("{v}:{w}", ("日本", "🙂"), "6:日本:4:🙂"),
    ],
)
def test_template_resolution_table(core, template, values, expected):
    assert core.KeyTemplate(template).resolve(values) == expected


def test_two_value_framing_never_collides(core):
    template = core.KeyTemplate("{a}:{b}")
    assert template.resolve(("a:b", "c")) != template.resolve(("a", "b:c"))


@pytest.mark.parametrize("template", ["{", "}", "{}", "{1a}", "{a!r}", "{a:x}", "{ a }", "a{b", "a}b", "{a}}"])
def test_malformed_templates_raise_value_error_naming_the_template(core, template):
    with pytest.raises(ValueError) as info:
        core.KeyTemplate(template)
    assert repr(template) in str(info.value)


@pytest.mark.parametrize("template", [None, b"k", 5, ["k"]])
def test_non_str_templates_raise_type_error(core, template):
    with pytest.raises(TypeError, match="key template must be a str"):
        core.KeyTemplate(template)


def test_literal_template_is_checked_once_at_parse(core):
    with pytest.raises(ValueError, match="1-2048 UTF-8 bytes"):
        core.KeyTemplate("")
    with pytest.raises(ValueError, match="1-2048 UTF-8 bytes"):
        core.KeyTemplate("x" * 2049)


def test_a_key_beginning_with_nul_is_reserved_on_every_store(core, make_client):
    # DynamoDB's fencing counters live under NUL-prefixed keys of the lock table: no lease key may name one.
    for make in (lambda: core.check_key("\x00fence\x00abc"), lambda: core.KeyTemplate("\x00"),
                 lambda: core.KeyTemplate("{x}").resolve(("\x00x",))):
        with pytest.raises(ValueError, match=r"must not begin with NUL \(keys that do are fastlease's own\)"):
            make()
    assert core.check_key("a\x00b") == "a\x00b"  # NUL elsewhere stays a key like any other
    with SyncDistributedLock(make_client(), table="locks", key="a\x00b") as lease:
        assert lease.key == "a\x00b"


@pytest.mark.parametrize("value", [5, None, b"x", True, 1.5, ["x"]])
def test_non_str_values_raise_type_error_naming_the_argument(core, value):
    with pytest.raises(TypeError, match="'customer_id' must be a str"):
        core.KeyTemplate("c:{customer_id}").resolve((value,))


def test_str_subclass_values_are_rejected(core):
    class Tagged(str):
        def __str__(self) -> str:
            return "other"

    with pytest.raises(TypeError, match="must be a str"):
        core.KeyTemplate("c:{x}").resolve((Tagged("v"),))
    with pytest.raises(TypeError, match="must be a str"):
        core.check_key(Tagged("v"))


@pytest.mark.parametrize(
    ("values", "ok"),
    [
        (("x" * 2048,), True),
        (("x" * 2049,), False),
        (("é" * 1024,), True),  # 2,048 bytes
        (("é" * 1024 + "x",), False),
        (("",), False),
    ],
)
def test_resolved_key_limit_counts_utf8_bytes(core, values, ok):
    template = core.KeyTemplate("{k}")
    if ok:
        assert template.resolve(values) == values[0]
    else:
        with pytest.raises(ValueError, match="1-2048 UTF-8 bytes"):
            template.resolve(values)


def test_framed_key_limit_includes_the_framing(core):
    template = core.KeyTemplate("{a}{b}")
    assert len(template.resolve(("x" * 1019, "y" * 1019))) == 2048  # "1019:" + 1019 bytes, twice
    with pytest.raises(ValueError, match="1-2048 UTF-8 bytes"):
        template.resolve(("x" * 1020, "y" * 1019))


@pytest.mark.parametrize("template", ["{k}", "{a}:{b}"])
def test_lone_surrogates_raise_value_error(core, template):
    values = ("\ud800",) * len(core.KeyTemplate(template).names)
    with pytest.raises(ValueError, match="UTF-8"):
        core.KeyTemplate(template).resolve(values)


def test_value_count_must_match(core):
    with pytest.raises(TypeError, match="takes 2 values, got 1"):
        core.KeyTemplate("{a}:{b}").resolve(("x",))


# ---- binding to a function's arguments (through the decorator) ---------------------------------


def test_placeholders_bind_positional_keyword_kwonly_and_defaults(make_client):
    client = make_client()
    seen = []

    @distributed_lock(client, table="locks", key="{a}/{c}/{d}")
    def job(a: str, b: str, c: str = "dc", *, d: str = "dd") -> str:
        seen.append(sorted(client.store.rows("locks")))
        return a + b + c + d

    assert job("A", "B") == "ABdcdd"
    assert job("A", "B", "C", d="D") == "ABCD"
    assert job(b="B", a="A", c="C") == "ABCdd"
    assert seen == [["1:A/2:dc/2:dd"], ["1:A/1:C/1:D"], ["1:A/1:C/2:dd"]]
    assert client.store.rows("locks") == {}


def test_bound_methods_resolve_after_self(make_client):
    client = make_client()

    class Syncer:
        def __init__(self) -> None:
            self.keys: list[list[str]] = []

        @distributed_lock(client, table="locks", key="customer:{customer_id}")
        def run(self, customer_id: str) -> str:
            self.keys.append(list(client.store.rows("locks")))
            return customer_id

    syncer = Syncer()
    assert syncer.run("42") == "42"
    bound = distributed_lock(client, table="locks", key="b:{customer_id}")(syncer.run)
    assert bound(customer_id="7") == "7"
    assert syncer.keys == [["customer:42"], ["b:7", "customer:7"]]


@pytest.mark.parametrize("template", ["{args}", "{kwargs}", "{nope}"])
def test_placeholders_must_name_regular_arguments_at_decoration(make_client, template):
    client = make_client()
    with pytest.raises(ValueError, match="must name a regular argument"):

        @distributed_lock(client, table="locks", key=template)
        def job(a: str, *args: str, **kwargs: str) -> None: ...


def test_missing_and_duplicate_arguments_raise_type_error_without_requests(make_client, store):
    client = make_client()

    @distributed_lock(client, table="locks", key="{a}")
    def job(a: str) -> None: ...

    with pytest.raises(TypeError, match="job\\(\\) missing 1 required positional argument: 'a'"):
        job()
    with pytest.raises(TypeError, match="job\\(\\) got multiple values for argument 'a'"):
        job("x", a="y")
    with pytest.raises(TypeError, match="'a' must be a str"):
        job(5)
    assert store.rows("locks") == {}


def test_positional_only_arguments_bind_as_python_binds_them(make_client, store):
    # Before, work(customer="b") ran with customer == "a" but locked job:b, and the method call
    # below raised "got multiple values" although Python accepts it.
    client = make_client()
    locked = []

    @distributed_lock(client, table="jobs", key="job:{customer}")
    def work(customer="a", /, **kw):
        locked.append(list(store.rows("jobs")))
        return customer, kw

    assert work(customer="b") == ("a", {"customer": "b"})
    assert work("c", customer="d") == ("c", {"customer": "d"})

    class Worker:
        @distributed_lock(client, table="jobs", key="job:{customer}:{job}")
        def work(self, customer, /, *args, job="sync", **kwargs):
            locked.append(list(store.rows("jobs")))
            return customer, args, job, kwargs

    assert Worker().work("abc", 7, customer="x") == ("abc", (7,), "sync", {"customer": "x"})
    assert locked == [["job:a"], ["job:c"], ["job:3:abc:4:sync"]]
    assert store.rows("jobs") == {}


@pytest.mark.parametrize("call", [lambda work: work("a", "b"), lambda work: work("a", unknown=True),
                                  lambda work: work()])
def test_a_call_python_rejects_fails_before_any_request_even_when_contended(make_client, store, faults, call):
    # Before, work("a", "b") acquired and released (2 writes) before the TypeError, and on a
    # contended key waited out the whole wait_timeout and raised LockNotAcquired instead.
    holder, client = make_client(), make_client()

    @distributed_lock(client, table="locks", key="{customer}", wait_timeout=30)
    def work(customer):
        raise AssertionError("never runs")

    with SyncDistributedLock(holder, table="locks", key="a"):
        before = dict(faults.calls)
        with pytest.raises(TypeError, match=r"\.work\(\) "):
            call(work)
        assert faults.calls == before  # no request at all: not even a read

