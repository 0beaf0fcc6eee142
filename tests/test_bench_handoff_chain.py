"""bench/handoff_chain.py stamps fastlease's wake-up chain through the feed's connection and the
holder's own block: should the listener's connection be renamed or bypassed, its figures would silently
read n/a. Here, on a real redis-server, the handoffs between its two workers carry every stamp, in order,
each after the release's PUBLISH that woke it, and the pairing of MONITOR's commands finds the peer's."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import handoff_chain  # noqa: E402

HOLDS = 20


def test_every_woken_acquisition_is_stamped_in_order_after_the_release_that_woke_it(redis_url: str) -> None:
    # (redis_url: a redis-server must be installed, a failure under CI=true; the bench starts its own.)
    events, chains = handoff_chain.run("fastlease", HOLDS)
    assert len(chains) == 2 * HOLDS
    publishes = sorted(int(when * 1e9) for when, _, command in events if command.startswith("PUBLISH"))
    woken = [chain for chain in chains if "readable" in chain]
    # The two workers alternate: all but a few acquisitions (a key found free) come by a wake-up.
    assert len(woken) >= HOLDS, f"only {len(woken)} of {2 * HOLDS} acquisitions were woken by the listener"
    for chain in woken:
        assert chain["readable"] <= chain["parsed"] <= chain["held"] <= chain["released"], chain
        assert handoff_chain.before(publishes, chain["readable"]) > 0, chain
    # A worker waits in line reading its feed's connection itself (the listener gives it up when poked),
    # so its turn's message is read on the waiting thread, bar a message that came as the wait began.
    by_waiter = sum(chain["by_waiter"] for chain in woken)
    assert by_waiter >= len(woken) // 2, f"only {by_waiter} of {len(woken)} turns were read by the waiting thread"


def test_the_peer_s_handoffs_are_paired_from_the_server_s_commands(redis_url: str) -> None:
    events, chains = handoff_chain.run("redis_lock", HOLDS)
    assert len(chains) == 2 * HOLDS and all(chain["held"] <= chain["released"] for chain in chains)
    pairs = handoff_chain.handoffs(events, "lpush", "SET")
    assert len(pairs) >= HOLDS and all(release < acquired for release, acquired in pairs)
