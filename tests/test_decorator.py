"""The decorator (README.md, "The decorator and the async forms"): preserves the function, never
retries, rejects generators, no requests early."""

from __future__ import annotations

import inspect

import pytest

from fastlease import LockNotAcquired, SyncDistributedLock, distributed_lock


def test_signature_name_doc_and_return_value_are_preserved(make_client, store):
    client = make_client()

    def synchronize_customer(customer_id: str, *, dry_run: bool = False) -> dict:
        """Sync one customer."""
        return {"id": customer_id, "held": list(store.rows("locks")), "dry_run": dry_run}

    original = synchronize_customer
    synchronize_customer = distributed_lock(client, table="locks", key="customer-sync:{customer_id}")(original)
    assert synchronize_customer is not original
    assert synchronize_customer.__name__ == "synchronize_customer"
    assert synchronize_customer.__doc__ == "Sync one customer."
    assert inspect.signature(synchronize_customer) == inspect.signature(original)
    assert synchronize_customer.__wrapped__ is original
    assert synchronize_customer("123", dry_run=True) == {"id": "123", "held": ["customer-sync:123"], "dry_run": True}
    assert store.rows("locks") == {}


def test_exceptions_propagate_and_the_body_is_never_retried(make_client, store):
    client = make_client()
    calls = []

    @distributed_lock(client, table="locks", key="job")
    def job() -> None:
        calls.append(1)
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        job()
    assert calls == [1]
    assert store.rows("locks") == {}


def test_contention_raises_before_the_body_runs(make_client, clock):
    holder = make_client(clock=clock)
    client = make_client(clock=clock)
    calls = []

    @distributed_lock(client, table="locks", key="job", wait_timeout=1)
    def job() -> None:
        calls.append(1)

    with SyncDistributedLock(holder, table="locks", key="job"):
        with pytest.raises(LockNotAcquired):
            job()
    assert calls == []


def test_generators_and_async_generators_are_rejected(make_client):
    lock = distributed_lock(make_client(), table="locks", key="job")

    def gen():
        yield 1

    async def agen():
        yield 1

    with pytest.raises(TypeError, match="cannot wrap generator"):
        lock(gen)
    with pytest.raises(TypeError, match="cannot wrap generator"):
        lock(agen)


def test_decoration_makes_no_requests_and_validates_early(make_client, faults):
    client = make_client()
    with pytest.raises(ValueError, match="lease_duration"):
        distributed_lock(client, table="locks", key="k", lease_duration=0.01)
    with pytest.raises(ValueError, match="wait_timeout"):
        distributed_lock(client, table="locks", key="k", wait_timeout=-1)
    with pytest.raises(ValueError, match="table must be"):
        distributed_lock(client, table="x", key="k")
    with pytest.raises(ValueError, match="placeholder"):
        distributed_lock(client, table="locks", key="{")

    @distributed_lock(client, table="locks", key="k:{a}")
    def job(a: str) -> str:
        return a

    assert sum(faults.calls.values()) == 0
    assert job("x") == "x"
    assert faults.calls["put_if_absent"] == 1 and faults.calls["delete_if_owner"] == 1


def test_each_call_gets_a_fresh_single_use_guard(make_client):
    client = make_client()

    @distributed_lock(client, table="locks", key="k")
    def job(n: int) -> int:
        return n * 2

    assert [job(n) for n in range(5)] == [0, 2, 4, 6, 8]
