"""Acting on a loss: ``cancel_on_lost`` stops an async body at the loss and ends the block with ``LockLost``;
``remaining()`` bounds a sync body's next step (docs/failure-model.md, "Acting on a loss")."""

from __future__ import annotations

import asyncio

import pytest

from fastlease import DistributedLock, LockLost, SyncDistributedLock, distributed_lock
from helpers.loops import run
from helpers.waiting import wait_until

BOUND_S = 10.0  # how long a body's work would run if nothing cancelled it
LEASE_S = 1.0  # renewed every 0.33 s, valid 0.9 s: the renewal after the theft finds the row gone (stolen),
# with 0.57 s to spare before a late renewal would find the lease expired instead


def test_a_lost_lease_cancels_the_body_and_the_block_ends_with_lock_lost(make_client, store):
    client = make_client()
    heard, body = [], []

    async def main():
        with pytest.raises(LockLost) as info:
            async with DistributedLock(client, table="locks", key="k", lease_duration=LEASE_S,
                                       on_lost=heard.append, cancel_on_lost=True):
                store.remove("locks", "k")  # taken from under the holder
                try:
                    await asyncio.sleep(BOUND_S)  # the work, cut short at the loss
                except asyncio.CancelledError:
                    body.append("cancelled")
                    raise
        task = asyncio.current_task()
        assert task.cancelling() == 0  # the guard took its cancellation back
        await asyncio.sleep(0)  # and none is left pending for the code after the block
        return info.value

    error = run(main())
    assert body == ["cancelled"]
    assert error.cause == "stolen" and isinstance(error.__context__, asyncio.CancelledError)
    assert [lost.cause for lost in heard] == ["stolen"]  # on_lost still runs, before the cancellation


def test_a_cancellation_from_elsewhere_still_ends_the_block_with_cancelled_error(make_client, store):
    client = make_client()

    async def main():
        entered = asyncio.Event()

        async def work():
            async with DistributedLock(client, table="locks", key="k", cancel_on_lost=True):
                entered.set()
                await asyncio.sleep(BOUND_S)

        task = asyncio.create_task(work())
        await asyncio.wait_for(entered.wait(), BOUND_S)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(main())
    assert store.rows("locks") == {}  # released on the way out


def test_a_loss_the_body_never_awaits_through_ends_with_lock_lost_and_leaves_no_cancellation(make_client, store):
    client = make_client()

    async def main():
        with pytest.raises(LockLost) as info:
            async with DistributedLock(client, table="locks", key="k", lease_duration=LEASE_S,
                                       cancel_on_lost=True) as lease:
                store.remove("locks", "k")
                # The loss is found (and the loop told) while the body holds the loop: it ends first.
                wait_until(lease.lost.is_set, BOUND_S, "the renewal to find the row gone")
        await asyncio.sleep(0)  # the loop hears of the loss now, out of the body: no cancellation
        assert asyncio.current_task().cancelling() == 0
        return info.value

    assert run(main()).cause == "stolen"


def test_the_async_decorator_cancels_a_call_whose_lease_is_lost(make_client, store):
    client = make_client()
    body = []

    @distributed_lock(client, table="locks", key="job:{name}", lease_duration=LEASE_S, cancel_on_lost=True)
    async def job(name: str) -> str:
        store.remove("locks", f"job:{name}")
        try:
            await asyncio.sleep(BOUND_S)
        except asyncio.CancelledError:
            body.append("cancelled")
            raise
        return "done"

    with pytest.raises(LockLost) as info:
        run(job("nightly"))
    assert info.value.cause == "stolen" and body == ["cancelled"]


def test_cancel_on_lost_is_refused_where_it_cannot_work(make_client):
    client = make_client()
    with pytest.raises(TypeError, match=r"cancel_on_lost=True needs an async def, and .*report is a def"):
        @distributed_lock(client, table="locks", key="k", cancel_on_lost=True)
        def report() -> None: ...
    for bad in ("yes", 1, None):
        with pytest.raises(TypeError, match=r"cancel_on_lost must be True or False, got "):
            DistributedLock(client, table="locks", key="k", cancel_on_lost=bad)
        with pytest.raises(TypeError, match=r"cancel_on_lost must be True or False, got "):
            distributed_lock(client, table="locks", key="k", cancel_on_lost=bad)


def test_remaining_is_the_validity_left_on_the_client_s_clock(make_client, clock):
    lease = SyncDistributedLock(make_client(clock=clock), table="locks", key="k", lease_duration=10)
    assert lease.remaining() == 0.0  # not acquired yet
    lease.acquire()
    assert lease.remaining() == pytest.approx(9.0)  # 90% of the lease from the stamp before the write
    clock.advance(2)
    assert lease.remaining() == pytest.approx(7.0)  # no renewal yet (due at 10/3 s)
    clock.advance(2)  # the renewal confirmed at 3.33 s moves the end on
    assert 8.0 < lease.remaining() <= 9.0
    lease.release()
    assert lease.remaining() == 0.0
