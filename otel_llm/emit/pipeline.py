"""The emitter: one tracker's records -> their intervals -> keep or drop -> their spans -> emitted; their
metric values from the same intervals.

``Emitter`` is a ``RecordConsumer`` (``otel_llm.record``): the tracker hands it each finished (or
abandoned, or handed-off) request's record on the thread that finished it, outside the tracker's lock,
and it reads the tracker's figures at collection time. The same code runs in the engine's process
(``export_mode="in_process"``, or a tracker on providers of the user's own) and in the export process
(``otel_llm.export.process``), where a stand-in producer replays what the engine's process sent.

- ``Intervals``: the request's durations (queue, prefill, decode, TTFT, ...), monotonic seconds;
- ``TailSampler.keep``: whether the trace is kept (metrics count every request either way);
- ``root_attributes`` and ``SpanBuilder.build``: the spans, straight to an SDK provider's processors
  (``otel_llm.emit.sdk_spans``) or through the tracer of any other;
- ``RequestMetrics.record``: the histograms and counters, with the request span as exemplar;
- at detail ``steps``, the engine's own step spans (``otel_llm.emit.engine_steps``), in windows the
  producer closed, taken as requests finish and at a flush.

Nothing here raises into the engine: telemetry trouble is counted as the tracker's anomaly
(``Producer.note``) and logged once.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.trace import Span

from otel_llm.emit import engine_metrics, self_metrics
from otel_llm.emit.engine_steps import emit_window
from otel_llm.emit.intervals import Intervals
from otel_llm.emit.metrics import RequestMetrics
from otel_llm.emit.sampling import TailSampler, TailSampling
from otel_llm.emit.span_data import root_attributes
from otel_llm.emit.spans import SpanBuilder
from otel_llm.record import (
    ANOMALY_FINISH_FAILED,
    ANOMALY_SPAN_HOOK_FAILED,
    DETAIL_STEPS,
    Producer,
    RequestRecord,
    StepWindow,
)

_log = logging.getLogger("otel_llm")

# The emitters at detail "steps", for a flush of their provider (weak: a tracker let go leaves it).
_stepping: weakref.WeakSet[Emitter] = weakref.WeakSet()

# ``span_hook(span, record)``: the user's code, called on each llm.request span before it ends.
SpanHook = Callable[[Span, RequestRecord], None]


def close_step_windows(tracer_provider: Any) -> None:
    """Every emitter at detail ``steps`` whose spans go to ``tracer_provider``: take its tracker's
    windows, the open one too (``Telemetry.force_flush`` / ``shutdown`` in process)."""
    for emitter in list(_stepping):
        if (emitter._tracer_provider or trace.get_tracer_provider()) is tracer_provider:
            emitter.take_windows(True)


class Emitter:
    """The spans and metric values of one tracker's records, through ``tracer_provider`` and
    ``meter_provider`` (the global ones when None). ``tail``: tail-sampling settings, None to keep every
    trace; ``span_hook``: see ``RequestTracker``."""

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None,
        meter_provider: metrics.MeterProvider | None,
        tail: TailSampling | None = None,
        span_hook: SpanHook | None = None,
    ) -> None:
        self._tracer_provider = tracer_provider
        self._meter_provider = meter_provider
        self._tail = None if tail is None else TailSampler(tail)
        self._span_hook = span_hook
        self._producer: Producer | None = None
        self._steps = False

    def bind(self, producer: Producer) -> None:
        """Build the spans and metrics for ``producer``'s records (its base attributes, detail level and
        clock), register its figures' instruments, and give it the per-step recorders."""
        info = producer.info
        self._producer = producer
        self._steps = info.detail == DETAIL_STEPS  # the engine's own step spans come in windows
        if self._steps:
            _stepping.add(self)
        self._base = info.base
        self._wall_ns = info.wall_ns
        self._spans = SpanBuilder(self._tracer_provider, info.wall_ns, info.detail)
        self._metrics = RequestMetrics(self._meter_provider, info.base, producer.lock)
        engine_metrics.register(self._metrics, producer.figures)
        self_metrics.register(self._metrics, producer.figures, self._tail, self._resolve)
        with producer.lock:
            producer.use_recorders(self._metrics.itl, self._metrics.step_tokens_recorder)

    @property
    def metrics(self) -> RequestMetrics:
        return self._metrics

    def request(self, rec: RequestRecord) -> None:
        """Spans (when kept) and metric values of ``rec``; never raises."""
        try:
            # A tracker made before the global MeterProvider was set moves to it here, before a
            # collection of that provider can miss its histograms (a pointer comparison when settled).
            self._resolve()
            iv = Intervals(rec)
            span = None  # a trace not kept has no span: its metrics carry no exemplar
            if self._tail is None or self._tail.keep(rec, iv):
                span = self._emit(rec, iv)
            self._metrics.record(rec, iv, span, self._wall_ns(rec.finished))
        except Exception:
            self._note(ANOMALY_FINISH_FAILED, rec.request_id)
            _log.debug("otel_llm: finishing request %r failed", rec.request_id, exc_info=True)
        if self._steps:
            self.take_windows(False)

    def take_windows(self, final: bool) -> None:
        """The engine step windows the producer closed (and the open one when ``final``), as spans."""
        try:
            windows = self._producer.step_windows(final)  # type: ignore[union-attr]
        except Exception:
            _log.debug("otel_llm: taking the engine's step windows failed", exc_info=True)
            return
        for window in windows:
            self.steps(window)

    def steps(self, window: StepWindow) -> None:
        """The spans of one window of the engine's own steps (detail ``steps``); never raises."""
        try:
            emit_window(self._spans.view, self._wall_ns, self._base, window)
        except Exception:
            self._note(ANOMALY_FINISH_FAILED, "engine steps")
            _log.debug("otel_llm: the engine's step spans failed", exc_info=True)

    def would_keep(self, rec: RequestRecord) -> bool:
        """Whether tail sampling would keep ``rec``'s trace (not counted as a decision)."""
        return self._tail is None or self._tail.would_keep(rec, Intervals(rec))

    def flush(self, timeout_millis: int) -> bool:
        """Flush the tracer and meter providers (after settling which meter provider the metrics reach)."""
        self._resolve()
        if self._steps:
            self.take_windows(True)
        ok = True
        for provider in (
            self._tracer_provider or trace.get_tracer_provider(),
            self._meter_provider or metrics.get_meter_provider(),
        ):
            flush = getattr(provider, "force_flush", None)
            if flush is not None:
                ok = bool(flush(timeout_millis)) and ok
        return ok

    def after_fork(self) -> None:
        """A forked child: every recorder gets a fresh lock (the tracker's new one for the per-step ones)."""
        if self._producer is not None:
            self._metrics.renew_lock(self._producer.lock)

    def resolve(self) -> None:
        """Settle which meter provider the metrics reach (the global one may have been set since)."""
        self._metrics.resolve(self._adopt)

    _resolve = resolve

    def _adopt(self, itl: Any, step_tokens: Any) -> None:
        """The metrics moved to another provider's recorders: the hot path follows (lock held)."""
        self._producer.use_recorders(itl, step_tokens)  # type: ignore[union-attr]

    def _emit(self, rec: RequestRecord, iv: Intervals) -> Any:
        """The request's spans; the span context its metrics' exemplars point at."""
        attrs = root_attributes(rec, iv, self._base)
        hook = self._run_span_hook if self._span_hook is not None else None
        return self._spans.build(rec, attrs, hook).get_span_context()

    def _run_span_hook(self, span: Span, rec: RequestRecord) -> None:
        try:
            self._span_hook(span, rec)  # type: ignore[misc]
        except Exception:  # user code: never let it cost the trace or the engine
            self._note(ANOMALY_SPAN_HOOK_FAILED, rec.request_id)
            _log.debug("otel_llm: span_hook raised", exc_info=True)

    def _note(self, kind: str, request_id: Any) -> None:
        if self._producer is not None:
            self._producer.note(kind, request_id)
