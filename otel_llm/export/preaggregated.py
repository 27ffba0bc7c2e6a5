"""Kept for one release so that code written for the first round still runs; no one needs it now.

``PreAggregatedMetricExporter`` used to be the only way otel_llm's histograms reached a pipeline. Every
reader of an SDK MeterProvider now receives them directly (``otel_llm.sdk_bridge``), so this wrapper
only delegates to the exporter it wraps, with that exporter's temporality and aggregation preferences.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData

SCOPE_NAME = "otel_llm"


class PreAggregatedMetricExporter(MetricExporter):
    """Deprecated: a plain pass-through to ``inner``. Use ``inner`` directly."""

    def __init__(self, inner: MetricExporter) -> None:
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
