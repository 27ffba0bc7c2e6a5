"""A user's own MeterProvider with the SDK's standard ``InMemoryMetricReader``, nothing of ours in it.

Tests read metrics exactly as a user who already runs OpenTelemetry would: every otel_llm histogram
must reach this plain reader (through ``otel_llm.sdk_bridge``), in the temporality and aggregation it
prefers. Nothing here wraps, patches or helps the pipeline.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader, MetricsData
from opentelemetry.sdk.metrics.view import Aggregation, View


class MetricCapture:
    """``meter_provider`` for the tracker; ``get_metrics_data()`` collects once and returns the result."""

    def __init__(
        self,
        preferred_temporality: dict[type, AggregationTemporality] | None = None,
        preferred_aggregation: dict[type, Aggregation] | None = None,
        views: list[View] | None = None,
    ) -> None:
        self.reader = InMemoryMetricReader(
            preferred_temporality=preferred_temporality, preferred_aggregation=preferred_aggregation
        )
        self.meter_provider = MeterProvider(metric_readers=[self.reader], views=views or ())

    def get_metrics_data(self) -> MetricsData | None:
        """Collect now and return what the reader received (None if the collection produced nothing)."""
        return self.reader.get_metrics_data()

    def points(self, name: str) -> list[Any]:
        """The data points of metric ``name`` in a fresh collection."""
        return points_of(self.get_metrics_data(), name)

    def shutdown(self) -> None:
        self.meter_provider.shutdown()


def points_of(data: MetricsData | None, name: str) -> list[Any]:
    """The data points of metric ``name`` in one collection's result."""
    return [
        p
        for rm in (data.resource_metrics if data else [])
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == name
        for p in m.data.data_points
    ]
