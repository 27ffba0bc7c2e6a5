"""How one latency value is recorded, and which request span it links to as an exemplar.

A latency metric has one recorder per attribute set: a ``Latency`` (otel_llm's own bucket histogram,
handed to the SDK's readers by ``otel_llm.emit.sdk_bridge``) or an ``InstrumentLatency`` (an OpenTelemetry
histogram instrument, for a provider that shapes the metric itself); ``InstrumentBulk`` is the
inter-token latency through an instrument. Values are seconds (monotonic differences); exemplar times
are wall-clock nanoseconds of the request's end. Each recorder is guarded by the lock its owner holds
when adding (``otel_llm.emit.metrics``); ``renew_lock`` gives it a fresh one in a forked child.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, SpanContext, set_span_in_context

from otel_llm.emit.histogram import BucketHistogram, HistogramSource, SpanRef

# The SDK's variable for its exemplar filter; read for the exemplars otel_llm keeps itself when the
# provider's own filter cannot be known (no SDK provider yet).
ENV_EXEMPLAR_FILTER = "OTEL_METRICS_EXEMPLAR_FILTER"
TRACE_BASED, ALWAYS, OFF = "trace_based", "always_on", "always_off"


class ExemplarRef:
    """An exemplar link for a mix of recorders: the bucket triple and the SDK context."""

    __slots__ = ("context", "triple")

    def __init__(self, triple: SpanRef | None, context: Context) -> None:
        self.triple = triple
        self.context = context


class Latency:
    """One attribute set of a latency metric counted by otel_llm, and the source it joins when first
    used (from then on the point is exported, as for an SDK instrument)."""

    __slots__ = ("hist", "source")

    def __init__(self, source: HistogramSource, hist: BucketHistogram) -> None:
        self.source = source
        self.hist = hist

    def add(self, value: float, ref: Any) -> None:
        """One sample (seconds). Caller holds the lock."""
        hist = self.hist
        if not hist.count:
            self.source.histograms.append(hist)
        hist.record(value, ref.triple if ref.__class__ is ExemplarRef else ref)

    def renew_lock(self, lock: threading.Lock) -> None:
        self.hist._lock = lock


class InstrumentLatency:
    """One attribute set of a latency metric recorded through an OpenTelemetry histogram instrument."""

    __slots__ = ("_lock", "attributes", "instrument")

    def __init__(self, instrument: Any, attributes: dict[str, Any], lock: Any) -> None:
        self.instrument = instrument
        self.attributes = attributes
        self._lock = lock

    def add(self, value: float, ref: Any) -> None:
        context = ref.context if ref.__class__ is ExemplarRef else None
        self.instrument.record(value, self.attributes, context=context)

    def renew_lock(self, lock: threading.Lock) -> None:
        self._lock = lock


class InstrumentBulk:
    """Inter-token latency through an instrument: ``add(value, n)`` as the hot path calls it."""

    __slots__ = ("_lock", "latency")

    def __init__(self, latency: InstrumentLatency) -> None:
        self.latency = latency
        self._lock = latency._lock

    def add(self, value: float, n: int = 1) -> None:
        record, attrs = self.latency.instrument.record, self.latency.attributes
        for _ in range(n):  # the API has no bulk record: one SDK measurement per sample
            record(value, attrs)


def create_histogram(meter: Any, name: str, unit: str, buckets: tuple[float, ...], description: str) -> Any:
    """An OpenTelemetry histogram instrument with ``buckets`` as its advised boundaries."""
    try:
        return meter.create_histogram(
            name, unit=unit, description=description, explicit_bucket_boundaries_advisory=buckets
        )
    except TypeError:  # an API from before bucket advice
        return meter.create_histogram(name, unit=unit, description=description)


# --- exemplars ------------------------------------------------------------------------------------------


def env_exemplar_mode() -> str:
    """The exemplar filter ``OTEL_METRICS_EXEMPLAR_FILTER`` names (``trace_based`` when unset or unknown)."""
    value = os.environ.get(ENV_EXEMPLAR_FILTER, TRACE_BASED).strip().lower()
    return value if value in (ALWAYS, OFF) else TRACE_BASED


def bucket_ref(mode: Any, span: SpanContext, time_ns: int) -> SpanRef | None:
    """The exemplar triple (wall-clock ns, trace id, span id) of a bucket histogram sample, or None when
    the exemplar filter ``mode`` (a name above, or the provider's own ``ExemplarFilter``) leaves it out."""
    if mode == OFF:
        return None
    if mode == ALWAYS or (mode == TRACE_BASED and span.trace_flags.sampled):
        return (time_ns, span.trace_id, span.span_id)
    if isinstance(mode, str):
        return None
    try:  # a custom ExemplarFilter of the user's provider: ask it, as the SDK would
        ctx = set_span_in_context(NonRecordingSpan(span))
        return (time_ns, span.trace_id, span.span_id) if mode.should_sample(0.0, time_ns, {}, ctx) else None
    except Exception:
        return None
