"""The async guard and the async decorator branch: same semantics, and cancellation never leaves a
live guard or an unretrieved exception behind."""

from __future__ import annotations

import asyncio
import inspect

import pytest

from fastlease import DistributedLock, LockLost, LockNotAcquired, SyncDistributedLock, distributed_lock
from helpers.loops import run
from helpers.waiting import wait_until, wait_until_async

BOUND_S = 10.0  # every wait on the guard's threads and the store


def test_async_guard_holds_and_releases(make_client, store):
    client = make_client()

    async def main():
        async with DistributedLock(client, table="locks", key="k") as lease:
            assert store.rows("locks")["k"].owner == lease.owner
            lease.raise_if_lost()
        return lease

    lease = run(main())
    assert lease.state == "released" and lease.metrics.write_requests == 2
    assert store.rows("locks") == {}


def public_members(cls):
    return {name for name in dir(cls) if not name.startswith("_")}


def test_both_guards_have_the_same_members():
    # Before, metrics, raise_if_lost and check_in existed only on what __aenter__ returned.
    assert public_members(DistributedLock) == public_members(SyncDistributedLock)
    for name in ("acquire", "release", "release_by_write"):
        assert inspect.iscoroutinefunction(getattr(DistributedLock, name)), name


def test_the_async_guard_object_itself_has_the_guard_api(make_client, store):
    client = make_client()

    async def main():
        guard = DistributedLock(client, table="locks", key="k")
        assert guard.metrics.write_requests == 0 and guard.state == "new"  # never entered: metrics too
        with pytest.raises(LockLost) as info:
            guard.raise_if_lost()
        assert info.value.cause == "not_held"
        async with guard as lease:
            assert lease is guard
            guard.raise_if_lost()
            assert guard.is_valid() and guard.owner == store.rows("locks")["k"].owner
            with pytest.raises(TypeError, match="MemoryClient has no transactions"):
                guard.check_in(object())
        return guard

    guard = run(main())
    assert guard.state == "released" and guard.metrics.write_requests == 2
    assert "DistributedLock" in repr(guard)


def test_await_acquire_and_release_without_async_with(make_client, store):
    client = make_client()

    async def main():
        guard = DistributedLock(client, table="locks", key="k")
        lease = await guard.acquire()
        try:
            assert lease is guard and client.holder("locks", "k")["owner"] == guard.owner
        finally:
            await guard.release()
        assert store.rows("locks") == {}
        taken = await DistributedLock(client, table="locks", key="k").acquire()
        store.remove("locks", "k")  # an operator's forced release
        with pytest.raises(LockLost) as info:
            await taken.release()
        assert info.value.cause == "stolen"
        with pytest.raises(RuntimeError, match="single-use"):
            await guard.acquire()

    run(main())


def test_a_cancelled_acquisition_s_guard_still_has_metrics(make_client, store, real_faults):
    holder, waiter = make_client(), make_client()

    async def main():
        with SyncDistributedLock(holder, table="locks", key="k"):
            guard = DistributedLock(waiter, table="locks", key="k", wait_timeout=60)
            task = asyncio.ensure_future(guard.acquire())
            await wait_until_async(lambda: real_faults.calls["read"] >= 1, BOUND_S, "the waiter's first read")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await wait_until_async(lambda: guard.state == "failed", BOUND_S, "the guard to fail")
        return guard

    guard = run(main())
    assert guard.metrics.write_requests >= 1 and guard.metrics.wait_timeouts == 0
    assert store.rows("locks") == {}


def test_async_decorator_preserves_the_function_and_contends(make_client, store):
    client = make_client()

    async def synchronize_customer(customer_id: str) -> str:
        await asyncio.sleep(0.01)
        return f"Updated {customer_id}"

    locked = distributed_lock(client, table="locks", key="customer:{customer_id}", wait_timeout=5)(synchronize_customer)
    assert inspect.iscoroutinefunction(locked)
    assert inspect.signature(locked) == inspect.signature(synchronize_customer)

    async def main():
        return await asyncio.gather(locked("123"), locked(customer_id="123"), locked("456"))

    assert run(main()) == ["Updated 123", "Updated 123", "Updated 456"]
    assert store.rows("locks") == {}


def test_creating_a_coroutine_without_awaiting_makes_no_requests(make_client, store, real_faults):
    injector = real_faults
    client = make_client()

    @distributed_lock(client, table="locks", key="job")
    async def job() -> None: ...

    coroutine = job()
    coroutine.close()
    assert sum(injector.calls.values()) == 0


def test_one_client_serves_successive_event_loops(make_client, store):
    client = make_client()

    async def once(n):
        async with DistributedLock(client, table="locks", key="k"):
            return n

    assert [run(once(n)) for n in range(3)] == [0, 1, 2]


def test_cancelled_while_waiting_leaves_no_guard(make_client, store, real_faults):
    holder, waiter = make_client(), make_client()
    injector = real_faults

    async def main():
        with SyncDistributedLock(holder, table="locks", key="k"):
            lock = DistributedLock(waiter, table="locks", key="k", wait_timeout=60)
            task = asyncio.ensure_future(lock.__aenter__())
            await wait_until_async(lambda: injector.calls["read"] >= 1, BOUND_S, "the waiter to read our row")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await wait_until_async(lambda: lock._guard.state == "failed", BOUND_S, "the thread to stop waiting")
        return lock

    lock = run(main())
    assert store.rows("locks") == {}
    assert lock._guard.metrics.wait_timeouts == 0


def test_a_write_confirmed_after_cancellation_is_deleted(make_client, store, real_faults):
    injector = real_faults
    injector.add("put_if_absent", "block")
    client = make_client()

    async def main():
        lock = DistributedLock(client, table="locks", key="k")
        task = asyncio.ensure_future(lock.__aenter__())
        await wait_until_async(injector.blocked.is_set, BOUND_S, "the put to block")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        injector.unblock()  # the put now lands, after the cancellation
        await wait_until_async(lambda: lock._guard.state == "failed", BOUND_S, "the guard to fail")
        return lock

    lock = run(main())
    assert store.rows("locks") == {}
    assert len(client.engine.scheduler) == 0
    assert lock._guard.owner is None  # never held


def test_cancelled_just_after_acquiring_releases_in_the_background(make_client, store):
    client = make_client()

    async def main():
        lock = DistributedLock(client, table="locks", key="k")
        task = asyncio.ensure_future(lock.__aenter__())
        await asyncio.sleep(0)  # the task starts its acquisition thread and awaits it
        # Block the event loop (no await) until the thread holds the lease: the task cannot resume
        # before the cancellation below, so its cancel path must release what the thread acquired.
        wait_until(lambda: lock._guard.state == "held", BOUND_S, "the thread to hold the lease", interval=0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await wait_until_async(lambda: lock._guard.state == "released", BOUND_S, "the background release")
        return lock

    run(main())
    assert store.rows("locks") == {}


def test_cancelling_the_release_does_not_abort_it(make_client, store, real_faults):
    injector = real_faults
    injector.add("delete_if_owner", "block")
    client = make_client()

    async def main():
        lock = DistributedLock(client, table="locks", key="k")

        async def body():
            async with lock:
                pass

        task = asyncio.ensure_future(body())
        await wait_until_async(injector.blocked.is_set, BOUND_S, "the release to be in flight")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert "k" in store.rows("locks")
        injector.unblock()
        await wait_until_async(lambda: lock._guard.state == "released", BOUND_S, "the background release")

    run(main())
    assert store.rows("locks") == {}


def test_async_wait_timeout_raises_lock_not_acquired(make_client, store):
    holder, waiter = make_client(), make_client()

    async def main():
        with SyncDistributedLock(holder, table="locks", key="k"):
            with pytest.raises(LockNotAcquired):
                async with DistributedLock(waiter, table="locks", key="k", wait_timeout=0):
                    pass

    run(main())


def cancellation_storm(client_factory, store_rows, *, tasks=1000, seed=None):
    """Tasks contend on a few keys and are cancelled at random points of acquire, hold and release.
    Returns (guards, overlaps, outcomes) once every background cleanup has finished."""
    import random

    seed = seed if seed is not None else random.randrange(2**32)
    print(f"cancellation storm seed={seed}")
    rng = random.Random(seed)
    clients = [client_factory() for _ in range(3)]
    guards = []
    inside = {}
    overlaps = []
    outcomes = {"completed": 0, "cancelled": 0, "not_acquired": 0}

    async def worker(lock, key):
        async with lock:
            inside[key] = inside.get(key, 0) + 1
            try:
                if inside[key] != 1:
                    overlaps.append(key)
                await asyncio.sleep(rng.uniform(0, 0.002))  # a cancellation may land here: the hold
            finally:
                inside[key] -= 1

    async def main():
        for _ in range(tasks // 10):
            batch = []
            for _ in range(10):
                key = f"k{rng.randrange(3)}"
                lock = DistributedLock(rng.choice(clients), table="locks", key=key, lease_duration=5, wait_timeout=1)
                guards.append(lock._guard)
                batch.append(asyncio.ensure_future(worker(lock, key)))
            for task in batch:
                if rng.random() < 0.8:
                    asyncio.get_running_loop().call_later(rng.uniform(0, 0.004), task.cancel)
            for result in await asyncio.gather(*batch, return_exceptions=True):
                if isinstance(result, asyncio.CancelledError):
                    outcomes["cancelled"] += 1
                elif isinstance(result, LockNotAcquired):
                    outcomes["not_acquired"] += 1
                elif result is None:
                    outcomes["completed"] += 1
                else:
                    raise result
        # Background cleanups (releases after a cancel) finish within the cleanup budget, so no guard
        # is left held (the wait fails the test otherwise).
        await wait_until_async(lambda: all(g.state in ("released", "failed", "lost") for g in guards), 30,
                               "every guard released, failed or lost")

    run(main())
    assert store_rows() == {}
    return guards, overlaps, outcomes


@pytest.mark.slow  # a fuzz test: 1000 random cancellations, 8-11 s per engine here
def test_a_thousand_random_cancellations_leave_no_guard_and_no_row(make_client, store):
    guards, overlaps, outcomes = cancellation_storm(make_client, lambda: store.rows("locks"))
    assert overlaps == []
    assert sum(outcomes.values()) == 1000
    assert outcomes["cancelled"] > 100 and outcomes["completed"] > 50  # the storm hit both paths


# The compiled engine only: both engines meet the storm on the memory store above (one source, one
# cancellation path); what this adds is a real store's requests, timeouts and latency under it.
@pytest.mark.parametrize("core", ["c"], indirect=True)
def test_random_cancellations_against_the_dynamodb_server(moto_endpoint, moto_session, core):
    from fastlease.dynamodb import DynamoDBClient

    clients = []

    def factory():
        client = DynamoDBClient(session=moto_session, endpoint_url=moto_endpoint, _engine_module=core)
        clients.append(client)
        return client

    admin = factory()
    if admin.lock_table_exists("locks"):
        admin.boto3_client.delete_table(TableName="locks")
    admin.create_lock_table("locks")

    def rows():
        items = admin.boto3_client.scan(TableName="locks", ConsistentRead=True)["Items"]
        return {item["key"]["S"]: item for item in items}

    try:
        guards, overlaps, outcomes = cancellation_storm(factory, rows, tasks=1000)
    finally:
        for client in clients:
            client.close()
    assert overlaps == []
    assert outcomes["cancelled"] > 100 and outcomes["completed"] > 50


def test_more_waiters_than_worker_threads_never_block_the_release_they_wait_for(tmp_path, core):
    """80 tasks on one key of a store whose requests block (SQLite): 64 of them fill the acquisition
    threads while waiting, and each holder's release still runs, on the threads kept for short steps."""
    from fastlease import SQLiteClient
    from fastlease.client import ASYNC_WORKERS

    client = SQLiteClient(tmp_path / "crowd.db", _engine_module=core)
    count = ASYNC_WORKERS + 16

    async def one() -> None:
        async with DistributedLock(client, table="locks", key="crowd", wait_timeout=60):
            await asyncio.sleep(0.001)

    async def main() -> list:
        return list(await asyncio.gather(*(one() for _ in range(count)), return_exceptions=True))

    try:
        outcomes = asyncio.run(main())
    finally:
        client.close()
    assert [outcome for outcome in outcomes if outcome is not None] == []
