"""A cumulative explicit-bucket histogram kept by otel_llm itself, instead of an SDK instrument.

Every histogram otel_llm exports is counted here. Inter-token latency has one sample per request per
engine step, and a finished request has up to nine latency values; recording each through the SDK
(``Histogram.record``, a few microseconds with exemplar sampling) would cost more than building the
request's spans. Here a sample costs a bisect and a few increments, and ``otel_llm.emit.sdk_bridge`` hands
the totals to every reader of an SDK MeterProvider as ordinary histogram points. Bucket semantics match
OpenTelemetry's explicit buckets: bucket i holds values in
(bounds[i-1], bounds[i]].

Exemplars follow the SDK's aligned-bucket reservoir: each bucket keeps the latest sample offered with a
span (value, wall-clock time, trace and span id), tagged with the histogram's count at that moment so an
exporter can tell which exemplars arrived since its previous export.
"""

from __future__ import annotations

import math
import threading
import time
from bisect import bisect_left
from collections.abc import Sequence
from typing import Any

# (time_unix_nano, trace_id, span_id) of the span a sample belongs to.
SpanRef = tuple[int, int, int]
# (value, time_unix_nano, trace_id, span_id, count after the sample was added).
StoredExemplar = tuple[float, int, int, int, int]


class BucketHistogram:
    """Counts, sum, min and max of samples (seconds) for one attribute set, with the lock of its owner.

    ``add`` and ``record`` are called with ``lock`` already held (the owner's hooks hold it);
    ``snapshot`` takes it.
    """

    __slots__ = (
        "__weakref__",
        "_lock",
        "attributes",
        "bounds",
        "count",
        "counts",
        "exemplars",
        "max",
        "min",
        "start_ns",
        "sum",
    )

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
        # One slot per bucket, allocated with the first exemplar (inter-token latency never has any).
        self.exemplars: list[StoredExemplar | None] | None = None
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

    def record(self, value: float, span: SpanRef | None) -> None:
        """Record one sample; with ``span``, it becomes its bucket's exemplar. Caller holds the lock."""
        i = bisect_left(self.bounds, value)
        self.counts[i] += 1
        count = self.count = self.count + 1
        self.sum += value
        if value < self.min:
            self.min = value
        if value > self.max:
            self.max = value
        if span is not None:
            slots = self.exemplars
            if slots is None:
                slots = self.exemplars = [None] * len(self.counts)
            slots[i] = (value, span[0], span[1], span[2], count)

    def snapshot(self) -> HistogramSnapshot:
        """A consistent copy of the cumulative state."""
        with self._lock:
            slots = self.exemplars
            kept = () if slots is None else tuple(filter(None, slots))
            return HistogramSnapshot(self.counts[:], self.count, self.sum, self.min, self.max, kept)


class HistogramSnapshot:
    """Cumulative totals at one instant; ``minus`` gives the delta since an earlier snapshot."""

    __slots__ = ("count", "counts", "exemplars", "max", "min", "sum")

    def __init__(
        self,
        counts: list[int],
        count: int,
        total: float,
        low: float | None,
        high: float | None,
        exemplars: tuple[StoredExemplar, ...] = (),
    ) -> None:
        self.counts = counts
        self.count = count
        self.sum = total
        self.min = low
        self.max = high
        self.exemplars = exemplars

    def exemplars_since(self, earlier: HistogramSnapshot | None) -> tuple[StoredExemplar, ...]:
        """The exemplars recorded after ``earlier`` was taken (all of them without one)."""
        if earlier is None:
            return self.exemplars
        seen = earlier.count
        return tuple(e for e in self.exemplars if e[4] > seen)

    def minus(self, earlier: HistogramSnapshot) -> HistogramSnapshot:
        # Min and max of a delta window cannot be recovered from two cumulative states, and OTLP makes
        # both optional: leave them out rather than report the all-time extremes.
        return HistogramSnapshot(
            [a - b for a, b in zip(self.counts, earlier.counts)],
            self.count - earlier.count,
            self.sum - earlier.sum,
            None,
            None,
            self.exemplars_since(earlier),
        )


class HistogramSource:
    """One histogram metric (name, unit, description) an owner contributes to each collection: one point
    per ``BucketHistogram``, one histogram per attribute set.

    ``histograms`` only grows (its owner appends under its own lock); collectors read a copy.
    """

    __slots__ = ("bounds", "description", "histograms", "name", "unit")

    def __init__(
        self,
        name: str,
        unit: str,
        description: str,
        bounds: Sequence[float],
        histograms: Sequence[BucketHistogram] = (),
    ) -> None:
        self.name = name
        self.unit = unit
        self.description = description
        self.bounds = tuple(float(b) for b in bounds)
        self.histograms: list[BucketHistogram] = list(histograms)
