"""The slots of a Redis Cluster, as its nodes report them: for :mod:`fastlease.testing.redis_cluster`.

What a node says about the slots (``CLUSTER SLOTS``, the ``cluster_state`` line of ``CLUSTER INFO``) is
read here into plain values, and the nodes' answers are compared: a cluster has converged when every
node says ``cluster_state:ok`` and all report the same owner for each of the :data:`CLUSTER_SLOTS`
slots. Nothing here starts, stops or changes a node; the admin connections are the caller's.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

#: (host, port) of one node.
Node = tuple[str, int]

#: The number of hash slots of every Redis Cluster.
CLUSTER_SLOTS = 16384


def check_slot(slot: object) -> int:
    """``slot`` if it is a slot number (an int from 0 to 16383), else ValueError saying how to get one."""
    if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < CLUSTER_SLOTS:
        raise ValueError(f"slot must be an int from 0 to {CLUSTER_SLOTS - 1}, not {slot!r} "
                         "(redis.crc.key_slot(key) gives a key's)")
    return slot


def slot_ranges(reply: Sequence[Any]) -> list[tuple[int, int, Node]]:
    """``CLUSTER SLOTS`` as sorted (first slot, last slot, the primary's (host, port))."""
    ranges = []
    for entry in reply:
        first, last, primary = entry[0], entry[1], entry[2]
        host = primary[0].decode() if isinstance(primary[0], bytes) else str(primary[0])
        ranges.append((int(first), int(last), (host, int(primary[1]))))
    return sorted(ranges)


def _covers_every_slot(ranges: list[tuple[int, int, Node]]) -> bool:
    expected = 0
    for first, last, _ in ranges:
        if first != expected:
            return False
        expected = last + 1
    return expected == CLUSTER_SLOTS


def _cluster_state(info: bytes) -> str:
    """``ok`` or ``fail`` from a ``CLUSTER INFO`` reply ("?" if it has no ``cluster_state`` line)."""
    for line in info.decode().splitlines():
        name, _, value = line.partition(":")
        if name == "cluster_state":
            return value.strip()
    return "?"


def disagreement(admins: Iterable[tuple[int, Any]]) -> Optional[str]:
    """None when every node of ``admins`` (each node's number and its admin connection, a ``redis.Redis``)
    says ``cluster_state:ok`` and all report the same owner for every slot, else what is not so yet. It
    asks the nodes in turn and stops at the first that is not ready."""
    views = []
    for index, client in admins:
        state = _cluster_state(client.execute_command("CLUSTER", "INFO"))
        if state != "ok":
            return f"node {index} says cluster_state:{state}"
        ranges = slot_ranges(client.execute_command("CLUSTER", "SLOTS"))
        if not _covers_every_slot(ranges):
            return f"node {index} does not see all {CLUSTER_SLOTS} slots assigned: {ranges}"
        views.append(ranges)
    if any(view != views[0] for view in views[1:]):
        return f"the nodes disagree on the slots' owners: {views}"
    return None
