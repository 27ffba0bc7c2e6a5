"""Real OpenTelemetry SDK providers whose exporters discard, so that what is timed is the work done on
the engine's thread (span and metric building), not serialisation or the network.

Spans go through a ``SimpleSpanProcessor`` (export runs inline, deterministically) into
``DiscardSpanExporter``, a real ``SpanExporter`` that returns SUCCESS and keeps nothing but a count.
Metrics go to a plain SDK periodic reader (otel_llm's histograms reach it as they reach any reader)
exporting into ``DiscardMetricExporter``, with an interval far longer than any run, so nothing is
collected during a timed loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult


class DiscardSpanExporter(SpanExporter):
    """Accepts every span and drops it; counts them so a run can check spans were really produced."""

    def __init__(self) -> None:
        self.count = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.count += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


class DiscardMetricExporter(MetricExporter):
    """Accepts every metric batch and drops it; counts the batches."""

    def __init__(self) -> None:
        super().__init__()
        self.batches = 0

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: object
    ) -> MetricExportResult:
        self.batches += 1
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None:
        pass


@dataclass
class Providers:
    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    exporter: DiscardSpanExporter
    reader: PeriodicExportingMetricReader

    def shutdown(self) -> None:
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


def discarding_providers() -> Providers:
    exporter = DiscardSpanExporter()
    tracer_provider = TracerProvider(shutdown_on_exit=False)
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = PeriodicExportingMetricReader(DiscardMetricExporter(), export_interval_millis=86_400_000)
    meter_provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    return Providers(tracer_provider, meter_provider, exporter, reader)
