"""Requests that never finish (an engine that forgets to call ``finished``): the registry is bounded by
``max_in_flight`` and ``max_age_s``, leaked requests are closed as ``evicted`` and counted, and the memory
the tracker holds stays flat as leaks go from N to 10N.

The pipeline keeps nothing (a span processor that only counts, a metric reader read once), so the memory
measured is the tracker's.
"""

from __future__ import annotations

import gc
import tracemalloc

from fault_tools import ProducedSpans
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

from otel_llm import RequestTracker
from otel_llm import semconv as sc

N = 600
MAX_IN_FLIGHT = 256


def tracker_without_retention(**kwargs):
    produced = ProducedSpans(keep_ids=False)
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(produced)
    reader = InMemoryMetricReader()
    tracker = RequestTracker(
        tracer_provider=tracer_provider,
        meter_provider=MeterProvider(metric_readers=[reader]),
        model="leaky",
        **kwargs,
    )
    return tracker, reader, produced


def leak(tracker: RequestTracker, first: int, count: int, t0: float, step_s: float) -> None:
    """Queue requests that never finish; every other one is also scheduled and produces a token."""
    for i in range(first, first + count):
        ts = t0 + i * step_s
        tracker.queued(i, ts=ts, prompt_tokens=8)
        if i % 2:
            tracker.scheduled([i], ts=ts)
            tracker.tokens([i], ts=ts)


def points(reader: InMemoryMetricReader, name: str) -> list:
    data = reader.get_metrics_data()
    return [
        p
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == name
        for p in m.data.data_points
    ]


def test_leaked_requests_bounded_by_count_and_memory_flat() -> None:
    tracker, reader, produced = tracker_without_retention(max_in_flight=MAX_IN_FLIGHT)
    t0 = 1000.0
    leak(tracker, 0, N, t0, 1e-6)  # warm-up: the registry is full from here on
    gc.collect()
    tracemalloc.start()
    try:
        leak(tracker, N, N, t0, 1e-6)
        gc.collect()
        after_n = tracemalloc.get_traced_memory()[0]
        leak(tracker, 2 * N, 9 * N, t0, 1e-6)
        gc.collect()
        after_10n = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()

    assert tracker.in_flight == MAX_IN_FLIGHT
    # Keeping the 9N extra leaked requests would cost ~9N/256 = 20x what the registry holds after N.
    assert after_10n - after_n < after_n, (after_n, after_10n)
    total = 11 * N
    (evicted,) = points(reader, sc.METRIC_ABANDONED)
    assert evicted.value == total - MAX_IN_FLIGHT
    by_reason = {p.attributes[sc.LLM_FINISH_REASON]: p.value for p in points(reader, sc.METRIC_REQUESTS)}
    assert by_reason == {sc.REASON_ABANDONED: total - MAX_IN_FLIGHT}
    assert produced.count >= total - MAX_IN_FLIGHT  # each evicted request was exported as a trace


def test_long_run_with_leaks_is_bounded_by_age() -> None:
    """10 ms between arrivals, 1 s maximum age: about 100 requests in flight, however long the run."""
    tracker, reader, _ = tracker_without_retention(max_age_s=1.0)
    t0 = 5000.0
    worst = 0
    for block in range(10):
        leak(tracker, block * 500, 500, t0, 0.01)
        worst = max(worst, tracker.in_flight)
    assert worst <= 101
    (evicted,) = points(reader, sc.METRIC_ABANDONED)
    assert evicted.value == 5_000 - tracker.in_flight
