"""The tests' harness in export mode ``process``: a tracker on ``configure()``'s providers, whose spans and
metrics are built and exported by the export process to a real OTLP/gRPC receiver on loopback.

It offers what ``conftest.Harness`` offers (``tracker``, ``finished_spans()``, ``roots()``, ``trace()``,
``metrics()``, ``capture.points()`` / ``capture.get_metrics_data()``), so one test runs in both modes. What
arrives is decoded with the official protobuf messages (``otlp_receivers``) and rebuilt as the SDK's own
``ReadableSpan`` and metric data objects, field by field, so the test's assertions read the same
attributes in both modes. Nothing here helps the pipeline: the tracker, ``configure()``, the export
process, the exporter and the receiver are the real ones, as a user's set-up would have them; the test
only waits for what the export process sends, after the flush a user would call.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from harness import Reads
from metric_capture import points_of
from opentelemetry.sdk.metrics import Exemplar as SdkExemplar
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState
from otlp_receivers import GrpcReceiver

from otel_llm import RequestTracker

WAIT_S = 30.0
# OTLP span flags: bit 8 says whether bit 9 (the parent is remote) is set.
_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(v) for v in any_value.array_value.values)
    return getattr(any_value, kind) if kind else None


def _attributes(key_values: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in key_values}


def _trace_state(text: str) -> TraceState | None:
    return TraceState.from_header([text]) if text else TraceState()


def readable_span(resource: Any, scope: Any, span: Any) -> ReadableSpan:
    """One decoded OTLP span as the SDK's ``ReadableSpan``."""
    trace_id = int.from_bytes(span.trace_id, "big")
    # OTLP carries no trace flags of the span itself (the SDK's encoder sets only the parent's remote
    # bits): an exported span is a sampled one.
    flags = TraceFlags(TraceFlags.SAMPLED)
    context = SpanContext(
        trace_id, int.from_bytes(span.span_id, "big"), False, flags, _trace_state(span.trace_state)
    )
    parent = None
    if span.parent_span_id:
        remote = bool(span.flags & _IS_REMOTE) if span.flags & _HAS_IS_REMOTE else False
        parent = SpanContext(trace_id, int.from_bytes(span.parent_span_id, "big"), remote)
    status = Status(StatusCode(span.status.code), span.status.message or None)
    instrumentation = InstrumentationScope(scope.name, scope.version or None)
    return ReadableSpan(
        name=span.name,
        context=context,
        parent=parent,
        resource=Resource(_attributes(resource.attributes)),
        attributes=_attributes(span.attributes),
        events=[Event(e.name, _attributes(e.attributes), e.time_unix_nano) for e in span.events],
        links=[
            Link(
                SpanContext(int.from_bytes(link.trace_id, "big"), int.from_bytes(link.span_id, "big"), True),
                _attributes(link.attributes),
            )
            for link in span.links
        ],
        kind=SpanKind(span.kind - 1),  # OTLP reserves 0 for UNSPECIFIED; the SDK's INTERNAL is 0
        status=status,
        start_time=span.start_time_unix_nano,
        end_time=span.end_time_unix_nano,
        instrumentation_scope=instrumentation,
    )


def _exemplars(exemplars: Any) -> list[SdkExemplar]:
    return [
        SdkExemplar(
            _attributes(e.filtered_attributes),
            e.as_double if e.WhichOneof("value") == "as_double" else e.as_int,
            e.time_unix_nano,
            int.from_bytes(e.span_id, "big") if e.span_id else None,
            int.from_bytes(e.trace_id, "big") if e.trace_id else None,
        )
        for e in exemplars
    ]


def _number(p: Any) -> NumberDataPoint:
    value = p.as_double if p.WhichOneof("value") == "as_double" else p.as_int
    return NumberDataPoint(
        _attributes(p.attributes), p.start_time_unix_nano, p.time_unix_nano, value, _exemplars(p.exemplars)
    )


def _metric(metric: Any) -> Metric:
    kind = metric.WhichOneof("data")
    if kind == "histogram":
        points = [
            HistogramDataPoint(
                attributes=_attributes(p.attributes),
                start_time_unix_nano=p.start_time_unix_nano,
                time_unix_nano=p.time_unix_nano,
                count=p.count,
                sum=p.sum,
                bucket_counts=tuple(p.bucket_counts),
                explicit_bounds=tuple(p.explicit_bounds),
                min=p.min if p.HasField("min") else None,
                max=p.max if p.HasField("max") else None,
                exemplars=_exemplars(p.exemplars),
            )
            for p in metric.histogram.data_points
        ]
        data: Any = Histogram(points, AggregationTemporality(metric.histogram.aggregation_temporality))
    elif kind == "sum":
        data = Sum(
            [_number(p) for p in metric.sum.data_points],
            AggregationTemporality(metric.sum.aggregation_temporality),
            metric.sum.is_monotonic,
        )
    elif kind == "gauge":
        data = Gauge([_number(p) for p in metric.gauge.data_points])
    else:
        raise AssertionError(f"a {kind} metric: this harness does not rebuild it")
    return Metric(metric.name, metric.description, metric.unit, data)


def metrics_data(request: Any) -> MetricsData:
    """One decoded ``ExportMetricsServiceRequest`` as the SDK's ``MetricsData``."""
    return MetricsData(
        [
            ResourceMetrics(
                Resource(_attributes(rm.resource.attributes)),
                [
                    ScopeMetrics(
                        InstrumentationScope(sm.scope.name, sm.scope.version or None),
                        [_metric(m) for m in sm.metrics],
                        sm.schema_url,
                    )
                    for sm in rm.scope_metrics
                ],
                rm.schema_url,
            )
            for rm in request.resource_metrics
        ]
    )


@contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """``values`` in ``os.environ`` (the export process takes the environment ``configure()`` saw)."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("OTEL_")}
    for name in saved:
        del os.environ[name]
    os.environ.update(values)
    try:
        yield
    finally:
        for name in values:
            os.environ.pop(name, None)
        os.environ.update(saved)


class ReceivedMetrics:
    """``Harness.capture`` in export mode: each read flushes and waits for the export it triggered.

    In-process, one read is one collection of the reader. Here every flush (also one a span read asked
    for) is a collection of the export process's reader, and a collection carries the exemplars recorded
    since the one before it; so a read returns the newest export's points with the exemplars of every
    export since the previous read, which is what one collection in its place would have carried."""

    def __init__(self, harness: ExportHarness) -> None:
        self._harness = harness
        self._read = 0  # metric exports already returned by a read

    def get_metrics_data(self) -> MetricsData | None:
        h = self._harness
        collected = h.receiver.collected
        before = len(collected.received("metrics"))
        h.flush()
        got = collected.wait_until(
            lambda c: any(_ours(e.request) for e in c.received("metrics")[before:]), WAIT_S
        )
        assert got, "the export process sent no metrics after a flush"
        # The export process's exports (the engine's own pipeline exports nothing of otel_llm's).
        everything = collected.received("metrics")
        exports = [e for e in everything[self._read :] if _ours(e.request)]
        self._read = len(everything)
        assert exports, "no export of otel_llm's metrics arrived after a flush"
        latest = metrics_data(exports[-1].request)
        earlier: dict[tuple[str, Any], list[Any]] = {}
        for export in exports[:-1]:
            for name, point in _points(metrics_data(export.request)):
                earlier.setdefault((name, _key(point)), []).extend(getattr(point, "exemplars", ()) or ())
        for name, point in _points(latest):
            if hasattr(point, "exemplars"):
                point.exemplars[:0] = earlier.get((name, _key(point)), [])
        return latest

    def points(self, name: str) -> list[Any]:
        return points_of(self.get_metrics_data(), name)

    def shutdown(self) -> None:
        """Nothing of its own to stop (the harness's close does)."""


def _ours(request: Any) -> bool:
    return any(sm.scope.name == "otel_llm" for rm in request.resource_metrics for sm in rm.scope_metrics)


def _points(data: MetricsData) -> Iterator[tuple[str, Any]]:
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for point in metric.data.data_points:
                    yield metric.name, point


def _key(point: Any) -> Any:
    return tuple(sorted((k, str(v)) for k, v in point.attributes.items()))


class ExportHarness(Reads):
    """``conftest.Harness`` with the export process between the tracker and what the test reads."""

    mode = "process"

    def __init__(self, env: Mapping[str, str] | None = None, **tracker_kwargs: Any) -> None:
        """``env``: more variables of the environment ``configure()`` sees (and so the export process)."""
        from otel_llm.setup import configure

        self.receiver = GrpcReceiver()
        self.receiver.start()
        settings = {
            **(env or {}),
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.receiver.endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_METRIC_EXPORT_INTERVAL": "600000",  # metrics leave on a flush only
            # Room for a test's burst of spans, as the in-process harness's synchronous processor has.
            "OTEL_BSP_MAX_QUEUE_SIZE": "200000",
            "OTEL_LLM_EXPORT_MODE": "process",
        }
        with environment(settings):
            self.telemetry = configure(set_global=False, service_name="harness", shutdown_timeout_s=20)
        assert self.telemetry.export_mode == "process"
        self.tracer_provider = self.telemetry.tracer_provider
        self.meter_provider = self.telemetry.meter_provider
        self.capture = ReceivedMetrics(self)
        tracker_kwargs.setdefault("model", "test-model")
        self.tracker = RequestTracker(
            tracer_provider=self.tracer_provider, meter_provider=self.meter_provider, **tracker_kwargs
        )
        self._closed = False

    def flush(self) -> None:
        """What a user's ``Telemetry.force_flush()`` does: every record and figure so far exported."""
        assert self.telemetry.force_flush(timeout_s=WAIT_S), "the export process did not flush in time"

    def finished_spans(self) -> list[ReadableSpan]:
        self.flush()
        # Spans of a finished request leave with the flush; the receiver may still be taking them in.
        deadline = time.monotonic() + 2.0
        spans = self.receiver.collected.spans()
        while time.monotonic() < deadline:
            time.sleep(0.05)
            later = self.receiver.collected.spans()
            if len(later) == len(spans):
                break
            spans = later
        return [
            readable_span(rs.resource, ss.scope, span)
            for r in self.receiver.collected.received("traces")
            for rs in r.request.resource_spans
            for ss in rs.scope_spans
            for span in ss.spans
        ]

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.telemetry.shutdown(timeout_s=5)
            self.receiver.stop()
