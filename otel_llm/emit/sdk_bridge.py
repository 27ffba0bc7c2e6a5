"""The seam between otel_llm's own histograms and the OpenTelemetry SDK's metric readers.

otel_llm counts its histograms itself (``otel_llm.emit.histogram``): an SDK ``Histogram.record`` costs
microseconds, and inter-token latency has a sample per request per engine step. Those counts must reach
every reader of the user's SDK ``MeterProvider`` (periodic readers with any exporter,
``InMemoryMetricReader``, ``PrometheusMetricReader``, readers added later, the provider
``opentelemetry-instrument`` builds) as ordinary histogram points, in each reader's own temporality.

The Python SDK has no MetricProducer yet, so this module hooks the one step every reader's collection
goes through: the provider hands each reader a collect callback (the measurement consumer's
``collect``), the reader calls it and receives ``MetricsData``. ``attach()`` replaces that callback, for
the readers the provider has and, through the consumer, for readers added later, with one that calls the
original and then appends otel_llm's histograms to the ``otel_llm`` scope. SDK internals used (all
present from SDK 1.30 to 1.45, the versions tested): ``MeterProvider._measurement_consumer`` (its
``collect`` and ``_reader_storages``), ``MeterProvider._sdk_config`` (views, resource, exemplar filter),
``MetricReader._set_collect_callback``, ``MetricReader._instrument_class_temporality`` /
``_instrument_class_aggregation``, ``View._match``. If any is missing, ``attach()`` returns False after a
warning and the caller records through plain SDK instruments instead (correct, slower): never silence.

What the SDK would do differently for an instrument (a View that matches the metric: new boundaries,
rename, drop, exponential, attribute filter; a reader preferring another aggregation) is not replayed
here: ``needs_instrument()`` says so and the caller records that metric through a real SDK histogram,
which applies all of it.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, AlwaysOnExemplarFilter, Exemplar
from opentelemetry.sdk.metrics import Histogram as SdkHistogram
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.metrics.view import DefaultAggregation, ExplicitBucketHistogramAggregation
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_llm._version import __version__
from otel_llm.emit.histogram import BucketHistogram, HistogramSnapshot, HistogramSource
from otel_llm.emit.meter_providers import owners_for
from otel_llm.logs import warn_once

_log = logging.getLogger("otel_llm")

SCOPE_NAME = "otel_llm"
# Exemplar modes for otel_llm's own histograms, from the provider's exemplar filter.
EXEMPLARS_TRACE_BASED, EXEMPLARS_ALWAYS, EXEMPLARS_OFF = "trace_based", "always_on", "always_off"

_lock = threading.Lock()
_bridges: weakref.WeakKeyDictionary[Any, _Bridge | None] = weakref.WeakKeyDictionary()
_warn_once = warn_once


def attach(provider: Any) -> bool:
    """Make every reader of SDK ``provider`` (now and later) receive otel_llm's histograms.

    Idempotent. False (after one warning) when this SDK is laid out differently than expected.
    """
    with _lock:
        if provider in _bridges:
            return _bridges[provider] is not None
        try:
            bridge: _Bridge | None = _Bridge(provider)
        except Exception as exc:  # an SDK whose internals moved: degrade loudly, never silently
            bridge = None
            _warn_once(
                "attach",
                "otel_llm: cannot hand pre-aggregated histograms to this opentelemetry-sdk's readers "
                "(%s: %s); recording them through SDK histograms instead (same values, a few "
                "microseconds per sample)",
                type(exc).__name__,
                exc,
            )
        _bridges[provider] = bridge
        return bridge is not None


def needs_instrument(provider: Any, name: str, unit: str) -> bool:
    """True when the SDK would shape metric ``name`` otherwise than otel_llm's explicit buckets do: a
    View matches it, or a reader prefers a non-default histogram aggregation. Such a metric is recorded
    through a real SDK histogram, so the SDK applies the View or preference itself."""
    probe = _Probe(name, unit)
    for view in provider._sdk_config.views:
        if view._match(probe):
            return True
    return any(
        not _plain_explicit(_histogram_pref(r, "_instrument_class_aggregation")) for r in _readers(provider)
    )


def exemplar_mode(provider: Any) -> Any:
    """The provider's exemplar filter as a mode (or the filter object itself, for a custom one)."""
    config = getattr(provider, "_sdk_config", None)
    flt = getattr(config, "exemplar_filter", None)
    if flt is None or type(flt).__name__ == "TraceBasedExemplarFilter":
        return EXEMPLARS_TRACE_BASED
    if isinstance(flt, AlwaysOnExemplarFilter):
        return EXEMPLARS_ALWAYS
    if isinstance(flt, AlwaysOffExemplarFilter):
        return EXEMPLARS_OFF
    return flt


class _Probe(SdkHistogram):
    """Looks like an otel_llm histogram instrument to ``View._match`` (name, unit, meter)."""

    def __init__(self, name: str, unit: str) -> None:  # no super(): it is never recorded to
        self.name = name.lower()
        self.unit = unit
        self.instrumentation_scope = InstrumentationScope(SCOPE_NAME, __version__)


def _readers(provider: Any) -> list[Any]:
    return list(provider._measurement_consumer._reader_storages)


def _histogram_pref(reader: Any, attribute: str) -> Any:
    """The reader's preference (temporality or aggregation) for synchronous histograms."""
    for cls, value in getattr(reader, attribute).items():
        if isinstance(cls, type) and issubclass(cls, SdkHistogram):
            return value
    return None


_SDK_DEFAULT_BOUNDARIES = ExplicitBucketHistogramAggregation()._boundaries


def _plain_explicit(aggregation: Any) -> bool:
    """Default aggregation, or explicit buckets without a boundary list of the user's own (older SDKs
    fill in their generic default list, which stands for "the instrument's advice" in newer ones)."""
    if aggregation is None or isinstance(aggregation, DefaultAggregation):
        return True
    if isinstance(aggregation, ExplicitBucketHistogramAggregation):
        bounds = getattr(aggregation, "_boundaries", None)
        return bounds is None or tuple(bounds) == tuple(_SDK_DEFAULT_BOUNDARIES or ())
    return False


class _Bridge:
    """The collect-callback wrapper of one SDK MeterProvider, with each reader's last exported state."""

    def __init__(self, provider: Any) -> None:
        consumer = provider._measurement_consumer
        readers = list(consumer._reader_storages)
        config = provider._sdk_config
        if not hasattr(config, "views") or not hasattr(config, "resource"):
            raise AttributeError("MeterProvider._sdk_config has no views/resource")
        for reader in readers:  # check everything before changing anything
            _histogram_pref(reader, "_instrument_class_temporality")
            _histogram_pref(reader, "_instrument_class_aggregation")
            if not hasattr(reader, "_set_collect_callback"):
                raise AttributeError("MetricReader._set_collect_callback is missing")
        self._provider = weakref.ref(provider)
        self._resource = config.resource
        # Per reader, per histogram: (cumulative snapshot, time) of that reader's previous collection.
        # Each collection replaces the inner dict with the histograms it saw, so a histogram whose
        # tracker is gone is let go at the next collection.
        self._previous: weakref.WeakKeyDictionary[Any, dict[BucketHistogram, Any]] = (
            weakref.WeakKeyDictionary()
        )
        original = consumer.collect
        bridge_ref = weakref.ref(self)

        def collect(reader: Any, timeout_millis: float = 10_000, **kwargs: Any) -> MetricsData | None:
            data = original(reader, timeout_millis=timeout_millis, **kwargs)
            bridge = bridge_ref()
            if bridge is None:
                return data
            try:
                return bridge.merge(reader, data)
            except Exception:  # never cost the reader its SDK metrics
                _log.warning("otel_llm: adding histograms to a collection failed", exc_info=True)
                return data

        self._collect = collect  # kept alive by the bridge; the consumer and readers hold it too
        consumer.collect = collect  # readers added later get it from here
        for reader in readers:
            reader._set_collect_callback(collect)

    def merge(self, reader: Any, data: MetricsData | None) -> MetricsData | None:
        provider = self._provider()
        if provider is None:
            return data
        sources = [s for owner in owners_for(provider) for s in owner.histogram_sources()]
        if not sources:
            return data
        if not _plain_explicit(_histogram_pref(reader, "_instrument_class_aggregation")):
            _warn_once(
                f"late-reader-{id(reader)}",
                "otel_llm: metric reader %r prefers another histogram aggregation but was added after the "
                "tracker chose explicit buckets; it gets no otel_llm histograms (create trackers after "
                "adding such readers)",
                reader,
            )
            return data
        delta = _histogram_pref(reader, "_instrument_class_temporality") == AggregationTemporality.DELTA
        seen: dict[BucketHistogram, Any] = {}
        metrics = _metrics(sources, self._previous.get(reader) or {}, seen, delta, _now_ns(data))
        self._previous[reader] = seen
        if not metrics:
            return data
        return _append(data, metrics, self._resource)


def _now_ns(data: MetricsData | None) -> int:
    """The collection's time: the SDK points' own, so every point of one collection agrees."""
    if data is not None:
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    for point in metric.data.data_points:
                        return point.time_unix_nano
    return time.time_ns()


def _metrics(
    sources: Iterable[HistogramSource],
    previous: dict[BucketHistogram, Any],
    seen: dict[BucketHistogram, Any],
    delta: bool,
    now_ns: int,
) -> list[Metric]:
    """One metric per name; ``previous`` holds each histogram's state at this reader's last collection,
    ``seen`` receives the state now."""
    temporality = AggregationTemporality.DELTA if delta else AggregationTemporality.CUMULATIVE
    # Several trackers contribute sources of one name: one metric with all their points.
    by_name: dict[str, tuple[HistogramSource, list[HistogramDataPoint]]] = {}
    for source in sources:
        points = [_point(hist, previous.get(hist), seen, delta, now_ns) for hist in tuple(source.histograms)]
        if points:
            by_name.setdefault(source.name, (source, []))[1].extend(points)
    return [
        Metric(
            name=source.name,
            description=source.description,
            unit=source.unit,
            data=Histogram(data_points=points, aggregation_temporality=temporality),
        )
        for source, points in by_name.values()
    ]


def _point(
    hist: BucketHistogram,
    earlier: tuple[HistogramSnapshot, int] | None,
    seen: dict[BucketHistogram, Any],
    delta: bool,
    now_ns: int,
) -> HistogramDataPoint:
    snap = hist.snapshot()
    seen[hist] = (snap, now_ns)
    start_ns = hist.start_ns
    # Each collection carries only the exemplars recorded since this reader's previous one, as the SDK's
    # reservoirs do; a delta point is the difference from that collection.
    exemplars = snap.exemplars_since(earlier[0] if earlier is not None else None) if snap.exemplars else ()
    if delta and earlier is not None:
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
        # None leaves the OTLP fields unset for an empty point; the SDK's type says float only.
        min=None if empty else snap.min,  # type: ignore[arg-type]
        max=None if empty else snap.max,  # type: ignore[arg-type]
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


def _append(data: MetricsData | None, metrics: list[Metric], resource: Any) -> MetricsData:
    """``data`` with ``metrics`` added to its ``otel_llm`` scope (made if missing)."""
    if data is None or not data.resource_metrics:
        scope = ScopeMetrics(InstrumentationScope(SCOPE_NAME, __version__), metrics, "")
        return MetricsData([ResourceMetrics(resource, [scope], "")])
    first = data.resource_metrics[0]  # one provider, one resource
    scopes = list(first.scope_metrics)
    for i, scope_metrics in enumerate(scopes):
        if scope_metrics.scope.name == SCOPE_NAME:
            scopes[i] = replace(scope_metrics, metrics=[*scope_metrics.metrics, *metrics])
            break
    else:
        scopes.append(ScopeMetrics(InstrumentationScope(SCOPE_NAME, __version__), metrics, ""))
    return MetricsData([replace(first, scope_metrics=scopes), *data.resource_metrics[1:]])
