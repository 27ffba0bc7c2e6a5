"""Exporters and export plumbing of otel_llm's own (imported on use: they load the SDK and protobuf).

- ``otlp_json``: the embedded default, OTLP JSON lines files the OpenTelemetry Collector can replay.
- ``otlp``: which exporter each signal gets, from the standard OTEL_* environment variables.
- ``preferences``: metric temporality / histogram aggregation from the standard environment variables.
- ``counting``: what the export pipeline loses, counted.
- ``telemetry``: the handle ``otel_llm.configure()`` returns, with bounded flush and shutdown.
- ``preaggregated``: a deprecated pass-through wrapper, kept for one release.
"""

from __future__ import annotations

from typing import Any

__all__ = ["OtlpJsonMetricExporter", "OtlpJsonSpanExporter"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from otel_llm.export import otlp_json

        return getattr(otlp_json, name)
    raise AttributeError(f"module 'otel_llm.export' has no attribute {name!r}")
