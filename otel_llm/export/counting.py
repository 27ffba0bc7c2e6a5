"""Counting what the export pipeline loses, so that no span or metric point disappears silently.

Three places lose telemetry, each counted under its ``reason``:

- ``queue_full``: the batch span processor's queue (``OTEL_BSP_MAX_QUEUE_SIZE``, default 2048 spans) was
  full when a span ended. The SDK keeps the newest: the span at the old end of the queue is discarded to
  make room for the one that just ended. Counted by tapping the SDK's own drop notification.
- ``export_failed``: the exporter gave up on a batch (collector refused, unreachable or silent until the
  export timeout, after the SDK exporter's own retries), or raised. Every span / data point of the batch is
  counted.
- ``after_shutdown``: a span ended after the pipeline was shut down.

The counts are exported as cumulative self-metrics (``otel_llm.export.spans.dropped``,
``otel_llm.export.metric_points.dropped``), together with the span queue's depth
(``otel_llm.export.queue.depth``). Metric points lost while the collector is down are counted too and
arrive, as a cumulative total, with the first export that gets through.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from otel_llm import semconv as sc
from otel_llm._version import __version__

_logger = logging.getLogger(__name__)

ATTR_REASON = sc.EXPORT_DROP_REASON  # attribute of the dropped-counters: why the telemetry was lost
REASON_QUEUE_FULL = "queue_full"
REASON_EXPORT_FAILED = "export_failed"
REASON_AFTER_SHUTDOWN = "after_shutdown"

SPANS = "spans"
METRIC_POINTS = "metric_points"
# Reasons always reported (as 0 until something is lost), so a dashboard sees the series from the start.
_REASONS = {
    SPANS: (REASON_QUEUE_FULL, REASON_EXPORT_FAILED, REASON_AFTER_SHUTDOWN),
    METRIC_POINTS: (REASON_EXPORT_FAILED,),
}


class DropCounter:
    """Thread-safe running totals of lost telemetry, by signal (``spans`` / ``metric_points``) and reason."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], int] = {}

    def add(self, signal: str, reason: str, n: int) -> None:
        if n <= 0:
            return
        with self._lock:
            key = (signal, reason)
            self._counts[key] = self._counts.get(key, 0) + n

    def by_reason(self, signal: str) -> dict[str, int]:
        """``{reason: count}`` for one signal, e.g. ``{"queue_full": 12, "export_failed": 0, ...}``."""
        counts = dict.fromkeys(_REASONS.get(signal, ()), 0)
        with self._lock:
            counts.update({reason: n for (sig, reason), n in self._counts.items() if sig == signal})
        return counts

    def total(self, signal: str) -> int:
        return sum(self.by_reason(signal).values())


class CountingSpanExporter(SpanExporter):
    """Delegates to ``inner``; counts the spans of every batch it failed or raised on."""

    def __init__(self, inner: SpanExporter, drops: DropCounter) -> None:
        self.inner = inner
        self._drops = drops

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
        except Exception:
            self._drops.add(SPANS, REASON_EXPORT_FAILED, len(spans))
            raise  # the batch processor logs it, as it would without this wrapper
        if result is not SpanExportResult.SUCCESS:
            self._drops.add(SPANS, REASON_EXPORT_FAILED, len(spans))
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.inner.force_flush(timeout_millis)


def count_points(data: MetricsData) -> int:
    """Number of data points in an export batch."""
    return sum(
        len(metric.data.data_points)
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
    )


class CountingMetricExporter(MetricExporter):
    """Delegates to ``inner`` (keeping its temporality / aggregation preferences); counts the data points
    of every batch it failed or raised on."""

    def __init__(self, inner: MetricExporter, drops: DropCounter) -> None:
        super().__init__(
            preferred_temporality=dict(getattr(inner, "_preferred_temporality", {}) or {}),
            preferred_aggregation=dict(getattr(inner, "_preferred_aggregation", {}) or {}),
        )
        self.inner = inner
        self._drops = drops

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        try:
            result = self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
        except Exception:
            self._drops.add(METRIC_POINTS, REASON_EXPORT_FAILED, count_points(metrics_data))
            raise
        if result is not MetricExportResult.SUCCESS:
            self._drops.add(METRIC_POINTS, REASON_EXPORT_FAILED, count_points(metrics_data))
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)


class _DropTap:
    """Stands in for the SDK batch processor's internal-metrics object: forwards every call, and counts
    the drops it is told about (the SDK reports each queue-full or after-shutdown span to it)."""

    def __init__(self, inner: Any, drops: DropCounter) -> None:
        self._inner = inner
        self._drops = drops

    def drop_items(self, count: int, error_type: str = REASON_QUEUE_FULL) -> None:
        reason = REASON_AFTER_SHUTDOWN if error_type == "already_shutdown" else REASON_QUEUE_FULL
        self._drops.add(SPANS, reason, count)
        self._inner.drop_items(count, error_type)

    def __getattr__(self, name: str) -> Any:  # finish_items, register_queue_size, ...
        return getattr(self._inner, name)


class CountingBatchSpanProcessor(BatchSpanProcessor):
    """The SDK's BatchSpanProcessor (same ``OTEL_BSP_*`` settings, same drop rule) with its losses counted.

    Queue-full drops are seen through the SDK's internal processor-metrics hook, an internal of SDK 1.4x.
    Should a later SDK lay itself out differently, the processor still works and a warning says that
    queue-full drops are no longer counted (failed exports still are).
    """

    def __init__(self, exporter: SpanExporter, drops: DropCounter, **kwargs: Any) -> None:
        super().__init__(CountingSpanExporter(exporter, drops), **kwargs)
        self.drops = drops
        inner = getattr(self, "_batch_processor", None)
        self._queue: Any = getattr(inner, "_queue", None)
        if inner is not None and hasattr(inner, "_metrics") and self._queue is not None:
            inner._metrics = _DropTap(inner._metrics, drops)
            self.counts_queue_drops = True
        else:
            self.counts_queue_drops = False
            _logger.warning(
                "otel_llm: this OpenTelemetry SDK's BatchSpanProcessor is laid out differently than "
                "expected; spans dropped because its queue is full are not counted"
            )

    def queue_depth(self) -> int:
        """Spans waiting in the queue now (0 when the SDK does not show it)."""
        return len(self._queue) if self._queue is not None else 0


def register_self_metrics(
    meter_provider: metrics.MeterProvider,
    drops: DropCounter,
    queue_depth: Callable[[], int] | None = None,
) -> None:
    """Observable instruments for the drop counters (and the span queue depth, when there is a queue)."""
    meter = meter_provider.get_meter("otel_llm", __version__)

    def observer(signal: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(n, {ATTR_REASON: reason}) for reason, n in drops.by_reason(signal).items()]

        return observe

    meter.create_observable_counter(
        sc.METRIC_DROPPED_SPANS,
        callbacks=[observer(SPANS)],
        unit="{span}",
        description="Spans the export pipeline lost, by reason (queue_full, export_failed, after_shutdown)",
    )
    meter.create_observable_counter(
        sc.METRIC_DROPPED_POINTS,
        callbacks=[observer(METRIC_POINTS)],
        unit="{data_point}",
        description="Metric data points the export pipeline lost, by reason (export_failed)",
    )
    if queue_depth is not None:

        def observe_depth(options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(queue_depth())]

        meter.create_observable_up_down_counter(
            sc.METRIC_QUEUE_DEPTH,
            callbacks=[observe_depth],
            unit="{span}",
            description="Spans waiting in the batch span processor's queue",
        )
