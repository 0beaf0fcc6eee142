"""OpenTelemetry traces and metrics for one client's leases and idempotent calls.

``fastlease.otel.instrument(client)`` turns it on for that client (opt-in per client: nothing is
instrumented by importing anything, and other clients stay as they were); ``uninstrument(client)``
turns it off. It needs the ``otel`` extra, the OpenTelemetry API: ``pip install 'fastlease[otel]'``.
Spans and metrics go to the global providers unless others are given; without an SDK configured they
are OpenTelemetry's no-ops.

Per election term (``fastlease.election``): a span ``fastlease.term`` from the election to the end of
the term (its number, the candidate's identity, and how it ended), and the metrics
``fastlease.election.leaders`` (+1 while this process leads: summed over the fleet, 0 is time without a
leader and more than 1 must never be seen), ``fastlease.election.terms`` and
``fastlease.election.campaign.duration``.

Per lease: a span ``fastlease.acquire`` over the wait (outcome ``acquired``, ``not_acquired`` or
``error``) and, once acquired, a span ``fastlease.hold`` that ends at the release (outcome
``released``, ``lost`` or ``error``; a loss adds an event and ``fastlease.lost_cause``). Both are
children of the span current where the acquisition started. The metrics, their units and attributes
are listed in docs/operations.md ("OpenTelemetry"). Every timing is read from the client's clock, so a
``FakeClock`` client reports virtual time.
"""

from __future__ import annotations

try:
    from opentelemetry import metrics, trace
    from opentelemetry.trace import Status, StatusCode
except ImportError as missing:  # the extra is not installed
    raise ImportError(
        "fastlease.otel needs the OpenTelemetry API: pip install 'fastlease[otel]'"
    ) from missing

from ._version import __version__
from .exceptions import LockLost, LockNotAcquired
from .lock import check_client

TYPE_CHECKING = False  # typing is not imported at run time: see _typing.py
if TYPE_CHECKING:
    from typing import Optional

    from ._engine import HeldLease
    from .client import LeaseClient

__all__ = ["LeaseTelemetry", "instrument", "uninstrument"]

#: The instrumentation scope of the tracer and the meter (with fastlease's version).
SCOPE = "fastlease"
#: Bucket boundaries (seconds) of the wait and hold histograms: milliseconds up to an hour.
DURATION_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
                      900.0, 3600.0)

#: Attribute names. Spans carry the key; metrics never do (one time series per key would be unbounded).
TABLE = "fastlease.table"
KEY = "fastlease.key"
STORE = "fastlease.store"
OUTCOME = "fastlease.outcome"
LOST_CAUSE = "fastlease.lost_cause"
CONFLICT = "fastlease.idempotency.conflict"
TERM = "fastlease.election.term"
IDENTITY = "fastlease.election.identity"
TERM_END = "fastlease.election.end"  # lost causes, or "resigned"
ERROR_TYPE = "error.type"  # OpenTelemetry's own name for the class of the error that ended an operation


def instrument(client: LeaseClient, *, tracer_provider: Optional[trace.TracerProvider] = None,
               meter_provider: Optional[metrics.MeterProvider] = None) -> LeaseTelemetry:
    """Report the leases and idempotent calls of ``client`` from now on (leases made earlier are not
    reported), to the given providers or the global ones. Returns the observer, now the client's
    ``engine.observer``; instrumenting again replaces it. TypeError if ``client`` is not a client."""
    check_client(client)
    telemetry = LeaseTelemetry(client, tracer_provider, meter_provider)
    client.engine.observer = telemetry
    return telemetry


def uninstrument(client: LeaseClient) -> None:
    """Stop reporting the leases made from now on by ``client``; holds already reported end as usual."""
    check_client(client).engine.observer = None


def _error_type(error: BaseException) -> str:
    kind = type(error)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


class _Hold:
    """What the observer keeps of one hold, from its acquisition to its release."""

    __slots__ = ("span", "start_ns", "labels")

    def __init__(self, span: trace.Span, start_ns: int, labels: dict[str, str]) -> None:
        self.span = span
        self.start_ns = start_ns  # the client's monotonic clock at the acquisition
        self.labels = labels  # the metric attributes: table and store


class LeaseTelemetry:
    """The observer that ``instrument`` gives a client's engine: it turns each lease event into spans and
    metric points (see the module's docstring). Its hooks never raise, as OpenTelemetry's API never does."""

    def __init__(self, client: LeaseClient, tracer_provider: Optional[trace.TracerProvider],
                 meter_provider: Optional[metrics.MeterProvider]) -> None:
        store = type(client.store)
        #: The store's kind as the ``fastlease.store`` attribute: memory, sqlite, redis or dynamodb.
        self.store = store.__module__.rpartition(".")[2] if store.__module__.startswith("fastlease.") \
            else store.__name__
        self._clock = client.clock
        self._tracer = trace.get_tracer(SCOPE, __version__, tracer_provider)
        meter = metrics.get_meter(SCOPE, __version__, meter_provider)
        self._wait = meter.create_histogram(
            "fastlease.lock.wait.duration", unit="s", description="Time spent acquiring a lease, by outcome",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S)
        self._hold = meter.create_histogram(
            "fastlease.lock.hold.duration", unit="s", description="Time a lease was held, by release outcome",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S)
        self._renewals = meter.create_counter(
            "fastlease.lock.renewals", unit="{renewal}", description="Confirmed renewals of held leases")
        self._losses = meter.create_counter(
            "fastlease.lock.losses", unit="{lease}", description="Leases lost before their release, by cause")
        self._hits = meter.create_counter(
            "fastlease.idempotency.hits", unit="{call}", description="Idempotent calls that replayed a stored outcome")
        self._misses = meter.create_counter(
            "fastlease.idempotency.misses", unit="{call}", description="Idempotent calls that ran (first runs)")
        self._conflicts = meter.create_counter(
            "fastlease.idempotency.conflicts", unit="{call}",
            description="Idempotent calls refused: another is in flight, or the key came with another payload")
        self._leaders = meter.create_up_down_counter(
            "fastlease.election.leaders", unit="{leader}",
            description="1 while this process leads an election: over the fleet, 0 means no leader")
        self._terms = meter.create_counter(
            "fastlease.election.terms", unit="{term}", description="Terms won: each is a change of leader")
        self._campaigns = meter.create_histogram(
            "fastlease.election.campaign.duration", unit="s", description="Time from a campaign's start to its end",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S)

    def _span_attributes(self, lease: HeldLease) -> dict[str, str]:
        return {TABLE: lease.table, KEY: lease.key, STORE: self.store}

    # ---- the engine's Observer hooks ----------------------------------------------------------
    def acquired(self, lease: HeldLease, wait_ns: int) -> _Hold:
        """The acquisition span (ended now, begun ``wait_ns`` ago), the wait's point, the hold span begun."""
        now_ns = self._clock.time_ns()
        attributes = self._span_attributes(lease)
        self._tracer.start_span("fastlease.acquire", attributes={**attributes, OUTCOME: "acquired"},
                                start_time=now_ns - wait_ns).end(end_time=now_ns)
        labels = {TABLE: lease.table, STORE: self.store}
        self._wait.record(wait_ns / 1e9, {**labels, OUTCOME: "acquired"})
        span = self._tracer.start_span("fastlease.hold", attributes=attributes, start_time=now_ns)
        return _Hold(span, self._clock.monotonic_ns(), labels)

    def acquire_failed(self, lease: HeldLease, wait_ns: int, error: Optional[BaseException]) -> None:
        """The acquisition span, ``not_acquired`` (budget spent, cancelled) or ``error``, and the wait's point."""
        now_ns = self._clock.time_ns()
        attributes = self._span_attributes(lease)
        if error is None or isinstance(error, LockNotAcquired):
            attributes[OUTCOME] = "not_acquired"
            status = Status(StatusCode.ERROR, "not acquired")
        else:
            attributes[OUTCOME] = "error"
            attributes[ERROR_TYPE] = _error_type(error)
            status = Status(StatusCode.ERROR, f"{type(error).__name__}: {error}")
        span = self._tracer.start_span("fastlease.acquire", attributes=attributes, start_time=now_ns - wait_ns)
        span.set_status(status)
        span.end(end_time=now_ns)
        self._wait.record(wait_ns / 1e9, {TABLE: lease.table, STORE: self.store, OUTCOME: attributes[OUTCOME]})

    def renewed(self, lease: HeldLease, hold: _Hold, renewals: int) -> None:
        """Count ``renewals`` more confirmed renewals."""
        self._renewals.add(renewals, hold.labels)

    def lost(self, lease: HeldLease, hold: _Hold, cause: str) -> None:
        """Count the loss by cause, and mark it on the hold span (an event when it happened)."""
        self._losses.add(1, {**hold.labels, LOST_CAUSE: cause})
        hold.span.add_event("fastlease.lost", {LOST_CAUSE: cause}, timestamp=self._clock.time_ns())
        hold.span.set_attribute(LOST_CAUSE, cause)

    def released(self, lease: HeldLease, hold: _Hold, error: Optional[BaseException]) -> None:
        """End the hold span with the release's outcome, and record the hold's duration."""
        span = hold.span
        if error is None:
            outcome = "released"
        elif isinstance(error, LockLost):
            outcome = "lost"
            span.set_attribute(LOST_CAUSE, error.cause)  # the final word: a lapse found stolen at release
            span.set_status(Status(StatusCode.ERROR, f"lost: {error.cause}"))
        else:
            outcome = "error"
            span.set_attribute(ERROR_TYPE, _error_type(error))
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        span.set_attribute(OUTCOME, outcome)
        self._hold.record((self._clock.monotonic_ns() - hold.start_ns) / 1e9, {**hold.labels, OUTCOME: outcome})
        span.end(end_time=self._clock.time_ns())

    # ---- fastlease.election's hooks ------------------------------------------------------------
    def term_began(self, table: str, key: str, identity: str, term: int, campaign_s: float) -> trace.Span:
        """A campaign won: count the term, this process as a leader, and the campaign; the term's span."""
        labels = {TABLE: table, STORE: self.store}
        self._terms.add(1, labels)
        self._leaders.add(1, labels)
        self._campaigns.record(campaign_s, {**labels, OUTCOME: "elected"})
        return self._tracer.start_span("fastlease.term", start_time=self._clock.time_ns(), attributes={
            TABLE: table, KEY: key, STORE: self.store, TERM: term, IDENTITY: identity})

    def term_ended(self, table: str, span: trace.Span, end: str) -> None:
        """The term ended (``end``: resigned, or the loss's cause): no longer a leader; the span ends."""
        self._leaders.add(-1, {TABLE: table, STORE: self.store})
        span.set_attribute(TERM_END, end)
        if end != "resigned":
            span.set_status(Status(StatusCode.ERROR, f"lost: {end}"))
        span.end(end_time=self._clock.time_ns())

    def campaign_failed(self, table: str, campaign_s: float) -> None:
        """A campaign that ended without a term (its deadline, or stop())."""
        self._campaigns.record(campaign_s, {TABLE: table, STORE: self.store, OUTCOME: "not_elected"})

    def idempotent_call(self, table: str, outcome: str) -> None:
        """Count a hit, a miss or a conflict (``in_flight``, ``mismatch``) of the record table ``table``."""
        labels = {TABLE: table, STORE: self.store}
        if outcome == "hit":
            self._hits.add(1, labels)
        elif outcome == "miss":
            self._misses.add(1, labels)
        else:
            self._conflicts.add(1, {**labels, CONFLICT: outcome})
