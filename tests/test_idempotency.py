"""Idempotency keys on every store: exactly once under concurrent duplicates (threads and processes),
crash and takeover, payload mismatch, TTL expiry, the failure policy, DynamoDB transactions, and the
package's layering."""

from __future__ import annotations

import ast
import asyncio
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

import fastlease.idempotency as idempotency_package
from fastlease import LockLost, MemoryClient, SQLiteClient, SyncDistributedLock
from fastlease.idempotency import (
    AsyncIdempotentCall,
    IdempotencyInProgress,
    IdempotencyKeyMismatch,
    IdempotencyResultNotSerializable,
    IdempotencyResultTooLarge,
    IdempotentCall,
    IdempotentCallFailed,
    IdempotentCallNotCompleted,
    JSONSerializer,
    idempotent,
    payload_fingerprint,
)
from helpers import mp_workers
from helpers.processes import JOIN_S, Children, kill_and_reap, receive
from helpers.waiting import wait_until

STORES = ["memory", "sqlite", "dynamodb", "redis", "redis-cluster", "postgres"]
#: Stores reached through a server process (the moto server, redis-server, a Redis Cluster, PostgreSQL).
SERVER_KINDS = ("dynamodb", "redis", "redis-cluster", "postgres")
BOUND_S = 30.0


class Store:
    """A client on one store, fresh tables, and how other processes reach the same store."""

    def __init__(self, request: pytest.FixtureRequest, kind: str) -> None:
        self.kind = kind
        self.table = "pay_" + uuid.uuid4().hex[:12]
        self.lock_table = self.table + "_locks"
        self.clients: list[Any] = []
        self._memory = MemoryClient() if kind == "memory" else None
        self._session: Any = None  # DynamoDB: the session's boto3 session (a new one parses botocore's models)
        if kind == "memory":
            self.target = None
        elif kind == "sqlite":
            self.target = f"sqlite:{request.getfixturevalue('tmp_path') / 'idem.db'}"
        elif kind == "redis":
            request.getfixturevalue("redis_db")
            self.target = request.getfixturevalue("redis_url")
        elif kind == "redis-cluster":
            request.getfixturevalue("redis_cluster_db")
            self.target = request.getfixturevalue("redis_cluster_url")
        else:
            if kind == "postgres":  # the session server's emptied schema
                self.target = request.getfixturevalue("postgres_db")
            else:
                self.target = request.getfixturevalue("moto_endpoint")
                self._session = request.getfixturevalue("moto_session")
            client = self.client()
            client.create_idempotency_table(self.table)
            client.create_lock_table(self.lock_table)

    def client(self) -> Any:
        """A client of this test's store in this process (other processes use ``mp_workers.fastlease_client``)."""
        if self._memory is not None:
            client = self._memory
        elif self._session is not None:
            from fastlease.dynamodb import DynamoDBClient

            client = DynamoDBClient(session=self._session, endpoint_url=self.target)
        else:
            client = mp_workers.fastlease_client(self.target)
        self.clients.append(client)
        return client

    def close(self) -> None:
        for client in self.clients:
            client.close()


def opened(request: pytest.FixtureRequest) -> Iterator[Store]:
    store = Store(request, request.param)
    try:
        yield store
    finally:
        store.close()


def store_params(kinds: list[str]) -> list[object]:
    """The cases of SERVER_KINDS are marked ``server``: the wheel tests deselect them."""
    return [pytest.param(kind, marks=pytest.mark.server) if kind in SERVER_KINDS else kind for kind in kinds]


store = pytest.fixture(params=store_params(STORES), name="store")(opened)
#: A store that other processes reach too.
shared_store = pytest.fixture(params=store_params([kind for kind in STORES if kind != "memory"]),
                              name="shared_store")(opened)


def run_threads(count: int, target: Any) -> list[Any]:
    results: list[Any] = [None] * count
    barrier = threading.Barrier(count)

    def work(index: int) -> None:
        barrier.wait(BOUND_S)
        try:
            results[index] = target()
        except BaseException as error:  # noqa: BLE001 - returned to the test
            results[index] = error

    threads = [threading.Thread(target=work, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(BOUND_S * 2)
    assert not any(thread.is_alive() for thread in threads)
    return results


# ---- exactly once -----------------------------------------------------------------------------------
def test_eight_concurrent_duplicates_run_once_and_all_get_the_result(store):
    client = store.client()
    executions = []

    @idempotent(client, table=store.table, key="payment:{idempotency_key}", wait=BOUND_S)
    def charge(idempotency_key: str, amount: int) -> dict:
        executions.append(amount)
        time.sleep(0.05)  # the handler's work, long enough that the duplicates find it in flight
        return {"charged": amount, "receipt": uuid.uuid4().hex}

    results = run_threads(8, lambda: charge("k-1", 100))
    assert len(executions) == 1
    assert all(result == results[0] for result in results), results
    assert charge("k-1", 100) == results[0]  # and later duplicates replay it
    assert len(executions) == 1


def test_a_duplicate_in_flight_is_told_to_retry_later(store):
    client = store.client()
    started, finish = threading.Event(), threading.Event()

    @idempotent(client, table=store.table, key="job:{job_id}")
    def job(job_id: str) -> str:
        started.set()
        finish.wait(BOUND_S)
        return "done"

    first = threading.Thread(target=job, args=("j",))
    first.start()
    try:
        assert started.wait(BOUND_S)
        with pytest.raises(IdempotencyInProgress) as info:
            job("j")
        assert info.value.retry_after > 0 and info.value.key == "job:j"
    finally:
        finish.set()
        first.join(BOUND_S)
    assert job("j") == "done"


def test_eight_processes_with_one_key_charge_once(shared_store, children: Children):
    store = shared_store
    workers = [children.start(mp_workers.idempotent_once, store.target, store.table, "payment:p1", 0.2, 5.0)
               for _ in range(8)]
    for worker in workers:
        receive(worker, "ready")
    for worker in workers:
        worker.ctl.send("go")
    outcomes, running = [], 0
    for worker in workers:
        for _ in range(2):  # each worker reports "running" (only if it executes), then "done"
            assert worker.out.poll(BOUND_S * 2), f"worker {worker.proc.pid} is silent"
            report = worker.out.recv()
            assert report[0] in ("running", "done"), report
            if report[0] == "done":
                break
            running += 1
        outcomes.append(report[2])
    assert running == 1
    executed = [result for ran, result in outcomes if ran]
    assert len(executed) == 1
    assert all(result == executed[0] for _, result in outcomes)


def test_a_handler_killed_mid_call_is_taken_over_after_one_lease_and_completes_once(shared_store, children):
    store = shared_store
    child = children.start(mp_workers.idempotent_once, store.target, store.table, "payment:crash", 60.0, 1.0)
    receive(child, "ready")
    child.ctl.send("go")
    receive(child, "running")
    killed_at = time.monotonic()
    kill_and_reap(child)
    client = store.client()
    executions = []
    with IdempotentCall(client, table=store.table, key="payment:crash", payload={"amount": 10},
                        lease_duration=1.0, wait=BOUND_S) as call:
        assert not call.replayed
        waited = time.monotonic() - killed_at
        executions.append(1)
        call.complete({"charged_by": "survivor"})
    # Not before one lease (1 s) after the dead holder's last write, which came at most 90% of a lease
    # before the kill while it still held (on Redis the key expires then). Measured from the kill, not
    # from the survivor's start: a loaded machine may spend much of that lease killing and reaping.
    assert 0.1 <= waited < 10, waited
    with IdempotentCall(client, table=store.table, key="payment:crash", payload={"amount": 10}) as again:
        assert again.replayed and again.result == {"charged_by": "survivor"}
    assert executions == [1]
    child.proc.join(JOIN_S)


# ---- payload, TTL, failures ----------------------------------------------------------------------------
def test_reusing_a_key_with_another_payload_is_refused(store):
    client = store.client()

    @idempotent(client, table=store.table, key="payment:{key}", payload=("amount",))
    def charge(key: str, amount: int, note: str = "") -> int:
        return amount

    assert charge("k", 10, note="a") == 10
    assert charge("k", 10, note="b") == 10  # note is not part of the payload
    with pytest.raises(IdempotencyKeyMismatch, match="different payload"):
        charge("k", 11)


def test_a_completed_record_expires_after_its_ttl(store):
    client = store.client()
    executions = []

    # 1 s, not less: on a loaded machine the replay right after the first call must still find the record.
    @idempotent(client, table=store.table, key="t:{key}", ttl=1.0)
    def work(key: str) -> int:
        executions.append(key)
        return len(executions)

    assert work("a") == 1 and work("a") == 1
    # The record expires 1 s after it was written: then the call runs again.
    wait_until(lambda: work("a") != 1, BOUND_S, "the record to expire", interval=0.05)
    assert executions == ["a", "a"]


def test_the_failure_policy_retries_or_replays(store):
    client = store.client()
    attempts = []

    @idempotent(client, table=store.table, key="f:{key}", retry_on=(ConnectionError,))
    def flaky(key: str, error: str) -> str:
        attempts.append(error)
        if error == "transient":
            raise ConnectionError("network down")
        if error == "terminal":
            raise ValueError("card declined")
        return "ok"

    with pytest.raises(ConnectionError):
        flaky("a", "transient")  # released, nothing stored: the key runs again
    with pytest.raises(ConnectionError):
        flaky("a", "transient")
    assert attempts == ["transient", "transient"]
    attempts.clear()
    with pytest.raises(ValueError, match="card declined"):
        flaky("b", "terminal")
    with pytest.raises(IdempotentCallFailed) as info:
        flaky("b", "terminal")  # stored as terminal and replayed, not run again
    assert info.value.error_type == "builtins.ValueError" and info.value.error_message == "card declined"
    assert attempts == ["terminal"]


def test_by_default_every_exception_releases_the_key(store):
    client = store.client()
    runs = []

    @idempotent(client, table=store.table, key="d:{key}")
    def work(key: str) -> str:
        runs.append(key)
        if len(runs) == 1:
            raise RuntimeError("first attempt fails")
        return "second"

    with pytest.raises(RuntimeError):
        work("x")
    assert work("x") == "second" and work("x") == "second"
    assert runs == ["x", "x"]


def test_async_functions_are_idempotent_too(store):
    client = store.client()
    runs = []

    @idempotent(client, table=store.table, key="a:{key}", wait=BOUND_S)
    async def work(key: str) -> list:
        runs.append(key)
        await asyncio.sleep(0.02)
        return [key, len(runs)]

    async def main() -> list:
        return list(await asyncio.gather(*(work("k") for _ in range(8))))

    results = asyncio.run(main())
    assert runs == ["k"] and all(result == ["k", 1] for result in results)


def test_an_unserialisable_result_is_stored_as_a_failure_so_the_handler_runs_once(store):
    # The handler has run (a card charged, a mail sent) before its result turns out unstorable: storing
    # nothing would let every duplicate run it again, so the failure is what is stored and replayed.
    import datetime

    client = store.client()
    runs = []

    @idempotent(client, table=store.table, key="report:{key}")
    def report(key: str) -> dict:
        runs.append(key)
        return {"at": datetime.datetime(2026, 1, 1)}  # not JSON data

    with pytest.raises(IdempotencyResultNotSerializable, match="a dict: the result is not JSON-serialisable") \
            as first:
        report("r-1")
    with pytest.raises(IdempotencyResultNotSerializable, match="failed before: JSONSerializer cannot") as again:
        report("r-1")
    assert runs == ["r-1"]
    assert first.value.result_type == again.value.result_type == "dict"
    assert isinstance(again.value, IdempotentCallFailed) and isinstance(again.value, TypeError)
    assert again.value.error_type == "fastlease.idempotency.exceptions.IdempotencyResultNotSerializable"
    assert again.value.error_message == str(first.value) and again.value.key == "report:r-1"

    with IdempotentCall(client, table=store.table, key="direct") as call:
        runs.append("direct")
        with pytest.raises(IdempotencyResultNotSerializable, match=r"'direct', a datetime\.date:"):
            call.complete(datetime.date(2026, 1, 1))
    assert call.state == "FAILED"
    with pytest.raises(IdempotencyResultNotSerializable) as replayed:
        with IdempotentCall(client, table=store.table, key="direct"):
            runs.append("direct again")  # never reached: the stored failure is raised on entry
    assert replayed.value.result_type == "datetime.date" and runs == ["r-1", "direct"]


def test_leaving_a_block_without_complete_stores_nothing_and_releases_the_key(store):
    client = store.client()
    with pytest.raises(IdempotentCallNotCompleted, match=r"'forgot' ended without complete\(result\)"):
        with IdempotentCall(client, table=store.table, key="forgot") as call:
            assert not call.replayed  # ... and the block ends without call.complete(...)
    assert call.state == "RELEASED"
    assert client.store.read_record(store.table, "forgot", 5.0) is None
    with IdempotentCall(client, table=store.table, key="forgot") as again:  # wait=0: the key must be free
        assert not again.replayed
        again.complete("done")
    with IdempotentCall(client, table=store.table, key="forgot") as third:
        assert third.replayed and third.result == "done"


def test_an_async_block_without_complete_raises_too_and_the_decorator_still_stores_none(core):
    client = MemoryClient(_engine_module=core)
    runs = []

    @idempotent(client, table="events", key="notify:{key}")
    async def notify(key: str) -> None:
        runs.append(key)  # returns None: completed automatically, and replayed as None

    async def main() -> None:
        with pytest.raises(IdempotentCallNotCompleted):
            async with AsyncIdempotentCall(client, table="events", key="k"):
                pass
        async with AsyncIdempotentCall(client, table="events", key="k") as again:
            assert not again.replayed
            await again.complete({"sent": True})
        async with AsyncIdempotentCall(client, table="events", key="k") as third:
            assert third.replayed and third.result == {"sent": True}
        with pytest.raises(IdempotencyResultNotSerializable, match="a set"):
            async with AsyncIdempotentCall(client, table="events", key="s") as unstorable:
                await unstorable.complete({1, 2})
        assert await notify("n") is None and await notify("n") is None

    try:
        asyncio.run(main())
    finally:
        client.close()
    assert runs == ["n"]


# ---- store specifics ------------------------------------------------------------------------------------
@pytest.mark.server
def test_a_result_too_large_for_dynamodb_is_refused_and_the_key_released(request):
    opened = Store(request, "dynamodb")
    try:
        client = opened.client()
        with pytest.raises(IdempotencyResultTooLarge, match="records hold at most"):
            with IdempotentCall(client, table=opened.table, key="big") as call:
                call.complete("x" * 300_000)
        with IdempotentCall(client, table=opened.table, key="big") as again:
            assert not again.replayed  # nothing was stored, and the lease was released
            again.complete("small")
    finally:
        opened.close()


@pytest.mark.server
def test_on_dynamodb_the_completion_commits_with_the_callers_transaction(request):
    from fastlease.dynamodb import SyncTransaction

    opened = Store(request, "dynamodb")
    try:
        client = opened.client()
        client.sync_create_table(opened.table + "_orders", partition_key=("id", "S"))
        with IdempotentCall(client, table=opened.table, key="order:1") as call:
            with SyncTransaction(client) as tx:
                call.check_in(tx)
                tx.put(opened.table + "_orders", {"id": "1", "total": 42})
                call.complete_in(tx, {"order": "1"})
        assert client.sync_get_item(opened.table + "_orders", {"id": "1"}) == {"id": "1", "total": 42}
        with IdempotentCall(client, table=opened.table, key="order:1") as again:
            assert again.replayed and again.result == {"order": "1"}
    finally:
        opened.close()


def test_a_lease_lost_before_completion_stores_nothing(core):
    from fastlease.testing import FakeClock

    clock = FakeClock()
    client = MemoryClient(clock=clock, _engine_module=core)
    call = IdempotentCall(client, table="payments", key="p", lease_duration=1.0)
    with pytest.raises(LockLost):
        with call:
            client.store.remove("payments_locks", "p")  # taken over: the row is no longer ours
            call.complete("late")
    assert client.store.read_record("payments", "p", 1.0) is None


def test_idempotent_validates_its_durations_at_decoration_under_its_own_names(core):
    client = MemoryClient(_engine_module=core)
    try:
        with pytest.raises(ValueError, match="lease_duration must be finite and between 0.1 and 86400"):
            idempotent(client, table="pay", key="k", lease_duration=-5)  # no function decorated, no call made
        with pytest.raises(ValueError, match=r"^wait must be finite and between 0 and 86400 seconds, got 100000$"):
            idempotent(client, table="pay", key="k", wait=100_000)
        with pytest.raises(ValueError, match="ttl must be finite and between"):
            idempotent(client, table="pay", key="k", ttl=400 * 86_400)  # a retention: up to a year
        idempotent(client, table="pay", key="k", ttl=300 * 86_400, wait=86_400)  # both at their limits
    finally:
        client.close()


@pytest.mark.parametrize("name", ["lease_duration", "wait", "ttl"])
def test_every_duration_refuses_a_str_with_a_type_error(core, name):
    client = MemoryClient(_engine_module=core)
    try:
        with pytest.raises(TypeError, match=f"^{name} must be a number of seconds, got str: '60'$"):
            IdempotentCall(client, table="pay", key="k", **{name: "60"})
        with pytest.raises(TypeError, match=f"^{name} must be a number of seconds, got str"):
            idempotent(client, table="pay", key="k", **{name: "60"})
    finally:
        client.close()


def test_bad_arguments_are_clear(tmp_path):
    client = SQLiteClient(tmp_path / "x.db")
    try:
        with pytest.raises(ValueError, match="must differ"):
            IdempotentCall(client, table="same", key="k", lock_table="same")
        with pytest.raises(ValueError, match="ttl must be"):
            IdempotentCall(client, table="pay", key="k", ttl=-1)
        with pytest.raises(ValueError, match="wait must be"):
            IdempotentCall(client, table="pay", key="k", wait=float("nan"))
        with pytest.raises(TypeError, match="retry_on"):
            IdempotentCall(client, table="pay", key="k", retry_on=("ValueError",))
        with pytest.raises(TypeError, match="serializer"):
            IdempotentCall(client, table="pay", key="k", serializer=object())
        with pytest.raises(TypeError, match="JSON data"):
            IdempotentCall(client, table="pay", key="k", payload={"when": object()})
        with pytest.raises(TypeError, match="payload must be"):
            idempotent(client, table="pay", key="k", payload="amount")
        with pytest.raises(TypeError, match="JSON-serialisable"):
            JSONSerializer().dumps({1, 2})
    finally:
        client.close()
    assert payload_fingerprint({"b": 1, "a": 2}) == payload_fingerprint({"a": 2, "b": 1})
    assert payload_fingerprint(b"x") != payload_fingerprint("x")


def test_the_completion_releases_the_lease_in_the_same_request(core):
    client = MemoryClient(_engine_module=core)
    store = client.store
    with IdempotentCall(client, table="payments", key="p") as call:
        assert set(store.rows("payments_locks")) == {"p"}
        call.complete("ok")
        assert store.rows("payments_locks") == {}  # gone with the record's write, no delete sent
    assert store.read_record("payments", "p", 1.0).result == b'"ok"'
    with SyncDistributedLock(client, table="payments_locks", key="p", wait_timeout=0):
        pass  # and the key is free for the next holder


def test_a_completion_whose_answer_is_lost_is_recognised_as_ours(core, monkeypatch):
    from fastlease.exceptions import StoreError

    client = MemoryClient(_engine_module=core)
    store = client.store
    finish = store.finish_if_owner

    def lost_answer(*args: Any) -> bool:
        finish(*args)  # applied, then the response is lost
        raise StoreError("timed out after sending", maybe_committed=True)

    monkeypatch.setattr(store, "finish_if_owner", lost_answer)
    with IdempotentCall(client, table="payments", key="p") as call:
        call.complete({"receipt": 1})
    assert call.state == "COMPLETED" and store.rows("payments_locks") == {}
    monkeypatch.undo()
    with IdempotentCall(client, table="payments", key="p") as again:
        assert again.replayed and again.result == {"receipt": 1}



def client_in_this_process(kind: str, request: pytest.FixtureRequest, tmp_path: Any, table: str,
                           clock: Any = None) -> Any:
    """A client of this process on ``kind`` (memory, SQLite in ``tmp_path``, the session's Redis, its
    database emptied, or the session's PostgreSQL, its schema emptied and the tables of ``table`` made),
    on ``clock`` if given."""
    if kind == "memory":
        return MemoryClient(clock=clock)
    if kind == "sqlite":
        return SQLiteClient(tmp_path / "records.db", clock=clock)
    if kind == "postgres":
        from fastlease import PostgresClient

        client = PostgresClient(request.getfixturevalue("postgres_db"), clock=clock)
        client.create_idempotency_table(table)
        client.create_lock_table(f"{table}_locks")
        return client
    from fastlease import RedisClient

    request.getfixturevalue("redis_db")
    return RedisClient(request.getfixturevalue("redis_url"), clock=clock)


@pytest.mark.parametrize("kind", store_params(["memory", "sqlite", "redis", "postgres"]))
def test_records_expire_on_the_clients_clock_not_the_machines(kind, request, tmp_path):
    # A FakeClock starts on 2026-01-01, months behind the machine's clock. A store that counted a record's
    # expiry on the machine's clock (Redis PX, SQLite's purge) would drop it at once, and the duplicate
    # below would run the handler again.
    from fastlease.testing import FakeClock

    clock = FakeClock()
    table = f"expiry_{uuid.uuid4().hex[:8]}"
    client = client_in_this_process(kind, request, tmp_path, table, clock=clock)
    runs: list[str] = []

    @idempotent(client, table=table, key="{order}", ttl=3600)
    def charge(order: str) -> int:
        runs.append(order)
        return len(runs)

    try:
        assert charge("o-1") == 1
        if kind == "redis":  # the native expiry is the whole ttl (a replay could beat a 1 ms PX, so read it)
            assert request.getfixturevalue("redis_db").pttl(f"fastlease:{table}:record:o-1") > 3_590_000
        assert charge("o-1") == 1 and runs == ["o-1"]  # replayed: the record lives for its ttl
        clock.advance(3601)
        assert charge("o-1") == 2  # expired on the client's clock, so the call runs again
    finally:
        client.close()


@pytest.mark.parametrize("kind", store_params(["memory", "sqlite", "redis", "postgres"]))
def test_a_completed_call_leaves_only_its_record(kind, request, tmp_path):
    # Idempotency keys are mostly used once: a lease row or fencing counter kept per key would grow the
    # store without bound. The completion's atomic request removes both; only the record stays (with its ttl).
    table = f"once_{uuid.uuid4().hex[:8]}"
    client = client_in_this_process(kind, request, tmp_path, table)
    try:
        for order in ("o-1", "o-2", "o-3"):
            with IdempotentCall(client, table=table, key=order) as call:
                call.complete({"order": order})
        if kind == "memory":
            store = client.store
            assert store.rows(f"{table}_locks") == {}
            assert [slot for slot in store._fences if slot[0] == f"{table}_locks"] == []
        elif kind == "sqlite":
            import sqlite3

            db = sqlite3.connect(tmp_path / "records.db")
            assert db.execute(f'SELECT count(*) FROM "fastlease_lock_{table}_locks"').fetchone() == (0,)
            assert db.execute(f'SELECT count(*) FROM "fastlease_record_{table}"').fetchone() == (3,)
            db.close()
        elif kind == "postgres":
            import psycopg

            with psycopg.connect(request.getfixturevalue("postgres_dsn")) as db:
                assert db.execute(f'SELECT count(*) FROM "{table}_locks"').fetchone() == (0,)  # fences too
                assert db.execute(f'SELECT key FROM "{table}" ORDER BY key').fetchall() == [
                    (f"o-{n}",) for n in (1, 2, 3)]
        else:
            names = sorted(name.decode() for name in request.getfixturevalue("redis_db").keys(f"fastlease:{table}*"))
            assert names == [f"fastlease:{table}:record:o-{n}" for n in (1, 2, 3)]
        with IdempotentCall(client, table=table, key="o-1") as again:
            assert again.replayed and again.result == {"order": "o-1"}
    finally:
        client.close()


# ---- the package's layout ---------------------------------------------------------------------------------
#: The modules of fastlease.idempotency by layer: each may import only modules of lower layers.
LAYERS = {"exceptions": 0, "records": 0, "serialization": 0, "calls": 1, "decorator": 2, "http": 2, "__init__": 3,
          "fastapi": 4}


def _package_imports(module: str) -> set[str]:
    """The fastlease.idempotency modules that ``module`` imports, at the top or inside a function."""
    directory = Path(idempotency_package.__file__).parent
    imported: set[str] = set()
    for node in ast.walk(ast.parse((directory / f"{module}.py").read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:  # only `from .x` reaches this package
            names = [node.module] if node.module else [alias.name for alias in node.names]
            imported |= {name.split(".")[0] if (directory / f"{name.split('.')[0]}.py").exists() else "__init__"
                         for name in names}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            absolute = [alias.name for alias in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if node.level == 0 else []
            imported |= {name.split(".")[2] if name.count(".") >= 2 else "__init__"
                         for name in absolute if name.startswith("fastlease.idempotency")}
    return imported


def test_the_package_modules_import_only_downwards():
    assert {path.stem for path in Path(idempotency_package.__file__).parent.glob("*.py")} == set(LAYERS)
    upward = {module: sorted(name for name in _package_imports(module) if LAYERS[name] >= LAYERS[module])
              for module in LAYERS}
    assert {module: names for module, names in upward.items() if names} == {}
    assert _package_imports("calls") == {"exceptions", "records", "serialization"}


def test_the_package_keeps_the_names_of_the_single_module():
    assert idempotency_package.__all__ == [
        "AsyncIdempotentCall", "IdempotencyError", "IdempotencyInProgress", "IdempotencyKeyMismatch",
        "IdempotencyResultNotSerializable", "IdempotencyResultTooLarge", "IdempotentCall", "IdempotentCallFailed",
        "IdempotentCallNotCompleted", "JSONSerializer", "Serializer", "idempotent", "payload_fingerprint",
    ]
    from fastlease.idempotency import (  # noqa: F401 - importable, though not in __all__
        COMPLETED,
        DEFAULT_TTL,
        FAILED,
        JSON,
        RETRY_AFTER_S,
        Record,
        RetryOn,
    )


def test_complete_in_outside_dynamodb_is_a_type_error_that_names_complete(tmp_path, postgres_db):
    # complete_in puts the record into a DynamoDB transaction; on a store without one it used to fail
    # with AttributeError ('Connection' object has no attribute 'put'). The call stays in progress.
    import sqlite3

    import psycopg

    from fastlease.postgres import PostgresClient

    postgres = PostgresClient(postgres_db)
    postgres.create_idempotency_table("requests")
    postgres.create_lock_table("requests_locks")
    cases = [(SQLiteClient(tmp_path / "records.db"), sqlite3.connect(tmp_path / "records.db")),
             (postgres, psycopg.connect(postgres_db)), (MemoryClient(), object())]
    for client, transaction in cases:
        with client:
            with IdempotentCall(client, table="requests", key="order:1") as call:
                with pytest.raises(TypeError, match=r"complete\(result\)") as refused:
                    call.complete_in(transaction, {"ok": True})
                assert type(client).__name__ in str(refused.value)
                call.complete({"ok": True})  # still in progress: the normal completion works
            with IdempotentCall(client, table="requests", key="order:1") as again:
                assert again.replayed and again.result == {"ok": True}
        if hasattr(transaction, "close"):
            transaction.close()
