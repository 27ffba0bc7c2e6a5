"""Deprecated: kept so that code written for 0.1 still runs, with a warning; removed in 0.3.0.

``PreAggregatedMetricExporter`` used to be the only way otel_llm's histograms reached a pipeline. Every
reader of an SDK MeterProvider now receives them directly (``otel_llm.emit.sdk_bridge``), so this wrapper
only delegates to the exporter it wraps, with that exporter's temporality and aggregation preferences.
Making one warns with a ``DeprecationWarning`` (docs/development.md, "Deprecations").
"""

from __future__ import annotations

import warnings
from typing import Any

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData

__all__ = ["PreAggregatedMetricExporter"]

SCOPE_NAME = "otel_llm"
REMOVED_IN = "0.3.0"
DEPRECATION = (
    "otel_llm.export.preaggregated.PreAggregatedMetricExporter is deprecated and goes in otel-llm "
    f"{REMOVED_IN}: give the exporter it wraps to the reader directly (every reader of an SDK "
    "MeterProvider gets otel_llm's histograms through otel_llm.emit.sdk_bridge)"
)


class PreAggregatedMetricExporter(MetricExporter):
    """Deprecated: a plain pass-through to ``inner``. Use ``inner`` directly."""

    def __init__(self, inner: MetricExporter) -> None:
        warnings.warn(DEPRECATION, DeprecationWarning, stacklevel=2)
        super().__init__(
            preferred_temporality=dict(getattr(inner, "_preferred_temporality", {}) or {}),
            preferred_aggregation=dict(getattr(inner, "_preferred_aggregation", {}) or {}),
        )
        self.inner = inner

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        return self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)
