"""engine_state() checks what it is given: plain ints and floats in range are taken as they are, numbers
of other types (numpy scalars and the like) are converted, and anything else raises a TypeError or
ValueError naming the argument, with nothing stored. Read back through a real InMemoryMetricReader."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

from otel_llm import RequestTracker
from otel_llm import semconv as sc


class IndexOnly:
    """An integer type that is not int (as numpy.int64 is): it has __index__ only."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


@pytest.fixture
def tracked() -> Any:
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    tracker = RequestTracker(tracer_provider=TracerProvider(), meter_provider=meter_provider, model="m")
    yield tracker, reader
    meter_provider.shutdown()


def _values(reader: InMemoryMetricReader) -> dict[tuple[str, Any], float]:
    """Gauge and counter values by (metric name, llm.request.state); histogram sums and counts."""
    out: dict[tuple[str, Any], float] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for point in metric.data.data_points:
                    key = (metric.name, point.attributes.get(sc.LLM_REQUEST_STATE))
                    if hasattr(point, "bucket_counts"):
                        out[(metric.name, "sum")] = point.sum
                        out[(metric.name, "count")] = point.count
                    else:
                        out[key] = point.value
    return out


def test_plain_and_converted_numbers_are_stored(tracked: Any) -> None:
    tracker, reader = tracked
    tracker.engine_state(kv_cache_usage=0.25, running=3, waiting=2, prefix_cache_queries=40, step_tokens=7)
    tracker.engine_state(
        kv_cache_usage=Fraction(1, 2),
        running=IndexOnly(5),
        waiting=IndexOnly(0),
        prefix_cache_queries=IndexOnly(8),
        prefix_cache_hits=IndexOnly(6),
        spec_drafted_tokens=4,
        spec_accepted_tokens=3,
        step_tokens=IndexOnly(9),
    )
    values = _values(reader)
    assert values[(sc.METRIC_KV_CACHE_USAGE, None)] == 0.5
    assert values[(sc.METRIC_SCHEDULER_REQUESTS, sc.STATE_RUNNING)] == 5
    assert values[(sc.METRIC_SCHEDULER_REQUESTS, sc.STATE_WAITING)] == 0
    assert values[(sc.METRIC_PREFIX_CACHE_QUERIES, None)] == 48
    assert values[(sc.METRIC_PREFIX_CACHE_HITS, None)] == 6
    assert values[(sc.METRIC_SPEC_DRAFT_TOKENS, None)] == 4
    assert values[(sc.METRIC_SPEC_ACCEPTED_TOKENS, None)] == 3
    assert values[(sc.METRIC_STEP_TOKENS, "sum")] == 16
    assert values[(sc.METRIC_STEP_TOKENS, "count")] == 2


@pytest.mark.parametrize(
    ("argument", "value", "error"),
    [
        ("kv_cache_usage", 1.5, ValueError),
        ("kv_cache_usage", float("nan"), ValueError),
        ("kv_cache_usage", -0.1, ValueError),
        ("kv_cache_usage", "0.5", TypeError),
        ("kv_cache_usage", True, TypeError),
        ("running", -1, ValueError),
        ("running", 2.0, TypeError),
        ("waiting", True, TypeError),
        ("step_tokens", Decimal(3), TypeError),
        ("step_tokens", -4, ValueError),
        ("prefix_cache_queries", -2, ValueError),
        ("prefix_cache_hits", 1.0, TypeError),
        ("spec_drafted_tokens", "3", TypeError),
        ("spec_accepted_tokens", -1, ValueError),
    ],
)
def test_a_bad_argument_raises_naming_it_and_stores_nothing(
    tracked: Any, argument: str, value: Any, error: type[Exception]
) -> None:
    tracker, reader = tracked
    tracker.engine_state(kv_cache_usage=0.25, running=3, waiting=2, prefix_cache_queries=40, step_tokens=7)
    before = _values(reader)
    good = dict(kv_cache_usage=0.75, running=9, waiting=9, prefix_cache_queries=5, step_tokens=5)
    with pytest.raises(error, match=argument):
        tracker.engine_state(**{**good, argument: value})
    after = _values(reader)
    assert after == before | {(sc.METRIC_STEP_TOKENS, "count"): 1, (sc.METRIC_STEP_TOKENS, "sum"): 7}
