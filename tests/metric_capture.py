"""A MeterProvider whose metrics reach memory the way they reach a backend in production.

otel_llm's histograms are pre-aggregated and only join an export through
``PreAggregatedMetricExporter``, so a plain ``InMemoryMetricReader`` sees the counters but no histogram.
This wires a real ``PeriodicExportingMetricReader`` (an interval no test reaches; ``collect`` exports on
demand from the calling thread) through the wrapper into a list.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.metrics.view import Aggregation

from otel_llm.export.preaggregated import PreAggregatedMetricExporter


class ListExporter(MetricExporter):
    """Keeps every exported batch (the SDK ships no in-memory metric exporter)."""

    def __init__(
        self,
        preferred_temporality: dict[type, AggregationTemporality] | None = None,
        preferred_aggregation: dict[type, Aggregation] | None = None,
    ) -> None:
        super().__init__(
            preferred_temporality=preferred_temporality, preferred_aggregation=preferred_aggregation
        )
        self.batches: list[MetricsData] = []

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        self.batches.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        pass


class MetricCapture:
    """``meter_provider`` for the tracker; ``get_metrics_data()`` collects and returns one export."""

    def __init__(
        self,
        preferred_temporality: dict[type, AggregationTemporality] | None = None,
        preferred_aggregation: dict[type, Aggregation] | None = None,
    ) -> None:
        self.exporter = ListExporter(preferred_temporality, preferred_aggregation)
        self.reader = PeriodicExportingMetricReader(
            PreAggregatedMetricExporter(self.exporter), export_interval_millis=3_600_000
        )
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def get_metrics_data(self) -> MetricsData | None:
        """Collect now and return what was exported (None if the collection produced nothing)."""
        before = len(self.exporter.batches)
        self.reader.force_flush()
        return self.exporter.batches[-1] if len(self.exporter.batches) > before else None

    def points(self, name: str) -> list[Any]:
        """The data points of metric ``name`` in a fresh collection."""
        data = self.get_metrics_data()
        return [
            p
            for rm in (data.resource_metrics if data else [])
            for sm in rm.scope_metrics
            for m in sm.metrics
            if m.name == name
            for p in m.data.data_points
        ]

    def shutdown(self) -> None:
        self.meter_provider.shutdown()
