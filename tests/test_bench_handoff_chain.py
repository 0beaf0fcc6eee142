"""bench/handoff_chain.py stamps fastlease's wake-up chain through the listener's connection and the
store's ``put_in_turn``: should either be renamed or bypassed, its figures would silently read n/a. Here,
on a real redis-server, each handoff between its two workers carries every stamp, in order, and the
pairing of MONITOR's commands finds the handoffs."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import handoff_chain  # noqa: E402

HOLDS = 20


def test_every_woken_acquisition_is_stamped_in_order_and_paired_with_the_server_s_commands(redis_url: str) -> None:
    # (redis_url: a redis-server must be installed, a failure under CI=true; the bench starts its own.)
    events, chains = handoff_chain.run("fastlease", HOLDS)
    assert len(chains) == 2 * HOLDS
    woken = [chain for chain in chains if "put" in chain]  # (a message during a first put that won is no chain)
    # The two workers alternate: all but a few acquisitions (a key found free) come by a wake-up.
    assert len(woken) >= HOLDS, f"only {len(woken)} of {2 * HOLDS} acquisitions were woken by the listener"
    for chain in woken:
        assert chain["readable"] <= chain["parsed"] <= chain["put"], chain
    pairs = handoff_chain.handoffs(events, "PUBLISH", "INCR")
    assert len(pairs) >= HOLDS and all(release < acquired for release, acquired in pairs)
