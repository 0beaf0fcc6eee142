"""Mutual exclusion between threads and between clients sharing a store (real clock, real threads)."""

from __future__ import annotations

import threading

from fastlease import MemoryClient, SyncDistributedLock
from fastlease.stores.memory import MemoryStore

THREADS = 8
ROUNDS = 150


def test_threads_on_shared_and_separate_clients_never_overlap(core):
    store = MemoryStore()
    clients = [MemoryClient(store=store, _engine_module=core) for _ in range(4)]  # 4 "processes", 2 threads each
    guard_lock = threading.Lock()
    inside = [0]
    overlaps = []
    held_counts = [0] * THREADS
    errors: list[BaseException] = []
    start = threading.Barrier(THREADS)

    def worker(index: int) -> None:
        client = clients[index % len(clients)]
        try:
            start.wait(10)
            for _ in range(ROUNDS):
                guard = SyncDistributedLock(client, table="locks", key="shared", lease_duration=5, wait_timeout=60)
                with guard as lease:
                    with guard_lock:
                        inside[0] += 1
                        if inside[0] != 1:
                            overlaps.append(inside[0])
                    lease.raise_if_lost()
                    held_counts[index] += 1
                    with guard_lock:
                        inside[0] -= 1
        except BaseException as error:  # surfaced below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    try:
        assert not any(thread.is_alive() for thread in threads)
        assert errors == []
        assert overlaps == []
        assert held_counts == [ROUNDS] * THREADS
        assert store.rows("locks") == {}
        assert [len(client.engine.signals) for client in clients] == [0] * len(clients)
    finally:
        for client in clients:
            client.close()


def test_different_keys_do_not_contend(core):
    client = MemoryClient(_engine_module=core)
    try:
        with SyncDistributedLock(client, table="locks", key="a", wait_timeout=0):
            with SyncDistributedLock(client, table="locks", key="b", wait_timeout=0):
                with SyncDistributedLock(client, table="other", key="a", wait_timeout=0):
                    assert len(client.store.rows("locks")) == 2
    finally:
        client.close()
