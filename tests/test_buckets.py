"""Histogram buckets resolve the values a fast engine and an overloaded server produce.

Read back through the real metric pipeline (tests/metric_capture.py): sub-millisecond token gaps land
in distinct buckets, and hour-long requests in a finite one, not +Inf.
"""

from __future__ import annotations

import pytest

from otel_llm import semconv as sc

# Every test here in both export modes: the engine's process, and the export process beside it.
pytestmark = pytest.mark.both_modes

T0 = 3000.0


def buckets_hit(point) -> list[int]:
    return [i for i, n in enumerate(point.bucket_counts) if n]


def test_sub_millisecond_token_gaps_are_resolved(harness):
    t = harness.tracker
    t.queued("fast", ts=T0)
    t.scheduled(["fast"], ts=T0)
    gaps = [0.00015, 0.0003, 0.0006, 0.0009]  # 150 µs to 900 µs, as a small model decodes
    ts = T0 + 0.001
    t.tokens(["fast"], ts=ts)
    for gap in gaps:
        ts += gap
        t.tokens(["fast"], ts=ts)
    t.finished("fast", ts=ts)
    m = harness.metrics()
    (itl,) = m[sc.METRIC_ITL]
    assert len(buckets_hit(itl)) == len(gaps), list(itl.explicit_bounds)
    (tpot,) = m[sc.METRIC_TPOT]
    assert buckets_hit(tpot) != [0]  # TPOT of 490 µs is not lumped with everything under 10 ms


def test_an_overloaded_servers_requests_stay_out_of_inf(harness):
    t = harness.tracker
    t.queued("slow", ts=T0)
    t.scheduled(["slow"], ts=T0 + 1500.0)  # 25 minutes queued
    t.tokens(["slow"], ts=T0 + 1600.0)
    t.tokens(["slow"], ts=T0 + 1601.0)
    t.finished("slow", ts=T0 + 5000.0)
    m = harness.metrics()
    for name in (sc.METRIC_TTFT, sc.METRIC_REQUEST_DURATION, sc.METRIC_QUEUE):
        (point,) = m[name]
        inf = len(point.bucket_counts) - 1
        assert buckets_hit(point) and buckets_hit(point)[0] != inf, name
