"""Counting what the export pipeline loses, so that no span or metric point disappears silently.

Three places lose telemetry, each counted under its ``reason``:

- ``queue_full``: the batch span processor's queue (``OTEL_BSP_MAX_QUEUE_SIZE``, default 2048 spans) was
  full when a span ended. The SDK keeps the newest: the span at the old end of the queue is discarded to
  make room for the one that just ended. Counted by the processor, by the SDK's own rule.
- ``export_failed``: the exporter gave up on a batch (after the SDK exporter's own retries), or raised.
  Every span / data point of the batch is counted. When the collector's last answer says why
  (``otel_llm.export.answers``), the batch is counted under that instead: ``export_not_found``,
  ``export_unauthorized``, ``export_too_large``, ``export_unavailable`` or ``export_timed_out``; a
  collector nobody could connect to, or another answer, stays ``export_failed``.
- ``after_shutdown``: a span ended after the pipeline was shut down.

The counts are exported as cumulative self-metrics (``otel_llm.export.spans.dropped``,
``otel_llm.export.metric_points.dropped``), together with the span queue's depth
(``otel_llm.export.queue.depth``). Metric points lost while the collector is down are counted too and
arrive, as a cumulative total, with the first export that gets through.
"""

from __future__ import annotations

import inspect
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
from otel_llm.export import answers as export_answers

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
    """Thread-safe running totals of lost telemetry, by signal (``spans`` / ``metric_points``) and reason;
    beside them, what was delivered (exports that succeeded) and, for spans, how many were handed to the
    pipeline, so a summary can also name the spans still queued when the pipeline stopped."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], int] = {}
        self._delivered: dict[str, int] = {}
        self._in_flight: dict[str, int] = {}  # in exports that have not returned yet
        self.spans_ended = 0  # sampled spans that reached the batch span processor
        # Called (outside the lock) when spans left the pipeline, delivered or lost: the export process
        # tells the engine at once which requests are done (otel_llm.export.process).
        self.on_spans_left: Callable[[], None] | None = None

    def add_delivered(self, signal: str, n: int) -> None:
        with self._lock:
            self._delivered[signal] = self._delivered.get(signal, 0) + n
        if signal == SPANS and self.on_spans_left is not None:
            self.on_spans_left()

    def delivered(self, signal: str) -> int:
        """Spans / metric points in exports that succeeded."""
        with self._lock:
            return self._delivered.get(signal, 0)

    def in_flight(self, signal: str, n: int) -> None:
        """``n`` more (or, negative, fewer) of ``signal`` in exports under way."""
        with self._lock:
            self._in_flight[signal] = self._in_flight.get(signal, 0) + n

    def exporting(self, signal: str) -> int:
        """How many of ``signal`` are in exports under way (neither delivered nor lost yet)."""
        with self._lock:
            return self._in_flight.get(signal, 0)

    def span_ended(self) -> None:
        with self._lock:
            self.spans_ended += 1

    def add(self, signal: str, reason: str, n: int) -> None:
        if n <= 0:
            return
        with self._lock:
            key = (signal, reason)
            self._counts[key] = self._counts.get(key, 0) + n
        if signal == SPANS and self.on_spans_left is not None:
            self.on_spans_left()

    def by_reason(self, signal: str) -> dict[str, int]:
        """``{reason: count}`` for one signal, e.g. ``{"queue_full": 12, "export_failed": 0, ...}``."""
        counts = dict.fromkeys(_REASONS.get(signal, ()), 0)
        with self._lock:
            counts.update({reason: n for (sig, reason), n in self._counts.items() if sig == signal})
        return counts

    def total(self, signal: str) -> int:
        return sum(self.by_reason(signal).values())


def _failure(answers: export_answers.Answers | None) -> str:
    """The reason a failed export is counted under: what the collector last answered, when known."""
    known = answers.reason() if answers is not None else None
    return known or REASON_EXPORT_FAILED


class CountingSpanExporter(SpanExporter):
    """Delegates to ``inner``; counts the spans of every batch it failed or raised on, under what the
    collector answered when ``inner`` is an SDK OTLP exporter (``otel_llm.export.answers``)."""

    def __init__(self, inner: SpanExporter, drops: DropCounter) -> None:
        self.inner = inner
        self._drops = drops
        self._answers = export_answers.watch(inner)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._answers is not None:
            self._answers.begin()
        try:
            result = self.inner.export(spans)
        except Exception:
            self._drops.add(SPANS, _failure(self._answers), len(spans))
            raise  # the batch processor logs it, as it would without this wrapper
        if result is SpanExportResult.SUCCESS:
            self._drops.add_delivered(SPANS, len(spans))
        else:
            self._drops.add(SPANS, _failure(self._answers), len(spans))
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
    of every batch it failed or raised on, as ``CountingSpanExporter`` counts spans."""

    def __init__(self, inner: MetricExporter, drops: DropCounter) -> None:
        super().__init__(
            preferred_temporality=dict(getattr(inner, "_preferred_temporality", {}) or {}),
            preferred_aggregation=dict(getattr(inner, "_preferred_aggregation", {}) or {}),
        )
        self.inner = inner
        self._drops = drops
        self._answers = export_answers.watch(inner)

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        points = count_points(metrics_data)
        self._drops.in_flight(METRIC_POINTS, points)
        if self._answers is not None:
            self._answers.begin()
        try:
            result = self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
        except Exception:
            self._drops.add(METRIC_POINTS, _failure(self._answers), points)
            raise
        finally:
            self._drops.in_flight(METRIC_POINTS, -points)
        if result is MetricExportResult.SUCCESS:
            self._drops.add_delivered(METRIC_POINTS, points)
        else:
            self._drops.add(METRIC_POINTS, _failure(self._answers), points)
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)


class CountingBatchSpanProcessor(BatchSpanProcessor):
    """The SDK's BatchSpanProcessor (same ``OTEL_BSP_*`` settings, same drop rule) with its losses counted.

    A span is counted in ``on_end``, before the SDK sees it, by the same rule the SDK drops by: sampled,
    and either the processor is shut down (``after_shutdown``) or its queue is at capacity (``queue_full``;
    the SDK then discards the oldest queued span to make room). The queue is read through its one
    attribute (``_batch_processor._queue`` in SDK 1.4x, ``queue`` before); should a later SDK lay itself
    out differently, queue-full drops are no longer counted and a warning says so. Where the SDK accepts
    a ``meter_provider``, it gets ours, so the SDK's own ``otel.sdk.processor.span.*`` self-metrics (on
    with ``OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED=true``) go out through the same pipeline.
    """

    def __init__(
        self,
        exporter: SpanExporter,
        drops: DropCounter,
        meter_provider: metrics.MeterProvider | None = None,
        **kwargs: Any,
    ) -> None:
        if meter_provider is not None and "meter_provider" in inspect.signature(super().__init__).parameters:
            kwargs["meter_provider"] = meter_provider
        super().__init__(CountingSpanExporter(exporter, drops), **kwargs)
        self.drops = drops
        self._closed = False
        inner = getattr(self, "_batch_processor", None)
        queue = getattr(inner, "_queue", None) if inner is not None else getattr(self, "queue", None)
        self._queue: Any = queue if queue is not None and getattr(queue, "maxlen", None) else None
        self.counts_queue_drops = self._queue is not None
        if self._queue is None:
            _logger.warning(
                "otel_llm: this OpenTelemetry SDK's BatchSpanProcessor is laid out differently than "
                "expected; spans dropped because its queue is full are not counted"
            )

    def on_end(self, span: ReadableSpan) -> None:
        context = span.context
        if context is not None and context.trace_flags.sampled:
            self.drops.span_ended()
            if self._closed:
                self.drops.add(SPANS, REASON_AFTER_SHUTDOWN, 1)
            elif self._queue is not None and len(self._queue) >= self._queue.maxlen:
                self.drops.add(SPANS, REASON_QUEUE_FULL, 1)
        super().on_end(span)

    def shutdown(self) -> None:
        self._closed = True
        super().shutdown()

    def queue_depth(self) -> int:
        """Spans waiting in the queue now (0 when the SDK does not show it)."""
        return len(self._queue) if self._queue is not None else 0


def register_self_metrics(
    meter_provider: metrics.MeterProvider,
    drops: DropCounter,
    queue_depth: Callable[[], int] | None = None,
    more: Callable[[], dict[str, dict[str, int]]] | None = None,
) -> None:
    """Observable instruments for the drop counters (and the span queue depth, when there is a queue).
    ``more``: losses counted elsewhere, by signal and reason, added in (the engine's own pipeline, for
    the export process: one series for both)."""
    meter = meter_provider.get_meter("otel_llm", __version__)

    def observer(signal: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            counts = drops.by_reason(signal)
            for reason, n in (more().get(signal, {}) if more is not None else {}).items():
                counts[reason] = counts.get(reason, 0) + n
            return [Observation(n, {ATTR_REASON: reason}) for reason, n in counts.items()]

        return observe

    meter.create_observable_counter(
        sc.METRIC_DROPPED_SPANS,
        callbacks=[observer(SPANS)],
        unit="{span}",
        description="Spans the export pipeline lost, by reason (queue_full, export_failed or what the "
        "collector answered: export_not_found, ...; after_shutdown)",
    )
    meter.create_observable_counter(
        sc.METRIC_DROPPED_POINTS,
        callbacks=[observer(METRIC_POINTS)],
        unit="{data_point}",
        description="Metric data points the export pipeline lost, by reason (export_failed or what the "
        "collector answered: export_not_found, ...)",
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
