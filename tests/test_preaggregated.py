"""The pre-aggregated request metrics: what reaches a pipeline through PreAggregatedMetricExporter.

Expected bucket counts come from a control: every value (computed from the lifecycle definitions and the
test's own timestamps) recorded in a real SDK histogram with the same boundaries.
"""

from __future__ import annotations

import itertools
import logging
import random

import pytest
from metric_capture import ListExporter, MetricCapture
from opentelemetry.sdk.metrics import Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    ExponentialHistogram,
    InMemoryMetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

from otel_llm import RequestTracker
from otel_llm import semconv as sc
from otel_llm.export.preaggregated import PreAggregatedMetricExporter
from otel_llm.export.preferences import ENV_HISTOGRAM_AGGREGATION, aggregation_from_env

T0 = 7000.0
DELTA = {Histogram: AggregationTemporality.DELTA}


class Traced:
    """A tracker whose spans go to memory and whose metrics go through ``capture``."""

    def __init__(self, capture: MetricCapture, sampler=None, **kwargs) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider(**({"sampler": sampler} if sampler else {}))
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        kwargs.setdefault("model", "m")
        self.tracker = RequestTracker(
            tracer_provider=self.tracer_provider, meter_provider=capture.meter_provider, **kwargs
        )

    def root(self, request_id: str):
        (root,) = [
            s
            for s in self.spans.get_finished_spans()
            if s.name == sc.SPAN_REQUEST and s.attributes[sc.LLM_REQUEST_ID] == request_id
        ]
        return root


def run(t: RequestTracker, rid: str, t0: float, ttft: float, gaps: list[float], **finish) -> float:
    """queued at t0, scheduled 1 ms later, first token at t0 + ttft, then one token per gap; returns E.

    The last token is at ``last(t0, ttft, gaps)``."""
    t.queued(rid, ts=t0)
    t.scheduled([rid], ts=t0 + 0.001)
    ts = t0 + ttft
    t.tokens([rid], ts=ts)
    for gap in gaps:
        ts += gap
        t.tokens([rid], ts=ts)
    end = ts + 0.0005
    t.finished(rid, ts=end, **finish)
    return end


def last(t0: float, ttft: float, gaps: list[float]) -> float:
    ts = t0 + ttft
    for gap in gaps:
        ts += gap
    return ts


def by_name(capture: MetricCapture) -> dict[str, list]:
    data = capture.get_metrics_data()
    out: dict[str, list] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out.setdefault(m.name, []).append(m)
    return out


@pytest.fixture
def capture():
    c = MetricCapture()
    yield c
    c.shutdown()


def test_request_histograms_equal_recording_every_value_in_the_sdk(capture):
    traced = Traced(capture)
    control_reader = InMemoryMetricReader()
    control_meter = MeterProvider(metric_readers=[control_reader]).get_meter("control")
    buckets = {
        sc.METRIC_TTFT: sc.BUCKETS_TTFT,
        sc.METRIC_TPOT: sc.BUCKETS_TPOT,
        sc.METRIC_REQUEST_DURATION: sc.BUCKETS_REQUEST_DURATION,
        sc.METRIC_QUEUE: sc.BUCKETS_PHASE,
        sc.METRIC_DECODE: sc.BUCKETS_PHASE,
    }
    control = {
        name: control_meter.create_histogram(name, explicit_bucket_boundaries_advisory=b)
        for name, b in buckets.items()
    }
    rng = random.Random(4)
    for i in range(300):
        t0 = T0 + i
        ttft = rng.choice([0.002, 0.02, 0.1, 0.5, 1.0, 2.5, 9.0])  # bucket edges included on purpose
        gaps = [rng.choice([0.005, 0.01, 0.03]) for _ in range(rng.randint(1, 6))]
        end = run(traced.tracker, f"r{i}", t0, ttft, gaps)
        # Values from lifecycle.md: ttft = F - A, tpot = (L - F) / (n - 1), e2e = E - A, queue = S1 - Q.
        first, final = t0 + ttft, last(t0, ttft, gaps)
        for name, value in (
            (sc.METRIC_TTFT, first - t0),
            (sc.METRIC_TPOT, (final - first) / len(gaps)),
            (sc.METRIC_REQUEST_DURATION, end - t0),
            (sc.METRIC_QUEUE, (t0 + 0.001) - t0),
            (sc.METRIC_DECODE, final - first),
        ):
            control[name].record(value)
    expected = {
        m.name: m.data.data_points[0]
        for rm in control_reader.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    got = by_name(capture)
    for name in buckets:
        ((metric,),) = [got[name]]
        (point,) = metric.data.data_points
        want = expected[name]
        assert list(point.bucket_counts) == list(want.bucket_counts), name
        assert tuple(point.explicit_bounds) == tuple(want.explicit_bounds), name
        assert point.count == want.count == 300
        assert point.sum == pytest.approx(want.sum, rel=1e-6)
        assert point.min == pytest.approx(want.min) and point.max == pytest.approx(want.max)
        assert metric.data.aggregation_temporality == AggregationTemporality.CUMULATIVE


def test_failed_durations_are_points_of_their_own_with_error_type(capture):
    traced = Traced(capture)
    run(traced.tracker, "ok", T0, 0.1, [0.01])
    run(traced.tracker, "oom", T0, 0.1, [0.01], reason="error", error=MemoryError("out of memory"))
    run(traced.tracker, "rt1", T0, 0.1, [0.01], reason="error", error=RuntimeError("x"))
    run(traced.tracker, "rt2", T0, 0.2, [0.01], reason="error", error=RuntimeError("y"))
    points = {p.attributes.get(sc.ERROR_TYPE): p.count for p in capture.points(sc.METRIC_REQUEST_DURATION)}
    assert points == {None: 1, "MemoryError": 1, "RuntimeError": 2}
    (ttft,) = capture.points(sc.METRIC_TTFT)
    assert ttft.count == 1  # failed requests skip TTFT
    reasons = {p.attributes[sc.LLM_FINISH_REASON]: p.value for p in capture.points(sc.METRIC_REQUESTS)}
    assert reasons == {"stop": 1, "error": 3}


def test_exemplars_point_at_the_request_span_and_its_end(capture):
    traced = Traced(capture)
    end = run(traced.tracker, "r", T0, 0.3, [0.01, 0.02])
    root = traced.root("r")
    points = by_name(capture)
    for name in (sc.METRIC_TTFT, sc.METRIC_TPOT, sc.METRIC_REQUEST_DURATION, sc.METRIC_DECODE):
        (point,) = points[name][0].data.data_points
        (exemplar,) = point.exemplars
        assert exemplar.trace_id == root.context.trace_id and exemplar.span_id == root.context.span_id
        assert exemplar.time_unix_nano == root.end_time  # E, the moment the values became known
        assert point.sum == pytest.approx(exemplar.value)
    (duration,) = points[sc.METRIC_REQUEST_DURATION][0].data.data_points
    assert duration.exemplars[0].value == pytest.approx(end - T0)


def test_unsampled_requests_leave_no_exemplar(capture):
    traced = Traced(capture, sampler=ALWAYS_OFF)
    run(traced.tracker, "r", T0, 0.3, [0.01])
    (ttft,) = capture.points(sc.METRIC_TTFT)
    assert ttft.count == 1 and list(ttft.exemplars) == []


def test_cumulative_points_carry_only_exemplars_new_since_the_previous_export(capture):
    traced = Traced(capture)
    run(traced.tracker, "a", T0, 0.3, [0.01])
    (first,) = capture.points(sc.METRIC_TTFT)
    run(traced.tracker, "b", T0 + 5, 0.3, [0.01])  # the same bucket: its exemplar is replaced
    (second,) = capture.points(sc.METRIC_TTFT)
    (third,) = capture.points(sc.METRIC_TTFT)
    assert (first.count, second.count, third.count) == (1, 2, 2)
    assert [e.span_id for e in first.exemplars] == [traced.root("a").context.span_id]
    assert [e.span_id for e in second.exemplars] == [traced.root("b").context.span_id]
    assert list(third.exemplars) == []
    assert second.start_time_unix_nano == first.start_time_unix_nano


def test_delta_points_add_up_and_each_exporter_keeps_its_own_window():
    delta, cumulative = ListExporter(DELTA), ListExporter()
    readers = [
        PeriodicExportingMetricReader(PreAggregatedMetricExporter(e), export_interval_millis=3_600_000)
        for e in (delta, cumulative)
    ]
    provider = MeterProvider(metric_readers=readers)
    tracker = RequestTracker(tracer_provider=TracerProvider(), meter_provider=provider, model="m")

    def ttft_points(exporter: ListExporter):
        (metric,) = [
            m
            for rm in exporter.batches[-1].resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
            if m.name == sc.METRIC_TTFT
        ]
        return metric.data.aggregation_temporality, metric.data.data_points[0]

    seen = []
    for i, n in enumerate((2, 0, 3)):
        for k in range(n):
            # TTFTs in distinct buckets, so each request leaves its own exemplar.
            run(tracker, f"r{i}-{k}", T0 + 10 * i + k, (0.003, 0.03, 0.3)[k], [0.01])
        provider.force_flush()  # both readers collect and export
        seen.append((ttft_points(delta), ttft_points(cumulative)))
    provider.shutdown()
    assert [d[1].count for d, _ in seen] == [2, 0, 3]
    assert [c[1].count for _, c in seen] == [2, 2, 5]
    assert all(d[0] == AggregationTemporality.DELTA for d, _ in seen)
    assert all(c[0] == AggregationTemporality.CUMULATIVE for _, c in seen)
    # Consecutive delta windows touch: each starts where the previous one ended.
    for (before, _), (after, _) in itertools.pairwise(seen):
        assert after[1].start_time_unix_nano == before[1].time_unix_nano
    assert [len(d[1].exemplars) for d, _ in seen] == [2, 0, 3]


def test_trackers_sharing_a_provider_share_one_metric_with_a_point_each(capture):
    first, second = Traced(capture, model="a"), Traced(capture, model="b")
    run(first.tracker, "r", T0, 0.1, [0.01])
    run(second.tracker, "r", T0, 0.1, [0.01])
    run(second.tracker, "s", T0, 0.1, [0.01])
    metrics = by_name(capture)
    (ttft,) = metrics[sc.METRIC_TTFT]
    counts = {p.attributes[sc.GEN_AI_REQUEST_MODEL]: p.count for p in ttft.data.data_points}
    assert counts == {"a": 1, "b": 2}


def test_a_pipeline_without_the_wrapper_warns_once_per_tracker_and_still_gets_counters(caplog):
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    trackers = [
        RequestTracker(tracer_provider=TracerProvider(), meter_provider=provider, model=m) for m in "ab"
    ]
    for t in trackers:
        run(t, "r", T0, 0.1, [0.01])
    with caplog.at_level(logging.WARNING, logger="otel_llm"):
        for _ in range(4):
            data = reader.get_metrics_data()
    warnings = [r for r in caplog.records if "PreAggregatedMetricExporter" in r.getMessage()]
    assert len(warnings) == len(trackers)
    names = {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert sc.METRIC_TTFT not in names  # what the warning is about
    requests = names[sc.METRIC_REQUESTS].data.data_points
    assert sorted(p.value for p in requests) == [1, 1]
    tokens = names[sc.METRIC_TOKENS].data.data_points
    assert {p.attributes[sc.GEN_AI_TOKEN_TYPE] for p in tokens} == {sc.TOKEN_TYPE_OUTPUT}
    provider.shutdown()


def test_histograms_of_an_unwrapped_provider_never_leak_into_another_providers_export(capture):
    """Found when the engine tests (plain in-memory reader) ran before the conformance tests in one
    process: the unwrapped collection's offer stayed pending and the next wrapped export on the thread
    took it. Offers are matched to the batch by the provider's resource."""
    reader = InMemoryMetricReader()
    unwrapped = MeterProvider(metric_readers=[reader])
    stray = RequestTracker(tracer_provider=TracerProvider(), meter_provider=unwrapped, model="stray")
    run(stray, "r", T0, 0.1, [0.01])
    reader.get_metrics_data()  # the stray tracker offers its histograms in this thread; nobody takes them
    traced = Traced(capture, model="mine")
    run(traced.tracker, "r", T0, 0.1, [0.01])
    metrics = by_name(capture)
    for name in (sc.METRIC_TTFT, sc.METRIC_ITL, sc.METRIC_REQUEST_DURATION):
        models = [p.attributes[sc.GEN_AI_REQUEST_MODEL] for m in metrics[name] for p in m.data.data_points]
        assert models == ["mine"], (name, models)
    unwrapped.shutdown()


def test_a_wrapped_pipeline_never_warns(capture, caplog):
    traced = Traced(capture)
    with caplog.at_level(logging.WARNING, logger="otel_llm"):
        for i in range(4):
            run(traced.tracker, f"r{i}", T0 + i, 0.1, [0.01])
            capture.get_metrics_data()
    assert not [r for r in caplog.records if "PreAggregatedMetricExporter" in r.getMessage()]


def test_exponential_histograms_asked_for_go_through_the_sdk(monkeypatch):
    monkeypatch.setenv(ENV_HISTOGRAM_AGGREGATION, "base2_exponential_bucket_histogram")
    capture = MetricCapture(preferred_aggregation=aggregation_from_env())
    try:
        traced = Traced(capture)
        run(traced.tracker, "r", T0, 0.3, [0.01, 0.02])
        run(traced.tracker, "e", T0, 0.3, [0.01], reason="error", error=ValueError("bad"))
        metrics = by_name(capture)
        (ttft,) = metrics[sc.METRIC_TTFT]
        assert isinstance(ttft.data, ExponentialHistogram)
        (point,) = ttft.data.data_points
        assert point.count == 1
        assert [e.span_id for e in point.exemplars] == [traced.root("r").context.span_id]
        (duration,) = metrics[sc.METRIC_REQUEST_DURATION]
        by_error = {p.attributes.get(sc.ERROR_TYPE): p.count for p in duration.data.data_points}
        assert by_error == {None: 1, "ValueError": 1}
        (itl,) = metrics[sc.METRIC_ITL]  # pre-aggregated whatever the setting
        assert list(itl.data.data_points[0].explicit_bounds) == list(sc.BUCKETS_ITL)
    finally:
        capture.shutdown()
