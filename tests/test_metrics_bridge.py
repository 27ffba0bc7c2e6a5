"""otel_llm's histograms on the user's own SDK MeterProvider: every reader, its preferences, its Views.

Expected bucket counts come from a control: every value (computed from the lifecycle definitions and the
test's own timestamps) recorded in a real SDK histogram with the same boundaries. Readers are the SDK's
standard ones (``InMemoryMetricReader``, ``PrometheusMetricReader`` scraped with prometheus_client);
nothing of the test wraps or helps the pipeline.
"""

from __future__ import annotations

import itertools
import logging
import random

import pytest
from metric_capture import MetricCapture, points_of
from opentelemetry import metrics as metrics_api
from opentelemetry.sdk.metrics import (
    AlwaysOffExemplarFilter,
    AlwaysOnExemplarFilter,
    Histogram,
    MeterProvider,
)
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    ExponentialHistogram,
    InMemoryMetricReader,
)
from opentelemetry.sdk.metrics.view import (
    DropAggregation,
    ExplicitBucketHistogramAggregation,
    ExponentialBucketHistogramAggregation,
    View,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

from otel_llm import RequestTracker
from otel_llm import semconv as sc

T0 = 7000.0
DELTA = {Histogram: AggregationTemporality.DELTA}
LATENCY_BUCKETS = {
    sc.METRIC_TTFT: sc.BUCKETS_TTFT,
    sc.METRIC_TPOT: sc.BUCKETS_TPOT,
    sc.METRIC_REQUEST_DURATION: sc.BUCKETS_REQUEST_DURATION,
    sc.METRIC_QUEUE: sc.BUCKETS_PHASE,
    sc.METRIC_PREFILL: sc.BUCKETS_PHASE,
    sc.METRIC_DECODE: sc.BUCKETS_PHASE,
    sc.METRIC_INFERENCE: sc.BUCKETS_PHASE,
    sc.METRIC_ITL: sc.BUCKETS_ITL,
}


class Traced:
    """A tracker whose spans go to memory and whose metrics go to ``meter_provider``."""

    def __init__(self, meter_provider, sampler=None, **kwargs) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider(**({"sampler": sampler} if sampler else {}))
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        kwargs.setdefault("model", "m")
        self.tracker = RequestTracker(
            tracer_provider=self.tracer_provider, meter_provider=meter_provider, **kwargs
        )

    def root(self, request_id: str):
        (root,) = [
            s
            for s in self.spans.get_finished_spans()
            if s.name == sc.SPAN_REQUEST and s.attributes[sc.LLM_REQUEST_ID] == request_id
        ]
        return root


def run(t: RequestTracker, rid: str, t0: float, ttft: float, gaps: list[float], **finish) -> float:
    """queued at t0, scheduled 1 ms later, first token at t0 + ttft, then one token per gap; returns E."""
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


def by_name(data) -> dict[str, list]:
    out: dict[str, list] = {}
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out.setdefault(m.name, []).append(m)
    return out


def workload(tracker: RequestTracker, control_meter, n: int = 200, seed: int = 4) -> None:
    """``n`` requests with random latencies; every value is also recorded in the control histograms."""
    control = {
        name: control_meter.create_histogram(name, explicit_bucket_boundaries_advisory=b)
        for name, b in LATENCY_BUCKETS.items()
    }
    rng = random.Random(seed)
    for i in range(n):
        t0 = T0 + 100 * i
        ttft = rng.choice([0.002, 0.02, 0.1, 0.5, 1.0, 2.5, 9.0])  # bucket edges included on purpose
        gaps = [rng.choice([0.0004, 0.005, 0.01, 0.03]) for _ in range(rng.randint(1, 6))]
        end = run(tracker, f"r{i}", t0, ttft, gaps)
        first, s1 = t0 + ttft, t0 + 0.001
        stamps = [first]  # the tokens events' timestamps, summed as run() sums them
        for gap in gaps:
            stamps.append(stamps[-1] + gap)
        final = stamps[-1]
        # docs/lifecycle.md: ttft = F - A, tpot = (L - F) / (n - 1), e2e = E - A, queue = S1 - Q, ...
        for name, value in (
            (sc.METRIC_TTFT, first - t0),
            (sc.METRIC_TPOT, (final - first) / len(gaps)),
            (sc.METRIC_REQUEST_DURATION, end - t0),
            (sc.METRIC_QUEUE, s1 - t0),
            (sc.METRIC_PREFILL, first - s1),
            (sc.METRIC_DECODE, final - first),
            (sc.METRIC_INFERENCE, final - s1),
        ):
            control[name].record(value)
        for before, after in itertools.pairwise(stamps):  # from the timestamps the engine reported
            control[sc.METRIC_ITL].record(after - before)


def control_points(reader: InMemoryMetricReader) -> dict[str, object]:
    return {m.name: m.data.data_points[0] for ms in by_name(reader.get_metrics_data()).values() for m in ms}


def assert_same_histograms(data, expected: dict[str, object], names=LATENCY_BUCKETS) -> None:
    got = by_name(data)
    for name in names:
        ((metric,),) = [got[name]]
        (point,) = metric.data.data_points
        want = expected[name]
        assert list(point.bucket_counts) == list(want.bucket_counts), name
        assert tuple(point.explicit_bounds) == tuple(want.explicit_bounds), name
        assert point.count == want.count, name
        assert point.sum == pytest.approx(want.sum, rel=1e-6), name
        assert point.min == pytest.approx(want.min) and point.max == pytest.approx(want.max), name


@pytest.fixture
def control():
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    yield reader, provider.get_meter("control")
    provider.shutdown()


def test_a_plain_in_memory_reader_gets_every_histogram_equal_to_recording_each_value(control):
    control_reader, control_meter = control
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    traced = Traced(provider)
    workload(traced.tracker, control_meter)
    data = reader.get_metrics_data()
    assert_same_histograms(data, control_points(control_reader))
    for name in LATENCY_BUCKETS:
        (metric,) = by_name(data)[name]
        assert metric.data.aggregation_temporality == AggregationTemporality.CUMULATIVE
        assert metric.unit == sc.UNIT_SECONDS
    provider.shutdown()


def test_two_readers_delta_and_cumulative_on_one_provider_each_get_their_own_window():
    delta, cumulative = InMemoryMetricReader(preferred_temporality=DELTA), InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[delta, cumulative])
    tracker = RequestTracker(tracer_provider=TracerProvider(), meter_provider=provider, model="m")

    def ttft(reader):
        (metric,) = by_name(reader.get_metrics_data())[sc.METRIC_TTFT]
        return metric.data.aggregation_temporality, metric.data.data_points[0]

    seen = []
    for i, n in enumerate((2, 0, 3)):
        for k in range(n):
            # TTFTs in distinct buckets, so each request leaves its own exemplar.
            run(tracker, f"r{i}-{k}", T0 + 10 * i + k, (0.003, 0.03, 0.3)[k], [0.01])
        seen.append((ttft(delta), ttft(cumulative)))
    provider.shutdown()
    assert [d[1].count for d, _ in seen] == [2, 0, 3]
    assert [c[1].count for _, c in seen] == [2, 2, 5]
    assert all(d[0] == AggregationTemporality.DELTA for d, _ in seen)
    assert all(c[0] == AggregationTemporality.CUMULATIVE for _, c in seen)
    for (before, _), (after, _) in itertools.pairwise(seen):  # delta windows touch
        assert after[1].start_time_unix_nano == before[1].time_unix_nano
    assert [len(d[1].exemplars) for d, _ in seen] == [2, 0, 3]


@pytest.mark.skipif(
    not hasattr(MeterProvider, "add_metric_reader"), reason="this SDK cannot add a reader to a provider"
)
def test_a_reader_added_after_the_tracker_gets_the_histograms():
    first = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[first])
    tracker = RequestTracker(tracer_provider=TracerProvider(), meter_provider=provider, model="m")
    run(tracker, "a", T0, 0.1, [0.01, 0.02])
    late = InMemoryMetricReader()
    provider.add_metric_reader(late)
    run(tracker, "b", T0 + 5, 0.1, [0.01])
    (ttft,) = points_of(late.get_metrics_data(), sc.METRIC_TTFT)
    (itl,) = points_of(late.get_metrics_data(), sc.METRIC_ITL)
    assert ttft.count == 2 and itl.count == 3  # cumulative since the tracker started
    provider.shutdown()


def test_prometheus_reader_scraped_with_prometheus_client_has_every_histogram_family():
    from opentelemetry.exporter import prometheus  # the dev extra installs it
    from prometheus_client import REGISTRY, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    reader = prometheus.PrometheusMetricReader()  # registers with prometheus_client's default registry
    provider = MeterProvider(metric_readers=[reader])
    try:
        tracker = RequestTracker(tracer_provider=TracerProvider(), meter_provider=provider, model="m")
        for i in range(3):
            run(tracker, f"r{i}", T0 + i, 0.05 * (i + 1), [0.01, 0.02])
        families = {f.name: f for f in text_string_to_metric_families(generate_latest(REGISTRY).decode())}
    finally:
        provider.shutdown()
    for name in LATENCY_BUCKETS:
        family = families[name.replace(".", "_") + "_seconds"]
        assert family.type == "histogram", name
        counts = [s.value for s in family.samples if s.name.endswith("_count")]
        assert counts == [3 if name != sc.METRIC_ITL else 6], (name, counts)
    ttft = families["gen_ai_server_time_to_first_token_seconds"]
    (total,) = [s.value for s in ttft.samples if s.name.endswith("_sum")]
    assert total == pytest.approx(0.05 + 0.10 + 0.15)


def test_views_reshape_otel_llms_histograms_as_they_would_an_sdk_instrument():
    bounds = (0.05, 0.5, 5.0)
    views = [
        View(instrument_name=sc.METRIC_TTFT, aggregation=ExplicitBucketHistogramAggregation(bounds)),
        View(instrument_name=sc.METRIC_QUEUE, aggregation=DropAggregation()),
        View(instrument_name=sc.METRIC_DECODE, name="decode_seconds", description="renamed"),
        View(instrument_name=sc.METRIC_ITL, aggregation=ExponentialBucketHistogramAggregation()),
    ]
    capture = MetricCapture(views=views)
    traced = Traced(capture.meter_provider)
    for i, ttft in enumerate((0.01, 0.2, 0.3, 7.0)):
        run(traced.tracker, f"r{i}", T0 + i, ttft, [0.01, 0.03])
    got = by_name(capture.get_metrics_data())
    capture.shutdown()
    (ttft_metric,) = got[sc.METRIC_TTFT]
    (point,) = ttft_metric.data.data_points
    assert tuple(point.explicit_bounds) == bounds
    assert list(point.bucket_counts) == [1, 2, 0, 1]
    assert sc.METRIC_QUEUE not in got
    assert sc.METRIC_DECODE not in got
    ((decode,),) = [got["decode_seconds"]]
    assert decode.description == "renamed" and decode.data.data_points[0].count == 4
    (itl,) = got[sc.METRIC_ITL]
    assert isinstance(itl.data, ExponentialHistogram)
    assert itl.data.data_points[0].count == 8
    # Views that match nothing of ours leave the rest pre-aggregated and intact.
    (prefill,) = got[sc.METRIC_PREFILL]
    assert tuple(prefill.data.data_points[0].explicit_bounds) == sc.BUCKETS_PHASE


def test_exponential_preferred_by_the_reader_reaches_every_histogram_with_exemplars():
    capture = MetricCapture(preferred_aggregation={Histogram: ExponentialBucketHistogramAggregation()})
    traced = Traced(capture.meter_provider)
    run(traced.tracker, "r", T0, 0.3, [0.01, 0.02])
    run(traced.tracker, "e", T0, 0.3, [0.01], reason="error", error=ValueError("bad"))
    got = by_name(capture.get_metrics_data())
    capture.shutdown()
    for name in LATENCY_BUCKETS:
        (metric,) = got[name]
        assert isinstance(metric.data, ExponentialHistogram), name
    (ttft,) = got[sc.METRIC_TTFT][0].data.data_points
    assert ttft.count == 1
    assert [e.span_id for e in ttft.exemplars] == [traced.root("r").context.span_id]
    by_error = {
        p.attributes.get(sc.ERROR_TYPE): p.count for p in got[sc.METRIC_REQUEST_DURATION][0].data.data_points
    }
    assert by_error == {None: 1, "ValueError": 1}
    assert sum(p.count for p in got[sc.METRIC_ITL][0].data.data_points) == 3


def test_failed_durations_are_points_of_their_own_with_error_type():
    capture = MetricCapture()
    traced = Traced(capture.meter_provider)
    run(traced.tracker, "ok", T0, 0.1, [0.01])
    run(traced.tracker, "oom", T0, 0.1, [0.01], reason="error", error=MemoryError("out of memory"))
    run(traced.tracker, "rt1", T0, 0.1, [0.01], reason="error", error=RuntimeError("x"))
    run(traced.tracker, "rt2", T0, 0.2, [0.01], reason="error", error=RuntimeError("y"))
    points = {p.attributes.get(sc.ERROR_TYPE): p.count for p in capture.points(sc.METRIC_REQUEST_DURATION)}
    assert points == {None: 1, "MemoryError": 1, "RuntimeError": 2}
    (ttft,) = capture.points(sc.METRIC_TTFT)
    assert ttft.count == 1  # failed requests skip TTFT
    capture.shutdown()


def test_finish_reasons_outside_the_known_set_count_as_other_and_the_span_keeps_them():
    capture = MetricCapture()
    traced = Traced(capture.meter_provider)
    for i, reason in enumerate(["stop", "length", "stop", "weird-1", "weird-2"]):
        run(traced.tracker, f"r{i}", T0 + i, 0.1, [0.01], reason=reason)
    reasons = {p.attributes[sc.LLM_FINISH_REASON]: p.value for p in capture.points(sc.METRIC_REQUESTS)}
    assert reasons == {"stop": 2, "length": 1, "other": 2}
    assert traced.root("r3").attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ("weird-1",)
    capture.shutdown()


def test_exemplars_point_at_the_request_span_and_its_end():
    capture = MetricCapture()
    traced = Traced(capture.meter_provider)
    end = run(traced.tracker, "r", T0, 0.3, [0.01, 0.02])
    root = traced.root("r")
    got = by_name(capture.get_metrics_data())
    for name in (sc.METRIC_TTFT, sc.METRIC_TPOT, sc.METRIC_REQUEST_DURATION, sc.METRIC_DECODE):
        (point,) = got[name][0].data.data_points
        (exemplar,) = point.exemplars
        assert exemplar.trace_id == root.context.trace_id and exemplar.span_id == root.context.span_id
        assert exemplar.time_unix_nano == root.end_time  # E, the moment the values became known
        assert point.sum == pytest.approx(exemplar.value)
    (duration,) = got[sc.METRIC_REQUEST_DURATION][0].data.data_points
    assert duration.exemplars[0].value == pytest.approx(end - T0)
    capture.shutdown()


@pytest.mark.parametrize(
    ("exemplar_filter", "sampler", "expected"),
    [
        (None, None, 1),  # the SDK default, trace based: a sampled span leaves an exemplar
        (None, ALWAYS_OFF, 0),
        (AlwaysOffExemplarFilter(), None, 0),
        (AlwaysOnExemplarFilter(), ALWAYS_OFF, 1),
    ],
)
def test_the_providers_exemplar_filter_is_honoured(exemplar_filter, sampler, expected):
    reader = InMemoryMetricReader()
    provider = MeterProvider(
        metric_readers=[reader], **({"exemplar_filter": exemplar_filter} if exemplar_filter else {})
    )
    traced = Traced(provider, sampler=sampler)
    run(traced.tracker, "r", T0, 0.3, [0.01])
    (ttft,) = points_of(reader.get_metrics_data(), sc.METRIC_TTFT)
    assert ttft.count == 1 and len(ttft.exemplars) == expected
    provider.shutdown()


def test_cumulative_points_carry_only_exemplars_new_since_the_previous_collection():
    capture = MetricCapture()
    traced = Traced(capture.meter_provider)
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
    capture.shutdown()


def test_trackers_sharing_a_provider_share_one_metric_with_a_point_each():
    capture = MetricCapture()
    first, second = Traced(capture.meter_provider, model="a"), Traced(capture.meter_provider, model="b")
    run(first.tracker, "r", T0, 0.1, [0.01])
    run(second.tracker, "r", T0, 0.1, [0.01])
    run(second.tracker, "s", T0, 0.1, [0.01])
    got = by_name(capture.get_metrics_data())
    for name in (sc.METRIC_TTFT, sc.METRIC_ITL):
        (metric,) = got[name]
        counts = {p.attributes[sc.GEN_AI_REQUEST_MODEL]: p.count for p in metric.data.data_points}
        assert counts == {"a": 1, "b": 2}, name
    capture.shutdown()


def test_two_providers_in_one_thread_never_mix_their_histograms():
    """A collection of one provider carries only the trackers registered on it."""
    mine, other = MetricCapture(), MetricCapture()
    stray = Traced(other.meter_provider, model="stray")
    run(stray.tracker, "r", T0, 0.1, [0.01])
    other.get_metrics_data()
    traced = Traced(mine.meter_provider, model="mine")
    run(traced.tracker, "r", T0, 0.1, [0.01])
    got = by_name(mine.get_metrics_data())
    for name in (sc.METRIC_TTFT, sc.METRIC_ITL, sc.METRIC_REQUEST_DURATION):
        models = [p.attributes[sc.GEN_AI_REQUEST_MODEL] for m in got[name] for p in m.data.data_points]
        assert models == ["mine"], (name, models)
    mine.shutdown()
    other.shutdown()


class DelegatingMeterProvider(metrics_api.MeterProvider):
    """A MeterProvider that is not the SDK's (as a vendor's wrapper would be): it hands out the meters of
    an SDK provider it keeps, so what reaches that provider's reader can be read back."""

    def __init__(self, inner: MeterProvider) -> None:
        self.inner = inner

    def get_meter(self, name, version=None, schema_url=None, attributes=None):
        return self.inner.get_meter(name, version, schema_url)


def test_a_provider_that_is_not_the_sdks_gets_plain_api_histograms_with_the_same_counts(control):
    control_reader, control_meter = control
    reader = InMemoryMetricReader()
    sdk = MeterProvider(metric_readers=[reader])
    traced = Traced(DelegatingMeterProvider(sdk))
    workload(traced.tracker, control_meter, n=60)
    assert_same_histograms(reader.get_metrics_data(), control_points(control_reader))
    sdk.shutdown()


def test_an_sdk_laid_out_otherwise_degrades_to_sdk_histograms_with_one_warning(caplog, control):
    """Stands in for a future SDK release whose internals moved (it cannot be installed here): the
    provider's configuration lacks the ``views`` the bridge reads (the SDK's collection path keeps its
    own reference and is unaffected). The histograms must still arrive, through SDK instruments, and a
    warning must say so."""
    import types

    control_reader, control_meter = control
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    config = provider._sdk_config
    provider._sdk_config = types.SimpleNamespace(
        resource=config.resource, exemplar_filter=config.exemplar_filter
    )
    with caplog.at_level(logging.WARNING, logger="otel_llm"):
        traced = Traced(provider)
        workload(traced.tracker, control_meter, n=40)
        data = reader.get_metrics_data()
    warnings = [r for r in caplog.records if "SDK histograms instead" in r.getMessage()]
    assert len(warnings) == 1
    assert_same_histograms(data, control_points(control_reader))
    provider._sdk_config = config
    provider.shutdown()


def test_collecting_many_attribute_sets_gives_one_point_each():
    capture = MetricCapture()
    trackers = [Traced(capture.meter_provider, model=f"model-{i}").tracker for i in range(50)]
    for i, tracker in enumerate(trackers):
        run(tracker, "r", T0 + i, 0.1, [0.01])
    (itl,) = by_name(capture.get_metrics_data())[sc.METRIC_ITL]
    assert sorted(p.attributes[sc.GEN_AI_REQUEST_MODEL] for p in itl.data.data_points) == sorted(
        f"model-{i}" for i in range(50)
    )
    capture.shutdown()
