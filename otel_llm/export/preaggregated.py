"""A metric-exporter wrapper that adds otel_llm's pre-aggregated histograms to every export.

otel_llm counts all of its histograms itself (``otel_llm.histogram``: inter-token latency on the hot
path, the request latencies when a request finishes), because an SDK measurement costs microseconds.
The Python SDK has no MetricProducer, so they reach the pipeline here: each tracker registers an
observable instrument whose callback runs inside the reader's collection and leaves the tracker's
sources in a thread-local hand-off; the reader then exports the collected batch from that same thread,
and this wrapper appends one OTLP histogram metric per metric name (one point per attribute set, with
exemplars) to the ``otel_llm`` scope of that batch before delegating to the real exporter. A histogram
therefore reaches exactly the pipelines whose meter provider the tracker uses. ``configure()`` installs
the wrapper; wrap your own exporter with it when you build the MeterProvider yourself: a reader whose
exporter is not wrapped gets no histograms at all, and the tracker logs a warning saying so.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from opentelemetry.sdk.metrics import Exemplar
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
    """One metric (name, unit, description) a tracker contributes to each collection of its meter
    provider: a point per histogram, one histogram per attribute set.

    ``histograms`` only grows (its owner appends under its own lock); the exporter reads a copy.
    """

    __slots__ = ("description", "histograms", "name", "unit")

    def __init__(
        self, name: str, unit: str, description: str, histograms: Sequence[BucketHistogram] = ()
    ) -> None:
        self.name = name
        self.unit = unit
        self.description = description
        self.histograms: list[BucketHistogram] = list(histograms)


def resource_of(meter_provider: Any) -> Any:
    """The SDK meter provider's Resource object (None for other providers).

    Each batch a provider's reader exports carries this very object, so it tells the exporter which
    offers belong to the batch. ``_sdk_config`` is an SDK internal, stable since the SDK's 1.x start.
    """
    return getattr(getattr(meter_provider, "_sdk_config", None), "resource", None)


def offer(sources: Iterable[PreAggregatedSource], resource: Any = None) -> bool:
    """Called from an observable callback during collection: make ``sources`` part of this batch.

    ``resource`` is the Resource of the meter provider being collected (``resource_of``); the exporter
    takes only offers made for the batch's own resource, so an offer left behind by a reader without
    the wrapper never leaks into another provider's export on the same thread. Returns True when one of
    the sources was still pending from an earlier collection in this thread, i.e. nothing took it: the
    reader's exporter is not wrapped in PreAggregatedMetricExporter. Keyed by identity, so such a
    pipeline keeps at most one entry per source.
    """
    pending: dict[int, tuple[PreAggregatedSource, Any]] | None = getattr(_handoff, "pending", None)
    if pending is None:
        pending = _handoff.pending = {}
    stale = False
    for source in sources:
        key = id(source)
        if key in pending:
            stale = True
        pending[key] = (source, resource)
    return stale


def take_offered(resource: Any = None) -> list[PreAggregatedSource]:
    """The sources offered in this thread since the last take for ``resource`` (the batch's resource;
    offers made without one match any batch). Offers for other resources are stale and dropped."""
    pending: dict[int, tuple[PreAggregatedSource, Any]] | None = getattr(_handoff, "pending", None)
    if not pending:
        return []
    _handoff.pending = {}
    return [source for source, owner in pending.values() if owner is None or owner is resource]


class PreAggregatedMetricExporter(MetricExporter):
    """Delegates to ``inner`` after merging the offered pre-aggregated histograms into the batch.

    Temporality follows ``inner``'s preference for histograms. Each wrapper keeps, per histogram, the
    snapshot it exported last: a delta point is the difference from it, and a point (of either
    temporality) carries only the exemplars recorded since, as the SDK's reservoirs do.
    """

    def __init__(self, inner: MetricExporter) -> None:
        super().__init__(
            preferred_temporality=dict(getattr(inner, "_preferred_temporality", {}) or {}),
            preferred_aggregation=dict(getattr(inner, "_preferred_aggregation", {}) or {}),
        )
        self.inner = inner
        self._delta = self._preferred_temporality.get(SdkHistogram) == AggregationTemporality.DELTA
        # The cumulative snapshot and time of this wrapper's previous export, per histogram; weak, so a
        # tracker that is gone takes its histograms with it.
        self._previous: weakref.WeakKeyDictionary[BucketHistogram, tuple[HistogramSnapshot, int]] = (
            weakref.WeakKeyDictionary()
        )

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        resource = metrics_data.resource_metrics[0].resource if metrics_data.resource_metrics else None
        sources = take_offered(resource)
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
        temporality = AggregationTemporality.DELTA if self._delta else AggregationTemporality.CUMULATIVE
        # Several trackers on one provider offer sources of the same name: one metric, all their points.
        by_name: dict[str, tuple[PreAggregatedSource, list[HistogramDataPoint]]] = {}
        for source in sources:
            points = [self._point(hist, now_ns) for hist in tuple(source.histograms)]
            if not points:
                continue  # nothing recorded yet: no point, as an SDK instrument never recorded to
            entry = by_name.setdefault(source.name, (source, []))
            entry[1].extend(points)
        metrics = [
            Metric(
                name=source.name,
                description=source.description,
                unit=source.unit,
                data=Histogram(data_points=points, aggregation_temporality=temporality),
            )
            for source, points in by_name.values()
        ]
        if not metrics:
            return data
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

    def _point(self, hist: BucketHistogram, now_ns: int) -> HistogramDataPoint:
        snap = hist.snapshot()
        earlier = self._previous.get(hist)
        self._previous[hist] = (snap, now_ns)
        start_ns = hist.start_ns
        exemplars = snap.exemplars_since(earlier[0] if earlier is not None else None)
        if self._delta and earlier is not None:
            snap, start_ns = snap.minus(earlier[0]), earlier[1]
        empty = snap.count == 0
        return HistogramDataPoint(
            attributes=hist.attributes,
            start_time_unix_nano=start_ns,
            time_unix_nano=max(now_ns, start_ns),
            count=snap.count,
            sum=snap.sum,
            bucket_counts=snap.counts,
            explicit_bounds=hist.bounds,
            min=None if empty else snap.min,
            max=None if empty else snap.max,
            exemplars=[
                Exemplar(
                    filtered_attributes=None,
                    value=float(value),
                    time_unix_nano=time_ns,
                    span_id=span_id,
                    trace_id=trace_id,
                )
                for value, time_ns, trace_id, span_id, _count in exemplars
            ],
        )
