"""Shared fixtures: a tracker wired to real SDK providers with in-memory exporters.

Metrics go to the SDK's standard InMemoryMetricReader on a provider the test builds, as a user's own
set-up would (tests/metric_capture.py): nothing of ours sits between the tracker and the reader.
Also the hooks of ``python -m pytest --quick`` (tests/quick_run.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from metric_capture import MetricCapture
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from quick_run import pytest_addoption, pytest_ignore_collect, pytest_terminal_summary

from otel_llm import RequestTracker
from otel_llm import semconv as sc

US = 1_000  # nanoseconds per microsecond
QUICK_RUN_HOOKS = (pytest_addoption, pytest_ignore_collect, pytest_terminal_summary)  # pytest finds them here


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


class Harness:
    def __init__(self, **tracker_kwargs: Any) -> None:
        self.span_exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.span_exporter))
        self.capture = MetricCapture()  # the SDK's InMemoryMetricReader on a user-built provider
        self.meter_provider = self.capture.meter_provider
        tracker_kwargs.setdefault("model", "test-model")
        self.tracker = RequestTracker(
            tracer_provider=self.tracer_provider, meter_provider=self.meter_provider, **tracker_kwargs
        )

    def finished_spans(self) -> list[ReadableSpan]:
        return list(self.span_exporter.get_finished_spans())

    def roots(self) -> list[ReadableSpan]:
        return [s for s in self.finished_spans() if s.name == sc.SPAN_REQUEST]

    def trace(self, request_id: Any, arrival: float) -> RequestTrace:
        roots = [s for s in self.roots() if s.attributes[sc.LLM_REQUEST_ID] == str(request_id)]
        assert len(roots) == 1, f"expected one llm.request for {request_id!r}, got {len(roots)}"
        root = roots[0]
        spans = [s for s in self.finished_spans() if s.context.trace_id == root.context.trace_id]
        return RequestTrace(root, spans, arrival)

    def metrics(self) -> dict[str, list[Any]]:
        """Latest cumulative data points by metric name (collects and exports once)."""
        latest = self.capture.get_metrics_data()
        points: dict[str, list[Any]] = {}
        for rm in latest.resource_metrics:
            for scope in rm.scope_metrics:
                for metric in scope.metrics:
                    points.setdefault(metric.name, []).extend(metric.data.data_points)
        return points

    def close(self) -> None:
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


@pytest.fixture
def harness() -> Iterator[Harness]:
    h = Harness()
    yield h
    h.close()


@pytest.fixture
def make_harness() -> Iterator[Any]:
    made: list[Harness] = []

    def make(**kwargs: Any) -> Harness:
        h = Harness(**kwargs)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


@pytest.fixture
def started() -> Iterator[list[Any]]:
    """Receivers and ``Telemetry`` handles a test starts: stopped / shut down even when the test fails.

    Shutdown is bounded (a test may leave its collector black-holed), so cleanup never hangs a run.
    """
    from otel_llm.export.telemetry import Telemetry

    things: list[Any] = []
    yield things
    for thing in reversed(things):
        if isinstance(thing, Telemetry):
            thing.shutdown(timeout_s=2)
        else:
            thing.stop()


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """No OTEL_* variable from the machine; metrics leave only on an explicit flush (no timing
    dependence); the working directory is the test's own, so a file fallback lands there."""
    from otlp_receivers import clear_otel_env

    clear_otel_env(monkeypatch)
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "600000")
    monkeypatch.chdir(tmp_path)
    return monkeypatch
