"""Exporters and export plumbing of otel_llm's own.

- ``otlp_json``: the embedded default, OTLP JSON lines files the OpenTelemetry Collector can replay.
- ``otlp``: which exporter each signal gets, from the standard OTEL_* environment variables.
- ``preferences``: metric temporality / histogram aggregation from the standard environment variables.
- ``preaggregated``: the metric-exporter wrapper that adds otel_llm's pre-aggregated histograms.
- ``telemetry``: the handle ``otel_llm.configure()`` returns, with bounded flush and shutdown.
"""

from __future__ import annotations

from otel_llm.export.otlp_json import OtlpJsonMetricExporter, OtlpJsonSpanExporter

__all__ = ["OtlpJsonMetricExporter", "OtlpJsonSpanExporter"]
