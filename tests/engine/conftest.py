"""Fixtures of the engine tests; the helpers they share live in engine_tools.py (a module name of
its own: test modules importing ``conftest`` would get whichever conftest.py was imported first)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from engine_tools import Pipelines
from metric_capture import MetricCapture
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


@pytest.fixture
def pipelines() -> Iterator[Pipelines]:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = MetricCapture()  # a plain InMemoryMetricReader on a provider of the test's own
    meter_provider = reader.meter_provider
    yield Pipelines(tracer_provider, meter_provider, spans, reader)
    tracer_provider.shutdown()
    meter_provider.shutdown()
