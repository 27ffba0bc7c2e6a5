"""A cumulative explicit-bucket histogram kept by otel_llm itself, for values too frequent for the SDK.

Inter-token latency has one sample per request per engine step. Recording each through the SDK
(``Histogram.record``, a few microseconds) would cost more than the engine step's own bookkeeping, so
the tracker counts samples here (a bisect and an increment, and one ``add`` for a whole batch that
shares a gap) and the export wrapper in ``otel_llm.export.preaggregated`` hands the totals to the
OpenTelemetry pipeline as an ordinary OTLP histogram point. Bucket semantics match OpenTelemetry's
explicit buckets: bucket i holds values in (bounds[i-1], bounds[i]].
"""

from __future__ import annotations

import math
import threading
import time
from bisect import bisect_left
from collections.abc import Sequence
from typing import Any


class BucketHistogram:
    """Counts, sum, min and max of samples (seconds), with the lock of its owner.

    ``add`` is called with ``lock`` already held (the tracker's hooks hold it); ``snapshot`` takes it.
    """

    __slots__ = ("_lock", "attributes", "bounds", "count", "counts", "max", "min", "start_ns", "sum")

    def __init__(self, bounds: Sequence[float], attributes: dict[str, Any], lock: threading.Lock) -> None:
        if list(bounds) != sorted(set(bounds)):
            raise ValueError(f"bucket boundaries must be strictly increasing, got {list(bounds)!r}")
        self.bounds = tuple(float(b) for b in bounds)
        self.attributes = dict(attributes)
        self._lock = lock
        self.counts = [0] * (len(self.bounds) + 1)
        self.count = 0
        self.sum = 0.0
        self.min = math.inf
        self.max = -math.inf
        self.start_ns = time.time_ns()  # start of the cumulative series (wall clock, for OTLP)

    def add(self, value: float, n: int = 1) -> None:
        """Record ``n`` samples of ``value`` seconds. Caller holds the lock."""
        self.counts[bisect_left(self.bounds, value)] += n
        self.count += n
        self.sum += value * n
        if value < self.min:
            self.min = value
        if value > self.max:
            self.max = value

    def snapshot(self) -> HistogramSnapshot:
        """A consistent copy of the cumulative state."""
        with self._lock:
            return HistogramSnapshot(list(self.counts), self.count, self.sum, self.min, self.max)


class HistogramSnapshot:
    """Cumulative totals at one instant; ``minus`` gives the delta since an earlier snapshot."""

    __slots__ = ("count", "counts", "max", "min", "sum")

    def __init__(
        self, counts: list[int], count: int, total: float, low: float | None, high: float | None
    ) -> None:
        self.counts = counts
        self.count = count
        self.sum = total
        self.min = low
        self.max = high

    def minus(self, earlier: HistogramSnapshot) -> HistogramSnapshot:
        # Min and max of a delta window cannot be recovered from two cumulative states, and OTLP makes
        # both optional: leave them out rather than report the all-time extremes.
        return HistogramSnapshot(
            [a - b for a, b in zip(self.counts, earlier.counts)],
            self.count - earlier.count,
            self.sum - earlier.sum,
            None,
            None,
        )
