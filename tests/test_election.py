"""Leader election (``fastlease.election``): terms that are fencing tokens, handover on resignation,
replacement of a dead leader, the runner and its callbacks, stop(), the async form; on every store."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import pytest

from fastlease import LockLost, LockNotAcquired
from fastlease.election import AsyncElection, Election, Leader
from fastlease.testing import NO_USAGE
from helpers.loops import run
from helpers.waiting import wait_until

BOUND_S = 10.0  # the longest any wait below may take before the test fails


def campaign_in_thread(election, **options):
    """Start ``election.campaign`` on a thread: (thread, outcome), outcome["term"] or outcome["error"]."""
    outcome = {}

    def campaign():
        try:
            outcome["term"] = election.campaign(**options)
        except BaseException as error:  # noqa: BLE001 - handed to the test
            outcome["error"] = error

    thread = threading.Thread(target=campaign, daemon=True)
    thread.start()
    return thread, outcome


def joined(thread):
    thread.join(BOUND_S)
    assert not thread.is_alive(), "the campaign did not end in time"


# ---- on the memory store, both engines ----------------------------------------------------------
def test_terms_are_fencing_tokens_and_increase_from_leader_to_leader(make_client):
    client = make_client()
    a = Election(client, table="leaders", key="scheduler", identity="a", lease_duration=1.0)
    b = Election(client, table="leaders", key="scheduler", identity="b", lease_duration=1.0)
    assert a.leader() is None
    with a.campaign() as first:
        assert first.number == first.fencing_token and first.identity == "a"
        assert b.leader() == Leader("a", first.number, first.owner) and first.owner.startswith("a/")
        thread, outcome = campaign_in_thread(b, wait_timeout=BOUND_S)
        with pytest.raises(LockNotAcquired):
            a.campaign(wait_timeout=0)  # one term at a time, even for the same candidate
        assert thread.is_alive()  # b waits while a leads
    joined(thread)  # a's block ended: it resigned, and b is woken
    second = outcome["term"]
    assert second.number > first.number and a.leader() == Leader("b", second.number, second.owner)
    second.resign()
    second.resign()  # a second resignation does nothing
    assert a.leader() is None
    with a.campaign(wait_timeout=0) as third:  # one attempt, and the key is free
        assert third.number > second.number


def test_a_dead_leader_is_replaced_after_its_lease_with_a_higher_term(make_client, store):
    # A leader that died: its row stays, unchanged, until a candidate has watched it for a whole lease.
    assert store.put_if_absent("leaders", "k", "dead/owner", "v", 500, 1.0, NO_USAGE) == 1
    candidate = Election(make_client(), table="leaders", key="k", identity="next", lease_duration=0.5)
    assert candidate.leader() == Leader("dead", 1, "dead/owner")
    with candidate.campaign(wait_timeout=BOUND_S) as term:
        assert term.number == 2 and term.metrics.read_requests >= 1


def test_the_runner_calls_back_and_campaigns_again_until_stopped(make_client, store):
    election = Election(make_client(), table="leaders", key="k", identity="a", lease_duration=1.0)
    events = []

    def lead(term):
        events.append(("elected", term.number))
        if len(events) == 1:
            store.remove("leaders", "k")  # the first term is taken from under the leader
            assert term.wait(BOUND_S) is True  # ends at the loss
            term.raise_if_lost()
        elif len(events) == 5:  # the third term; the second returned at once, and was resigned
            election.stop()
            assert term.wait(BOUND_S) is True  # ends at the stop

    election.run(lead, lambda cause: events.append(("revoked", cause)))
    assert events == [("elected", 1), ("revoked", "stolen"), ("elected", 2), ("revoked", "resigned"),
                      ("elected", 3), ("revoked", "resigned")]


def test_an_error_in_the_leaders_work_resigns_and_is_raised(make_client):
    election = Election(make_client(), table="leaders", key="k", identity="a", lease_duration=1.0)
    revoked = []

    def lead(term):
        raise KeyError("the work failed")

    with pytest.raises(KeyError, match="the work failed"):
        election.run(lead, revoked.append)
    assert revoked == ["resigned"] and election.leader() is None


def test_stop_ends_a_campaign_in_progress(make_client):
    client = make_client()
    holder = Election(client, table="leaders", key="k", identity="a", lease_duration=5.0)
    waiting = Election(client, table="leaders", key="k", identity="b", lease_duration=5.0)
    with holder.campaign():
        thread, outcome = campaign_in_thread(waiting)  # no limit
        wait_until(lambda: waiting._campaign is not None, BOUND_S, "the campaign's acquisition")
        waiting.stop()
        joined(thread)
    assert isinstance(outcome["error"], LockNotAcquired) and "was stopped" in str(outcome["error"])
    with pytest.raises(LockNotAcquired, match="was stopped"):
        waiting.campaign()  # a stopped election stays stopped
    waiting.run(lambda term: pytest.fail("a stopped election never leads"))


def test_a_limited_campaign_says_how_long_it_waited(make_client):
    client = make_client()
    with Election(client, table="leaders", key="k", identity="a").campaign():
        with pytest.raises(LockNotAcquired, match=r"not elected on 'k' in table 'leaders' within 0.2 s"):
            Election(client, table="leaders", key="k", identity="b").campaign(wait_timeout=0.2)


@pytest.mark.parametrize(("identity", "error", "message"), [
    ("", ValueError, r"identity must be 1-128 printable characters, got ''"),
    ("a\nb", ValueError, r"identity must be 1-128 printable characters, got 'a\\nb'"),
    ("x" * 129, ValueError, r"identity must be 1-128 printable characters"),
    (5, TypeError, r"identity must be a str, got int: 5"),
    ("sem:3:x", ValueError, r"identity must not begin with 'sem:', which marks a semaphore's holders, got 'sem:3:x'"),
])
def test_a_bad_identity_is_refused_with_the_value(make_client, identity, error, message):
    with pytest.raises(error, match=message):
        Election(make_client(), table="leaders", key="k", identity=identity)


def test_bad_arguments_are_refused_before_any_campaign(make_client):
    client = make_client()
    with pytest.raises(ValueError, match=r"table must be 3-255 characters"):
        Election(client, table="x", key="k")
    with pytest.raises(ValueError, match=r"lease_duration"):
        Election(client, table="leaders", key="k", lease_duration=0)
    with pytest.raises(TypeError, match=r"client must be a fastlease client"):
        Election(object(), table="leaders", key="k")
    with pytest.raises(ValueError, match=r"wait_timeout must be None or a number of seconds >= 0, got -1"):
        Election(client, table="leaders", key="k").campaign(wait_timeout=-1)
    with pytest.raises(TypeError, match=r"cancel_on_lost must be True or False"):
        AsyncElection(client, table="leaders", key="k", cancel_on_lost="yes")


def test_the_default_identity_is_host_and_process(make_client):
    import os

    election = Election(make_client(), table="leaders", key="k")
    assert election.identity == f"{os.uname().nodename}:{os.getpid()}"
    with election.campaign() as term:
        assert election.leader().identity == election.identity == term.identity


# ---- the async form ------------------------------------------------------------------------------
def test_async_campaign_holds_a_term_and_cancel_on_lost_ends_the_body_with_lock_lost(make_client, store):
    election = AsyncElection(make_client(), table="leaders", key="k", identity="a", lease_duration=1.0,
                             cancel_on_lost=True)

    async def main():
        async with election.campaign() as term:
            first = term.number
            assert (await election.leader()).identity == "a"
        with pytest.raises(LockLost) as info:
            async with election.campaign() as term:
                assert term.number == first + 1
                store.remove("leaders", "k")
                await asyncio.sleep(BOUND_S)  # cut short at the loss
        return info.value.cause

    assert run(main()) == "stolen"


def test_async_runner_leads_again_after_a_loss_until_cancelled(make_client, store):
    election = AsyncElection(make_client(), table="leaders", key="k", identity="a", lease_duration=1.0,
                             cancel_on_lost=True)
    events = []

    async def main():
        done = asyncio.Event()

        async def lead(term):
            events.append(("elected", term.number))
            if len(events) == 1:
                store.remove("leaders", "k")
                await asyncio.sleep(BOUND_S)  # cancelled at the loss
            done.set()
            await asyncio.sleep(BOUND_S)  # leads until the runner is cancelled

        runner = asyncio.create_task(election.run(lead, lambda cause: events.append(("revoked", cause))))
        await asyncio.wait_for(done.wait(), BOUND_S)
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
        return await election.leader()

    assert run(main()) is None  # the cancelled runner resigned
    assert events == [("elected", 1), ("revoked", "stolen"), ("elected", 2), ("revoked", "cancelled")]


def test_async_runner_cancelled_while_campaigning_revokes_nothing(make_client):
    leader = Election(make_client(), table="leaders", key="k", identity="a", lease_duration=5.0)
    waiting = AsyncElection(make_client(), table="leaders", key="k", identity="b", lease_duration=5.0)
    revoked = []

    async def main():
        runner = asyncio.create_task(waiting.run(lambda term: pytest.fail("never elected"), revoked.append))
        await asyncio.sleep(0)  # one turn of the loop: the runner runs into its campaign's first await
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
        return runner.cancelled()

    with leader.campaign():
        assert run(main()) is True
    assert revoked == []


# ---- every store -----------------------------------------------------------------------------------
def test_on_every_store_a_resignation_hands_over_to_the_waiting_candidate(make_store_client):
    a = Election(make_store_client(), table="locks", key="election", identity="a", lease_duration=2.0)
    b = Election(make_store_client(), table="locks", key="election", identity="b", lease_duration=2.0)
    with a.campaign(wait_timeout=BOUND_S) as first:
        thread, outcome = campaign_in_thread(b, wait_timeout=BOUND_S)
        assert b.leader() == Leader("a", first.number, first.owner)
    joined(thread)
    second = outcome["term"]
    try:
        assert second.number > first.number and a.leader() == Leader("b", second.number, second.owner)
    finally:
        second.resign()
    assert a.leader() is None


def test_dynamodb_without_fencing_tokens_cannot_hold_an_election(moto_session, moto_endpoint):
    from fastlease.dynamodb import DynamoDBClient

    client = DynamoDBClient(session=moto_session, endpoint_url=moto_endpoint)
    try:
        with pytest.raises(ValueError, match=r"terms are fencing tokens, and this DynamoDBClient keeps none: make it "
                                             r"with DynamoDBClient\(\.\.\., fencing=True\)"):
            Election(client, table="leaders", key="k")
    finally:
        client.close()


def test_a_leader_that_exits_cleanly_resigns_and_one_that_dies_does_not(tmp_path):
    import subprocess
    import sys

    from fastlease import SQLiteClient

    script = ("import os, sys; from fastlease import SQLiteClient; from fastlease.election import Election; "
              f"term = Election(SQLiteClient({str(tmp_path / 'l.db')!r}), table='leaders', key=sys.argv[1], "
              "identity=sys.argv[1]).campaign(); print(term.number, flush=True); "
              "os._exit(0) if sys.argv[1] == 'dies' else None")
    for key in ("exits", "dies"):
        done = subprocess.run([sys.executable, "-c", script, key], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and done.stdout.strip() == "1", done
    client = SQLiteClient(tmp_path / "l.db")
    try:
        assert Election(client, table="leaders", key="exits").leader() is None  # resigned at exit
        assert Election(client, table="leaders", key="dies").leader().identity == "dies"  # left to run out
    finally:
        client.close()
