"""Finishing a request, in one place: its finished timeline -> its intervals -> keep or drop -> its spans
-> emitted; its metric values from the same intervals.

The tracker's hooks record numbers and hand each finished (or evicted, or handed-off) request here, on
the thread that finished it and outside the tracker's lock. Nothing here raises: telemetry trouble is
counted as an anomaly and logged once, and the engine's call returns as usual.

- ``Intervals``: the request's durations (queue, prefill, decode, TTFT, ...), monotonic seconds;
- ``TailSampler.keep``: whether the trace is kept (metrics count every request either way);
- ``root_attributes`` and ``SpanBuilder.build``: the spans, straight to an SDK provider's processors
  (``otel_llm.sdk_spans``) or through the tracer of any other;
- ``RequestMetrics.record``: the histograms and counters, with the request span as exemplar.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from opentelemetry.trace import Span

from otel_llm import anomalies as an
from otel_llm.clock import Clock
from otel_llm.intervals import Intervals
from otel_llm.metrics import RequestMetrics
from otel_llm.records import error_type, root_attributes
from otel_llm.sampling import TailSampler
from otel_llm.spans import SpanBuilder
from otel_llm.steps import StepLog, of_request
from otel_llm.timeline import FinishedRequest

_log = logging.getLogger("otel_llm")


class Finisher:
    """One tracker's finishing pipeline.

    ``note(kind, request_id)`` counts an anomaly (and logs it once); ``adopt_itl`` is called when the
    metrics move to another provider's recorders; ``lock`` guards ``step_log`` (the tracker's lock,
    renewed in a forked child)."""

    def __init__(
        self,
        spans: SpanBuilder,
        metrics: RequestMetrics,
        clock: Clock,
        base: dict[str, Any],
        tail: TailSampler | None,
        step_log: StepLog | None,
        span_hook: Callable[[Span, FinishedRequest], None] | None,
        lock: threading.Lock,
        note: Callable[[str, Any], None],
        adopt_itl: Callable[[Any], None],
    ) -> None:
        self._spans = spans
        self._metrics = metrics
        self._wall_ns = clock.wall_ns
        self._base = base
        self._tail = tail
        self._step_log = step_log
        self._span_hook = span_hook
        self.lock = lock
        self._note = note
        self._adopt_itl = adopt_itl

    def finish(self, fin: FinishedRequest) -> None:
        """Spans (when kept) and metric values of ``fin``; never raises."""
        try:
            # A tracker made before the global MeterProvider was set moves to it here, before a
            # collection of that provider can miss its histograms (a pointer comparison when settled).
            self._metrics.resolve(self._adopt_itl)
            iv = Intervals(fin)
            err = error_type(fin)
            span = None  # a trace not kept has no span: its metrics carry no exemplar
            if self._tail is None or self._tail.keep(fin, iv):
                span = self._emit(fin, iv, err)
            self._metrics.record(fin, iv, span, err, self._wall_ns(fin.finished))
        except Exception:
            self._note(an.FINISH_FAILED, fin.timeline.request_id)
            _log.debug("otel_llm: finishing request %r failed", fin.timeline.request_id, exc_info=True)

    def _emit(self, fin: FinishedRequest, iv: Intervals, err: str | None) -> Any:
        """The request's spans; the span context its metrics' exemplars point at."""
        steps = None
        if self._step_log is not None:
            with self.lock:
                recent = self._step_log.since(fin.timeline.first_scheduled)
            steps = of_request(fin, recent)
        attrs = root_attributes(fin, iv, self._base, err)
        hook = self._run_span_hook if self._span_hook is not None else None
        return self._spans.build(fin, attrs, hook, steps).get_span_context()

    def _run_span_hook(self, span: Span, fin: FinishedRequest) -> None:
        try:
            self._span_hook(span, fin)  # type: ignore[misc]
        except Exception:  # user code: never let it cost the trace or the engine
            self._note(an.SPAN_HOOK_FAILED, fin.timeline.request_id)
            _log.debug("otel_llm: span_hook raised", exc_info=True)
