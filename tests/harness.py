"""The tests' harness in export mode ``in_process``: a tracker wired to real SDK providers with in-memory
exporters, and what both harnesses share for reading a request's trace back.

Metrics go to the SDK's standard InMemoryMetricReader on a provider the test builds, as a user's own
set-up would (tests/metric_capture.py): nothing of ours sits between the tracker and the reader. The
export-process harness (tests/export_harness.py) offers the same reads over a real OTLP receiver.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from metric_capture import MetricCapture
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_llm import RequestTracker
from otel_llm import semconv as sc

US = 1_000  # nanoseconds per microsecond


class RequestTrace:
    """The spans of one request, with helpers to check them against monotonic timestamps."""

    def __init__(self, root: ReadableSpan, spans: Sequence[ReadableSpan], arrival: float) -> None:
        self.root = root
        self.spans = spans
        self.arrival = arrival

    def children(self, parent: ReadableSpan, name: str | None = None) -> list[ReadableSpan]:
        found = [s for s in self.spans if s.parent is not None and s.parent.span_id == parent.context.span_id]
        found = [s for s in found if name is None or s.name == name]
        return sorted(found, key=lambda s: s.start_time)

    def child(self, parent: ReadableSpan, name: str) -> ReadableSpan:
        (span,) = self.children(parent, name)
        return span

    def at(self, mono_s: float) -> int:
        """Wall-clock ns expected for a monotonic timestamp, anchored at the root's start (A)."""
        return self.root.start_time + round((mono_s - self.arrival) * 1e9)

    def assert_interval(self, span: ReadableSpan, start: float, end: float) -> None:
        assert abs(span.start_time - self.at(start)) <= US, (
            span.name,
            "start",
            span.start_time - self.at(start),
        )
        assert abs(span.end_time - self.at(end)) <= US, (span.name, "end", span.end_time - self.at(end))

    def events(self, name: str) -> list[Any]:
        return [e for e in self.root.events if e.name == name]


class Reads:
    """What a test reads of a harness's exports: ``finished_spans()`` and ``capture`` come from each
    harness; the rest is shared."""

    capture: Any
    tracker: RequestTracker

    def finished_spans(self) -> list[ReadableSpan]:
        raise NotImplementedError

    def roots(self) -> list[ReadableSpan]:
        return [s for s in self.finished_spans() if s.name == sc.SPAN_REQUEST]

    def trace(self, request_id: Any, arrival: float) -> RequestTrace:
        spans = self.finished_spans()
        roots = [
            s
            for s in spans
            if s.name == sc.SPAN_REQUEST and s.attributes[sc.LLM_REQUEST_ID] == str(request_id)
        ]
        assert len(roots) == 1, f"expected one llm.request for {request_id!r}, got {len(roots)}"
        root = roots[0]
        return RequestTrace(root, [s for s in spans if s.context.trace_id == root.context.trace_id], arrival)

    def metrics(self) -> dict[str, list[Any]]:
        """Latest cumulative data points by metric name (collects and exports once)."""
        latest = self.capture.get_metrics_data()
        points: dict[str, list[Any]] = {}
        for rm in latest.resource_metrics:
            for scope in rm.scope_metrics:
                for metric in scope.metrics:
                    points.setdefault(metric.name, []).extend(metric.data.data_points)
        return points


class Harness(Reads):
    """A tracker on providers the test built (export mode ``in_process``, as for any user's own)."""

    mode = "in_process"

    def __init__(self, env: Mapping[str, str] | None = None, **tracker_kwargs: Any) -> None:
        """``env``: variables of the environment while the tracker is built (it reads them then)."""
        self.span_exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.span_exporter))
        self.capture = MetricCapture()  # the SDK's InMemoryMetricReader on a user-built provider
        self.meter_provider = self.capture.meter_provider
        tracker_kwargs.setdefault("model", "test-model")
        saved = {name: os.environ.get(name) for name in env or {}}
        os.environ.update(env or {})
        try:
            self.tracker = RequestTracker(
                tracer_provider=self.tracer_provider, meter_provider=self.meter_provider, **tracker_kwargs
            )
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

    def finished_spans(self) -> list[ReadableSpan]:
        return list(self.span_exporter.get_finished_spans())

    def close(self) -> None:
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()
