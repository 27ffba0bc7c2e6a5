"""Metric temporality and histogram aggregation chosen from the standard OTLP environment variables.

The SDK's OTLP metric exporters read ``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE`` and
``OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION`` themselves. otel_llm's own OTLP-JSON file
exporter reads them here, with the same values and the same fallbacks, so switching between the file
default and a collector never changes what the numbers mean.
"""

from __future__ import annotations

import logging
import os

from opentelemetry.sdk.metrics import (
    Counter,
    Histogram,
    ObservableCounter,
    ObservableGauge,
    ObservableUpDownCounter,
    UpDownCounter,
)
from opentelemetry.sdk.metrics.export import AggregationTemporality
from opentelemetry.sdk.metrics.view import (
    Aggregation,
    ExplicitBucketHistogramAggregation,
    ExponentialBucketHistogramAggregation,
)

_logger = logging.getLogger(__name__)

ENV_TEMPORALITY = "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE"
ENV_HISTOGRAM_AGGREGATION = "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION"

_CUMULATIVE = AggregationTemporality.CUMULATIVE
_DELTA = AggregationTemporality.DELTA

# The specification's three presets. Up-down counters and gauges stay cumulative in every preset
# because a delta of a level is meaningless to a backend.
_PRESETS: dict[str, dict[type, AggregationTemporality]] = {
    "cumulative": {
        Counter: _CUMULATIVE,
        UpDownCounter: _CUMULATIVE,
        Histogram: _CUMULATIVE,
        ObservableCounter: _CUMULATIVE,
        ObservableUpDownCounter: _CUMULATIVE,
        ObservableGauge: _CUMULATIVE,
    },
    "delta": {
        Counter: _DELTA,
        UpDownCounter: _CUMULATIVE,
        Histogram: _DELTA,
        ObservableCounter: _DELTA,
        ObservableUpDownCounter: _CUMULATIVE,
        ObservableGauge: _CUMULATIVE,
    },
    "lowmemory": {
        Counter: _DELTA,
        UpDownCounter: _CUMULATIVE,
        Histogram: _DELTA,
        ObservableCounter: _CUMULATIVE,
        ObservableUpDownCounter: _CUMULATIVE,
        ObservableGauge: _CUMULATIVE,
    },
}


def temporality_from_env() -> dict[type, AggregationTemporality]:
    """Instrument class -> temporality; an unknown value logs a warning and means cumulative."""
    value = os.environ.get(ENV_TEMPORALITY, "cumulative").strip().lower() or "cumulative"
    preset = _PRESETS.get(value)
    if preset is None:
        _logger.warning(
            "%s=%r is not cumulative, delta or lowmemory; using cumulative", ENV_TEMPORALITY, value
        )
        preset = _PRESETS["cumulative"]
    return dict(preset)


def aggregation_from_env() -> dict[type, Aggregation]:
    """Instrument class -> aggregation for histograms; explicit buckets unless exponential is asked for.

    Explicit bucket boundaries given when an instrument is created still apply under the explicit default.
    """
    value = os.environ.get(ENV_HISTOGRAM_AGGREGATION, "explicit_bucket_histogram").strip().lower()
    if value == "base2_exponential_bucket_histogram":
        return {Histogram: ExponentialBucketHistogramAggregation()}
    if value not in ("", "explicit_bucket_histogram"):
        _logger.warning(
            "%s=%r is not explicit_bucket_histogram or base2_exponential_bucket_histogram; using explicit",
            ENV_HISTOGRAM_AGGREGATION,
            value,
        )
    return {Histogram: ExplicitBucketHistogramAggregation()}
