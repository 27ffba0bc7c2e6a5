"""A metric-exporter wrapper that adds otel_llm's pre-aggregated histograms to every export.

The Python SDK has no MetricProducer, so histograms that otel_llm counts itself (inter-token latency,
see ``otel_llm.histogram``) reach the pipeline here: each tracker registers an observable instrument
whose callback runs inside the reader's collection and leaves the tracker's histograms in a
thread-local hand-off; the reader then exports the collected batch from that same thread, and this
wrapper appends one OTLP histogram metric per hand-off to the ``otel_llm`` scope of that batch before
delegating to the real exporter. A histogram therefore reaches exactly the pipelines whose meter
provider the tracker uses. ``configure()`` installs the wrapper; wrap your own exporter with it when you
build the MeterProvider yourself.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from opentelemetry.sdk.metrics import Histogram as SdkHistogram
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    ScopeMetrics,
)
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_llm._version import __version__
from otel_llm.histogram import BucketHistogram, HistogramSnapshot

SCOPE_NAME = "otel_llm"

_handoff = threading.local()


class PreAggregatedSource:
    """A named histogram one tracker contributes to each collection of its meter provider."""

    __slots__ = ("description", "histogram", "name", "unit")

    def __init__(self, name: str, unit: str, description: str, histogram: BucketHistogram) -> None:
        self.name = name
        self.unit = unit
        self.description = description
        self.histogram = histogram


def offer(sources: Iterable[PreAggregatedSource]) -> None:
    """Called from an observable callback during collection: make ``sources`` part of this batch.

    Keyed by identity, so a pipeline without the wrapper keeps at most one entry per source.
    """
    pending: dict[int, PreAggregatedSource] | None = getattr(_handoff, "pending", None)
    if pending is None:
        pending = _handoff.pending = {}
    for source in sources:
        pending[id(source)] = source


def take_offered() -> list[PreAggregatedSource]:
    """The sources offered in this thread since the last take (the batch being exported)."""
    pending: dict[int, PreAggregatedSource] | None = getattr(_handoff, "pending", None)
    if not pending:
        return []
    _handoff.pending = {}
    return list(pending.values())


class PreAggregatedMetricExporter(MetricExporter):
    """Delegates to ``inner`` after merging the offered pre-aggregated histograms into the batch."""

    def __init__(self, inner: MetricExporter) -> None:
        super().__init__(
            preferred_temporality=dict(getattr(inner, "_preferred_temporality", {}) or {}),
            preferred_aggregation=dict(getattr(inner, "_preferred_aggregation", {}) or {}),
        )
        self.inner = inner
        self._delta = self._preferred_temporality.get(SdkHistogram) == AggregationTemporality.DELTA
        # For delta temporality: the cumulative snapshot and time of the previous export, per source.
        self._previous: dict[int, tuple[HistogramSnapshot, int]] = {}

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        sources = take_offered()
        if sources:
            metrics_data = self._merge(metrics_data, sources)
        return self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)

    def _merge(self, data: MetricsData, sources: list[PreAggregatedSource]) -> MetricsData:
        if not data.resource_metrics:
            return data
        now_ns = (
            max(
                (
                    p.time_unix_nano
                    for rm in data.resource_metrics
                    for sm in rm.scope_metrics
                    for m in sm.metrics
                    for p in m.data.data_points
                ),
                default=0,
            )
            or time.time_ns()
        )
        metrics = [self._metric(source, now_ns) for source in sources]
        # One provider -> one resource; the tracker's observable callback proves the otel_llm scope exists.
        first = data.resource_metrics[0]
        scopes = list(first.scope_metrics)
        for i, scope_metrics in enumerate(scopes):
            if scope_metrics.scope.name == SCOPE_NAME:
                scopes[i] = replace(scope_metrics, metrics=[*scope_metrics.metrics, *metrics])
                break
        else:
            scope = InstrumentationScope(SCOPE_NAME, __version__)
            scopes.append(ScopeMetrics(scope=scope, metrics=metrics, schema_url=""))
        return MetricsData(
            resource_metrics=[replace(first, scope_metrics=scopes), *data.resource_metrics[1:]]
        )

    def _metric(self, source: PreAggregatedSource, now_ns: int) -> Metric:
        hist = source.histogram
        snap = hist.snapshot()
        start_ns = hist.start_ns
        temporality = AggregationTemporality.CUMULATIVE
        if self._delta:
            temporality = AggregationTemporality.DELTA
            key = id(source)
            earlier = self._previous.get(key)
            self._previous[key] = (snap, now_ns)
            if earlier is not None:
                snap, start_ns = snap.minus(earlier[0]), earlier[1]
        empty = snap.count == 0
        point = HistogramDataPoint(
            attributes=hist.attributes,
            start_time_unix_nano=start_ns,
            time_unix_nano=max(now_ns, start_ns),
            count=snap.count,
            sum=snap.sum,
            bucket_counts=snap.counts,
            explicit_bounds=hist.bounds,
            min=None if empty else snap.min,
            max=None if empty else snap.max,
        )
        return Metric(
            name=source.name,
            description=source.description,
            unit=source.unit,
            data=Histogram(data_points=[point], aggregation_temporality=temporality),
        )
