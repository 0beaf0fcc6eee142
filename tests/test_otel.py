"""``fastlease.otel``: the spans and metrics of instrumented clients, read back from the OpenTelemetry SDK's
in-memory exporters, on both engines and on the memory and SQLite stores; and nothing of OpenTelemetry
for a client that is not instrumented.

Timings are on a ``FakeClock`` where a test compares them: the observer reads the client's clock, so a
hold of ``clock.advance(2)`` is exactly 2 s long.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterator

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from fastlease import DistributedLock, MemoryClient, SQLiteClient, SyncDistributedLock
from fastlease.client import LeaseClient
from fastlease.exceptions import LockLost, LockNotAcquired, LockReleaseError, MalformedLockRow
from fastlease.idempotency import IdempotencyInProgress, IdempotencyKeyMismatch, IdempotentCall, IdempotentCallFailed
from fastlease.otel import instrument, uninstrument
from fastlease.stores.base import LockRow
from fastlease.testing import FakeClock, FaultInjector
from helpers.waiting import wait_until

_PAUSE = threading.Event()  # never set: waited on for the bounded polls below


class Recorded:
    """An SDK tracer provider and meter provider whose spans and metric points stay in memory."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def instrument(self, client: LeaseClient) -> None:
        instrument(client, tracer_provider=self.tracer_provider, meter_provider=self.meter_provider)

    def spans(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.exporter.get_finished_spans() if span.name == name]

    def points(self, name: str) -> list[tuple[dict[str, Any], Any]]:
        """The metric's points as (attributes, value): a counter's total, a histogram's (count, sum)."""
        found = []
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data is not None else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name != name:
                        continue
                    for point in metric.data.data_points:
                        value = (point.count, point.sum) if hasattr(point, "count") else point.value
                        found.append((dict(point.attributes), value))
        return found

    def close(self) -> None:
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


@pytest.fixture
def recorded() -> Iterator[Recorded]:
    telemetry = Recorded()
    yield telemetry
    telemetry.close()


@pytest.fixture(params=["memory", "sqlite"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def new_client(core: ModuleType, store_kind: str, tmp_path: Path) -> Iterator[Callable[..., LeaseClient]]:
    """Clients of the test's store kind on the engine under test (SQLite: one file), closed after."""
    clients: list[LeaseClient] = []

    def build(**options: Any) -> LeaseClient:
        client: LeaseClient
        if store_kind == "memory":
            client = MemoryClient(_engine_module=core, **options)
        else:
            client = SQLiteClient(tmp_path / "locks.db", _engine_module=core, **options)
        clients.append(client)
        return client

    yield build
    for client in clients:
        client.close()


def _attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def test_an_acquisition_and_its_hold_make_two_spans_and_their_points(new_client, store_kind, recorded):
    clock = FakeClock()
    client = new_client(clock=clock)
    recorded.instrument(client)
    tracer = recorded.tracer_provider.get_tracer("app")

    with tracer.start_as_current_span("request") as request:
        with SyncDistributedLock(client, table="locks", key="job:1", lease_duration=3) as lease:
            clock.advance(2)  # renewals at 1 s and 2 s

    common = {"fastlease.table": "locks", "fastlease.key": "job:1", "fastlease.store": store_kind}
    [acquire] = recorded.spans("fastlease.acquire")
    [hold] = recorded.spans("fastlease.hold")
    assert _attributes(acquire) == {**common, "fastlease.outcome": "acquired"}
    assert _attributes(hold) == {**common, "fastlease.outcome": "released"}
    request_id = request.get_span_context().span_id
    assert acquire.parent is not None and acquire.parent.span_id == request_id
    assert hold.parent is not None and hold.parent.span_id == request_id
    assert hold.end_time - hold.start_time == 2_000_000_000  # the client's (virtual) clock
    assert hold.status.status_code == StatusCode.UNSET

    labels = {"fastlease.table": "locks", "fastlease.store": store_kind}
    assert recorded.points("fastlease.lock.wait.duration") == [({**labels, "fastlease.outcome": "acquired"}, (1, 0))]
    assert recorded.points("fastlease.lock.hold.duration") == [({**labels, "fastlease.outcome": "released"}, (1, 2.0))]
    assert lease.metrics.renewals == 2
    assert recorded.points("fastlease.lock.renewals") == [(labels, 2)]
    assert recorded.points("fastlease.lock.losses") == []


def test_a_contended_acquisition_that_fails_is_not_acquired(new_client, store_kind, recorded):
    clock = FakeClock()
    client = new_client(clock=clock)
    recorded.instrument(client)

    with SyncDistributedLock(client, table="locks", key="busy", lease_duration=3):
        with pytest.raises(LockNotAcquired):
            with SyncDistributedLock(client, table="locks", key="busy", wait_timeout=0.5):
                pass  # pragma: no cover - never entered

    failed = [span for span in recorded.spans("fastlease.acquire")
              if _attributes(span)["fastlease.outcome"] == "not_acquired"]
    assert len(failed) == 1 and failed[0].status.status_code == StatusCode.ERROR
    assert failed[0].end_time - failed[0].start_time >= 500_000_000  # the whole budget, waited
    assert len(recorded.spans("fastlease.hold")) == 1  # the holder's only
    waits = {attributes["fastlease.outcome"]: value
             for attributes, value in recorded.points("fastlease.lock.wait.duration")}
    assert waits["acquired"] == (1, 0) and waits["not_acquired"][0] == 1 and waits["not_acquired"][1] >= 0.5


def test_an_acquisition_that_raises_has_outcome_error(core, recorded):
    client = MemoryClient(_engine_module=core, clock=FakeClock())
    recorded.instrument(client)
    client.store.plant("locks", "odd", LockRow(owner="o", version="v", lease_ms=1000, protocol=2))  # not v1

    with pytest.raises(MalformedLockRow):
        SyncDistributedLock(client, table="locks", key="odd").acquire()
    client.close()

    [acquire] = recorded.spans("fastlease.acquire")
    assert _attributes(acquire)["fastlease.outcome"] == "error"
    assert _attributes(acquire)["error.type"] == "fastlease.exceptions.MalformedLockRow"
    assert acquire.status.status_code == StatusCode.ERROR
    assert [attributes["fastlease.outcome"] for attributes, _ in recorded.points("fastlease.lock.wait.duration")] \
        == ["error"]
    assert recorded.spans("fastlease.hold") == []


def _lose_by_failed_renewals(client: Any, clock: FakeClock) -> None:
    faults = client.store.faults = FaultInjector(clock)
    faults.add("update_version_if", "unavailable", times=-1)  # every renewal fails
    clock.advance(3)  # validity ends 2.7 s after the acquisition


def _lose_to_another_owner(client: Any, clock: FakeClock) -> None:
    client.store.plant("locks", "lost", LockRow(owner="someone-else", version="v2", lease_ms=3000, protocol=1))
    clock.advance(1)  # the renewal is refused


def _lose_at_max_hold(client: Any, clock: FakeClock) -> None:
    clock.advance(3)  # renewals stop at max_hold (1 s); validity ends at 2.7 s


# The first two use the memory store's own tools (FaultInjector, plant); max_hold works on every store.
@pytest.mark.parametrize(("store_kind", "lose", "max_hold", "cause"), [
    ("memory", _lose_by_failed_renewals, None, "unreachable"),
    ("memory", _lose_to_another_owner, None, "stolen"),
    ("memory", _lose_at_max_hold, 1, "cancelled"),
    ("sqlite", _lose_at_max_hold, 1, "cancelled"),
], ids=["memory-unreachable", "memory-stolen", "memory-cancelled", "sqlite-cancelled"])
def test_a_lost_lease_records_its_cause(new_client, store_kind, recorded, lose, max_hold, cause):
    clock = FakeClock()
    client = new_client(clock=clock)
    recorded.instrument(client)

    with pytest.raises(LockLost) as raised:
        with SyncDistributedLock(client, table="locks", key="lost", lease_duration=3, max_hold=max_hold) as lease:
            lose(client, clock)
            assert lease.lost_cause == cause
    assert raised.value.cause == cause

    labels = {"fastlease.table": "locks", "fastlease.store": store_kind}
    assert recorded.points("fastlease.lock.losses") == [({**labels, "fastlease.lost_cause": cause}, 1)]
    [hold] = recorded.spans("fastlease.hold")
    assert _attributes(hold)["fastlease.outcome"] == "lost"
    assert _attributes(hold)["fastlease.lost_cause"] == cause
    assert hold.status.status_code == StatusCode.ERROR
    assert [(event.name, dict(event.attributes or {})) for event in hold.events] \
        == [("fastlease.lost", {"fastlease.lost_cause": cause})]
    assert recorded.points("fastlease.lock.hold.duration")[0][0] == {**labels, "fastlease.outcome": "lost"}


def test_a_release_that_stays_unconfirmed_ends_the_hold_with_outcome_error(core, recorded):
    clock = FakeClock()
    client = MemoryClient(_engine_module=core, clock=clock)
    recorded.instrument(client)
    client.store.faults = faults = FaultInjector(clock)
    faults.add("delete_if_owner", "timeout", times=-1)  # the release's outcome stays unknown

    with pytest.raises(LockReleaseError):
        with SyncDistributedLock(client, table="locks", key="stuck", lease_duration=3):
            pass
    faults.clear()
    client.close()

    [hold] = recorded.spans("fastlease.hold")
    assert _attributes(hold)["fastlease.outcome"] == "error"
    assert _attributes(hold)["error.type"] == "fastlease.exceptions.LockReleaseError"
    assert [attributes["fastlease.outcome"] for attributes, _ in recorded.points("fastlease.lock.hold.duration")] \
        == ["error"]


@pytest.mark.posix
def test_renewals_the_renewal_process_reports_are_counted(core, tmp_path, recorded):
    """A lease of 1 s on SQLite is renewed by the client's renewal process; its reports, applied by the
    holder (``Lease.apply_renewal``), are counted as the in-process renewals are."""
    client = SQLiteClient(tmp_path / "locks.db", _engine_module=core)
    recorded.instrument(client)
    link = client.engine.link
    assert link is not None, "SQLite leases of 1 s or more are renewed by a renewal process"
    pid = None
    try:
        with SyncDistributedLock(client, table="locks", key="long", lease_duration=1) as lease:
            wait_until(lambda: lease.metrics.renewals >= 2, 20, "two renewals (every 333 ms)", interval=0.05)
            pid = link.pid
            assert pid is not None, "the renewal process did not start"
        renewals = lease.metrics.renewals
    finally:
        client.close()
        _wait_gone(pid)
    assert renewals >= 2
    assert recorded.points("fastlease.lock.renewals") \
        == [({"fastlease.table": "locks", "fastlease.store": "sqlite"}, renewals)]


def _wait_gone(pid: Any) -> None:
    """The renewal process exits once its client is closed; stop it by its PID if it has not (bounded)."""
    if pid is None:
        return
    for _ in range(200):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        _PAUSE.wait(0.05)
    os.kill(pid, 9)


def test_idempotency_hits_misses_and_conflicts_are_counted(new_client, store_kind, recorded):
    client = new_client(clock=FakeClock())
    recorded.instrument(client)

    def call(key: str, payload: Any = "body", **options: Any) -> IdempotentCall:
        return IdempotentCall(client, table="payments", key=key, payload=payload, **options)

    with call("a") as first:  # miss: it runs
        first.complete("receipt")
    with call("a") as again:  # hit: replayed
        assert again.replayed and again.result == "receipt"
    with pytest.raises(IdempotencyKeyMismatch):  # conflict: the key came with another payload
        with call("a", payload="other"):
            pass  # pragma: no cover - never entered
    with call("b") as running:  # miss
        with pytest.raises(IdempotencyInProgress):  # conflict: in flight
            with call("b"):
                pass  # pragma: no cover - never entered
        running.complete(1)
    with pytest.raises(ValueError):
        with call("c", retry_on=()):  # miss; its failure is stored
            raise ValueError("declined")
    with pytest.raises(IdempotentCallFailed):  # hit: the stored failure is replayed
        with call("c", retry_on=()):
            pass  # pragma: no cover - never entered

    labels = {"fastlease.table": "payments", "fastlease.store": store_kind}
    assert recorded.points("fastlease.idempotency.misses") == [(labels, 3)]
    assert recorded.points("fastlease.idempotency.hits") == [(labels, 2)]
    conflicts = recorded.points("fastlease.idempotency.conflicts")
    assert sorted((attributes["fastlease.idempotency.conflict"], value) for attributes, value in conflicts) \
        == [("in_flight", 1), ("mismatch", 1)]
    # Each run held the call's lease until its record's write released it (the store's finish_if_owner).
    assert [(_attributes(span)["fastlease.table"], _attributes(span)["fastlease.outcome"])
            for span in recorded.spans("fastlease.hold")] == [("payments_locks", "released")] * 3


def test_async_spans_belong_to_the_tasks_current_span(core, recorded):
    client = MemoryClient(_engine_module=core)
    recorded.instrument(client)
    tracer = recorded.tracer_provider.get_tracer("app")

    async def handler() -> int:
        with tracer.start_as_current_span("request") as request:
            async with DistributedLock(client, table="locks", key="async"):
                pass
            return int(request.get_span_context().span_id)

    request_id = asyncio.run(handler())
    client.close()
    spans = recorded.spans("fastlease.acquire") + recorded.spans("fastlease.hold")
    assert len(spans) == 2
    assert [span.parent.span_id if span.parent else None for span in spans] == [request_id, request_id]


def test_an_elections_terms_are_spans_and_its_leaders_sum_to_one_then_zero(new_client, store_kind, recorded):
    from fastlease.election import Election

    client = new_client()
    recorded.instrument(client)
    election = Election(client, table="leaders", key="scheduler", identity="node-1", lease_duration=5)
    with election.campaign() as first:
        assert recorded.points("fastlease.election.leaders") == [({"fastlease.table": "leaders",
                                                                    "fastlease.store": store_kind}, 1)]
    with pytest.raises(LockNotAcquired):
        with Election(client, table="leaders", key="scheduler", identity="node-2").campaign():
            Election(client, table="leaders", key="scheduler").campaign(wait_timeout=0)
    lost = Election(client, table="leaders", key="lost", identity="node-1", lease_duration=5).campaign()
    client.store.remove("leaders", "lost") if store_kind == "memory" else _steal_sqlite(client, "leaders", "lost")
    with pytest.raises(LockLost):
        lost.resign()
    terms = recorded.spans("fastlease.term")
    assert [(_attributes(span)["fastlease.election.term"], _attributes(span)["fastlease.election.identity"],
             _attributes(span)["fastlease.election.end"], span.status.status_code) for span in terms] == [
        (first.number, "node-1", "resigned", StatusCode.UNSET), (first.number + 1, "node-2", "resigned",
                                                                 StatusCode.UNSET),
        (lost.number, "node-1", "stolen", StatusCode.ERROR)]
    labels = {"fastlease.table": "leaders", "fastlease.store": store_kind}
    assert recorded.points("fastlease.election.leaders") == [(labels, 0)]  # none leads now
    assert recorded.points("fastlease.election.terms") == [(labels, 3)]
    campaigns = dict((point[0]["fastlease.outcome"], point[1][0]) for point in
                     recorded.points("fastlease.election.campaign.duration"))
    assert campaigns == {"elected": 3, "not_elected": 1}


def _steal_sqlite(client, table, key):
    """Take the row from under its holder, as another owner's takeover would."""
    import sqlite3

    with sqlite3.connect(client.store.path) as connection:
        connection.execute(f'UPDATE "fastlease_lock_{table}" SET owner = ?, version = ? WHERE key = ?',
                           ("thief", "v", key))


def test_uninstrument_stops_reporting_the_leases_made_after_it(core, recorded):
    client = MemoryClient(_engine_module=core)
    recorded.instrument(client)
    held = SyncDistributedLock(client, table="locks", key="before").acquire()
    uninstrument(client)
    with SyncDistributedLock(client, table="locks", key="after"):
        pass
    held.release()  # made while instrumented: its hold is still reported
    client.close()
    assert [_attributes(span)["fastlease.key"] for span in recorded.exporter.get_finished_spans()] \
        == ["before", "before"]


def test_instrument_takes_only_a_client():
    with pytest.raises(TypeError, match="client must be a fastlease client"):
        instrument(object())  # type: ignore[arg-type]


def _modules_after(code: str) -> list[str]:
    probe = f"import sys\n{code}\nimport json; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True, timeout=60,
                            check=True, env={**os.environ, "FASTLEASE_NO_EXTENSIONS": "0"})
    return list(json.loads(result.stdout))


def test_without_instrumentation_nothing_of_opentelemetry_is_imported():
    loaded = _modules_after(
        "import fastlease\n"
        "from fastlease.idempotency import IdempotentCall\n"
        "client = fastlease.MemoryClient()\n"
        "with fastlease.SyncDistributedLock(client, table='locks', key='k'):\n"
        "    pass\n"
        "with IdempotentCall(client, table='payments', key='p') as call:\n"
        "    call.complete(1)\n"
        "client.close()\n"
    )
    assert "fastlease.idempotency.calls" in loaded  # the probe did run the calls
    assert [name for name in loaded if name.startswith("opentelemetry") or name == "fastlease.otel"] == []


def test_without_the_extra_the_import_error_names_it():
    probe = ("import sys\nsys.modules['opentelemetry'] = None  # as if it were not installed\n"
             "try:\n    import fastlease.otel\nexcept ImportError as error:\n    print(error)\n")
    result = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True, timeout=60,
                            check=True)
    assert "pip install 'fastlease[otel]'" in result.stdout
