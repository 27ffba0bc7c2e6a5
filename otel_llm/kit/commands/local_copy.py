"""A tracker whose requests' spans are also kept in this process, for a command that shows them at once.

The demo prints its summary and a waterfall as soon as the engine is done, without waiting on the
exporters. In export mode ``in_process`` the spans pass through this process's provider, and an extra
in-memory span processor sees them; in export mode ``process`` they are built by the export process, so
each record also goes, through a ``otel_llm.record.tee.Tee``, to an emitter of this process writing into
an in-memory span exporter (the same spans: the same code builds them from the same records).
"""

from __future__ import annotations

from typing import Any

from opentelemetry import metrics
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_llm.emit.pipeline import Emitter
from otel_llm.record.tee import Tee
from otel_llm.tracker import RequestTracker


def tracker_with_local_copy(
    telemetry: Any, **tracker_options: Any
) -> tuple[RequestTracker, InMemorySpanExporter]:
    """A ``RequestTracker`` on ``telemetry``'s providers, and the exporter holding a copy of its spans."""
    spans = InMemorySpanExporter()
    providers = {"tracer_provider": telemetry.tracer_provider, "meter_provider": telemetry.meter_provider}
    if telemetry.export_mode == "in_process":
        if hasattr(telemetry.tracer_provider, "add_span_processor"):  # absent when OTEL_SDK_DISABLED=true
            telemetry.tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
        return RequestTracker(**providers, **tracker_options), spans
    local = TracerProvider(resource=telemetry.tracer_provider.resource)
    local.add_span_processor(SimpleSpanProcessor(spans))

    class _Copying(RequestTracker):
        def _make_consumer(self, *args: Any) -> Any:
            return Tee(super()._make_consumer(*args), Emitter(local, metrics.NoOpMeterProvider()))

    return _Copying(**providers, **tracker_options), spans
