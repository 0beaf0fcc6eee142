"""Leases across real processes on a Redis Cluster: 8 processes on one key, a SIGKILLed holder, and
slots migrated one by one while processes hold and contend for their keys.

Workers run in ``multiprocessing`` *spawn* children (``mp_workers``), each with its own
``RedisClient('redis+cluster://...')`` (and, for leases of 1 s or more, its renewal process, which
routes by slot too). Every wait is bounded, and every child is SIGKILLed by its PID and joined when its
test ends (the ``children`` fixture). The first two tests use the session's cluster, emptied first
(``redis_cluster_db``); the migration test starts a cluster of its own (``make_redis_cluster``).
"""

from __future__ import annotations

import time
from multiprocessing.connection import wait as wait_for_pipes
from typing import Any, Callable, Iterator

import pytest

from fastlease import SyncDistributedLock
from fastlease.exceptions import LOST_CAUSES
from fastlease.redis import RedisClient
from fastlease.stores.redis.cluster import ClusterLayout, key_slot
from fastlease.testing.redis_cluster import Node, RedisClusterServer
from helpers import mp_workers
from helpers.processes import (
    JOIN_S,
    REPORT_S,
    Child,
    Children,
    assert_exclusive,
    kill_and_reap,
    receive,
    run_contenders,
    tell,
)
from helpers.waiting import wait_until

TABLE = "locks"
CONTENDERS, ROUNDS = 8, 4
#: Under 1 s, so that renewals stay in each worker (8 renewal processes would double the start-up): the
#: holds last 5-30 ms, and renewals are not what this test is about.
CONTENTION_LEASE_S = 0.9
#: The SIGKILLed holder's lease.
KILL_LEASE_S = 1.0
#: A takeover after a SIGKILL comes at most this long after the key's PX runs out. Nothing is published
#: for a lease that expires, but the contender's last read gave its PTTL, and its release listener wakes
#: it then (within a 10 ms tick): what remains is one read and one write. The single-node test
#: (tests/stores/test_redis.py) has the same bound.
TAKEOVER_SLACK_S = 0.05
#: The migration test: three keys, one on each node at first, three processes that hold them (and contend:
#: they draw keys at random) for 0.4-0.7 s at a time, under leases of 1 s, renewed every 1/3 s by each
#: worker's renewal process.
MIGRATION_WORKERS = 3
MIGRATION_LEASE_S = 1.0
MIGRATION_HOLD_S = (0.4, 0.7)
#: Bound for each wait on the cluster's or the workers' progress in the migration test.
PROGRESS_S = 10.0


@pytest.fixture
def cluster(redis_cluster_db: Any, redis_cluster_url: str) -> Iterator[tuple[str, Any]]:
    """The session's cluster, every primary emptied: its URL and a redis-py ``RedisCluster`` on it."""
    yield redis_cluster_url, redis_cluster_db


# ---- contention -----------------------------------------------------------------------------------
def test_eight_processes_never_hold_a_key_at_the_same_time(children: Children, cluster: tuple[str, Any]) -> None:
    url, db = cluster
    holds = run_contenders(children, url, TABLE, "hot", CONTENDERS, ROUNDS, True, CONTENTION_LEASE_S)
    assert len(holds) == CONTENDERS * ROUNDS
    assert len({hold[2] for hold in holds}) == len(holds), "an owner id was reused"
    assert_exclusive(holds, CONTENDERS)
    tokens = [hold[5] for hold in sorted(holds)]  # in the order of acquisition
    assert tokens == list(range(1, len(holds) + 1)), f"fencing tokens out of order: {tokens}"
    assert db.exists(ClusterLayout.lease(TABLE, "hot")) == 0  # every hold released
    assert db.get(ClusterLayout.fence(TABLE, "hot")) == str(len(holds)).encode()


# ---- a SIGKILLed holder ---------------------------------------------------------------------------
def test_a_sigkilled_holder_is_recovered_by_expiry_within_its_remaining_ttl(
    children: Children, cluster: tuple[str, Any]
) -> None:
    url, db = cluster
    lease = ClusterLayout.lease(TABLE, "killed")
    child = children.start(mp_workers.hold_until_killed, url, TABLE, "killed", KILL_LEASE_S, "fastlease", True)
    _, pid, child_owner = receive(child, "held")
    assert db.hget(lease, "owner") == child_owner.encode()
    kill_and_reap(child)
    remaining_s = db.pttl(lease) / 1000
    assert 0 < remaining_s <= KILL_LEASE_S
    client = RedisClient(url)
    try:
        started = time.monotonic()
        with SyncDistributedLock(client, table=TABLE, key="killed", lease_duration=KILL_LEASE_S,
                                 wait_timeout=10) as taken:
            waited = time.monotonic() - started
            assert taken.fencing_token == 2
            assert db.hget(lease, "owner") == taken.owner.encode()
    finally:
        client.close()
    bound = remaining_s + TAKEOVER_SLACK_S
    print(f"taken over {waited - remaining_s:.3f} s after the TTL ran out")
    assert waited <= bound, f"recovered {waited:.3f} s after the kill, TTL {remaining_s:.3f} s (bound {bound:.3f} s)"
    assert waited >= remaining_s - 0.05, f"taken over {waited:.3f} s after the kill, within its TTL {remaining_s:.3f} s"


# ---- slot migration under held leases --------------------------------------------------------------
class Reports:
    """Every report of the migration test's workers, read as they come: each acquisition ("held") in
    ``held`` as (key, owner, token), each worker's final report in ``done``; an error fails the test."""

    def __init__(self, workers: list[Child]) -> None:
        self.workers = workers
        self.held: list[tuple[str, str, int]] = []
        self.done: dict[int, tuple[list, int]] = {}

    def pump(self, timeout_s: float) -> None:
        """Read whatever the workers reported, waiting up to ``timeout_s`` for the first report."""
        waiting = [worker.out for worker in self.workers if worker.proc.pid not in self.done]
        for ready in wait_for_pipes(waiting, timeout=timeout_s):
            worker = next(w for w in self.workers if w.out is ready)
            report = self._receive(worker)
            if report[0] == "held":
                _, _, key, owner, token = report
                self.held.append((key, owner, token))
            else:
                self.done[worker.proc.pid] = (report[2], report[3])

    @staticmethod
    def _receive(worker: Child) -> tuple:
        try:
            report = worker.out.recv()
        except EOFError:
            worker.proc.join(timeout=JOIN_S)
            raise AssertionError(f"worker {worker.proc.pid} exited ({worker.proc.exitcode}) without reporting") \
                from None
        if report[0] == "error":
            raise AssertionError(f"worker {worker.proc.pid} failed:\n{report[-1]}")
        return report

    def wait_until(self, condition: Callable[[], bool], what: str, bound_s: float = PROGRESS_S) -> None:
        """Read reports until ``condition()`` holds; fails after ``bound_s``."""

        def reported() -> bool:
            if condition():
                return True
            self.pump(0.05)  # the pause between looks: waiting for the next report
            return condition()

        wait_until(reported, bound_s, what, interval=0)


def one_key_per_node(server: RedisClusterServer) -> list[str]:
    """A key whose slot each node owns, in node order."""
    found: dict[Node, str] = {}
    for n in range(1000):  # bounded: 1000 names spread over 3 nodes' slot ranges
        key = f"job-{n}"
        found.setdefault(server.node_for_slot(key_slot(key)), key)
        if len(found) == len(server.nodes):
            return [found[node] for node in server.nodes]
    raise AssertionError(f"no key on every node among 1000: {found}")


def lease_version(server: RedisClusterServer, node: Node, name: bytes) -> Any:
    """The ``version`` field of lease ``name`` on ``node``, which is importing its slot (so ``ASKING`` first,
    on the same connection); None once the lease is gone."""
    pipe = server.admin(node).pipeline(transaction=False)
    pipe.execute_command("ASKING")
    pipe.hget(name, "version")
    return pipe.execute()[1]


def move_one_key(server: RedisClusterServer, source: Node, target: Node, name: bytes) -> None:
    """``MIGRATE`` the key ``name`` alone from ``source`` to ``target`` (its slot must be migrating there)."""
    reply = server.admin(source).execute_command("MIGRATE", target[0], target[1], name, 0, 5000)
    assert reply in (b"OK", "OK", True), f"MIGRATE of {name!r} answered {reply!r}"


def move_slot_under_its_holder(server: RedisClusterServer, reports: Reports, key: str) -> tuple:
    """Migrate the slot of ``key`` to the next node while a worker holds the key; returns (key, the
    holder's owner id, monotonic time the move began, when it finished, "renewed" or "released": what the
    holder did to its lease on the importing node, the fencing counter's value right after the move)."""
    slot = key_slot(key)
    source = server.node_for_slot(slot)
    target = server.nodes[(server.nodes.index(source) + 1) % len(server.nodes)]
    lease, fence = ClusterLayout.lease(TABLE, key), ClusterLayout.fence(TABLE, key)
    seen = len(reports.held)
    reports.wait_until(lambda: any(k == key for k, _, _ in reports.held[seen:]), f"a new hold of {key!r}")
    holder = next(owner for k, owner, _ in reversed(reports.held) if k == key)
    # As on a node added to scale out, the target has run none of the scripts: an EVALSHA sent there by
    # an ASK gets NOSCRIPT, and the script must be loaded on that node, not on the slot's owner.
    server.admin(target).script_flush()
    server.begin_migration(slot, target)
    began = time.monotonic()
    move_one_key(server, source, target, lease)
    version = lease_version(server, target, lease)
    assert version is not None, f"{key!r} was released before its lease could move: no hold spans the move"
    # The holder's renewal process renews it (a new version) or the holder releases it (gone): through ASK.
    reports.wait_until(lambda: lease_version(server, target, lease) != version,
                       f"the holder of {key!r} to reach its lease on the importing node")
    touched = "renewed" if lease_version(server, target, lease) is not None else "released"
    server.finish_migration(slot)
    finished = time.monotonic()
    assert server.admin(source).execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
    carried = int(server.admin(target).get(fence))  # the fencing counter moved with the slot
    return key, holder, began, finished, touched, carried


def test_slots_migrated_one_by_one_under_held_leases_give_no_key_two_holders(
    children: Children, make_redis_cluster: Callable[..., RedisClusterServer]
) -> None:
    """For each key's slot in turn, while a worker holds the key: ``SETSLOT IMPORTING``/``MIGRATING``; the
    lease alone moves to the target (its fence stays behind, so a script on both keys gets ``TRYAGAIN``
    and an acquisition waits); the holder's renewal or release reaches it through ``ASK``; then the rest
    moves and the slot is handed over (``MOVED`` from then on), and the key is acquired again on its new
    node, its fencing counter carried along. Meanwhile the other keys are held and contended as usual."""
    workers = [children.start(mp_workers.hold_keys, TABLE, MIGRATION_LEASE_S, MIGRATION_HOLD_S)
               for _ in range(MIGRATION_WORKERS)]
    server = make_redis_cluster()  # while the workers' interpreters start
    keys = one_key_per_node(server)
    for worker in workers:
        tell(worker, (server.url, keys))
    for worker in workers:
        _, _, renewal_pid = receive(worker, "ready")
        assert renewal_pid is not None, "a worker's leases are not renewed by a renewal process"
    for worker in workers:
        worker.ctl.send("start")
    reports = Reports(workers)
    migrations = [move_slot_under_its_holder(server, reports, key) for key in keys]
    reports.wait_until(lambda: all(any(k == key and token > carried for k, _, token in reports.held)
                                   for key, *_, carried in migrations),
                       "an acquisition of each key on its new node, its token above the counter it carried")
    for worker in workers:
        worker.ctl.send("stop")
    reports.wait_until(lambda: len(reports.done) == len(workers), "the workers' final reports", REPORT_S)
    for worker in workers:
        worker.proc.join(timeout=JOIN_S)
        assert worker.proc.exitcode == 0

    holds = [hold for worker_holds, _ in reports.done.values() for hold in worker_holds]
    assert [not_acquired for _, not_acquired in reports.done.values()] == [0] * len(workers)
    losses = []
    for key in keys:
        mine = sorted((hold for hold in holds if hold[0] == key), key=lambda hold: hold[1])
        overlaps = [(a, b) for a, b in zip(mine, mine[1:]) if b[1] <= a[2]]
        assert not overlaps, f"{key!r}: {len(overlaps)} overlapping holds, e.g. {overlaps[:2]}"
        tokens = [hold[4] for hold in mine]
        # One fence step per acquisition, in order, across the move: no hidden or repeated acquisition.
        assert tokens == list(range(1, len(mine) + 1)), f"{key!r}: fencing tokens {tokens}"
        assert int(server.admin(server.node_for_slot(key_slot(key))).get(ClusterLayout.fence(TABLE, key))) \
            == len(mine)
        for _, _, _, owner, _, exit_cause, lost_causes in mine:
            # No silent loss: a hold ends released as held (no on_lost), or lost, reported with its cause.
            if exit_cause is None:
                assert lost_causes == [], f"{key!r}: on_lost {lost_causes} for a hold that ended released"
            else:
                assert exit_cause in LOST_CAUSES and len(lost_causes) == 1 and lost_causes[0] in LOST_CAUSES, \
                    (key, owner, exit_cause, lost_causes)
                losses.append((key, exit_cause))
    for key, holder, began, _, touched, _ in migrations:
        (spanning,) = [hold for hold in holds if hold[3] == holder]
        assert spanning[1] < began, f"{key!r}: the hold that the move began under started after it"
        # A move of a few milliseconds, well inside the lease's validity, costs the holder nothing.
        assert spanning[5] is None, f"{key!r}: the hold its slot moved under ended lost ({spanning[5]}, {touched})"
    print(f"{len(holds)} holds, migrations {[(m[0], m[4], round(m[3] - m[2], 3)) for m in migrations]}, "
          f"losses {losses}")
