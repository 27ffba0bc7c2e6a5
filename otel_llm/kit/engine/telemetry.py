"""The engine's own step-level telemetry: gauges of the scheduler's state, per-step histograms, and
optional ``llm.engine.step`` spans linked to the request spans of the sequences they ran.

Per-request telemetry is not here: it goes through the public hook (RequestTracker) like any engine's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import Link, SpanContext, TraceFlags

from otel_llm import semconv
from otel_llm.hooks import identity
from otel_llm.hooks.clock import Clock

if TYPE_CHECKING:
    from otel_llm.kit.engine.scheduler import Scheduler
    from otel_llm.kit.engine.sequence import Sequence as EngineSequence

# Metric names (all prefixed llm.engine.) and their units.
METRIC_KV_BLOCKS_USED = "llm.engine.kv_cache.blocks.used"
METRIC_KV_BLOCKS_TOTAL = "llm.engine.kv_cache.blocks.total"
METRIC_REQUESTS_RUNNING = "llm.engine.requests.running"
METRIC_REQUESTS_WAITING = "llm.engine.requests.waiting"
METRIC_STEP_TOKENS = "llm.engine.step.tokens"  # histogram: tokens fed to the model per step
METRIC_STEP_FORWARD = "llm.engine.step.forward.duration"  # histogram, seconds
METRIC_TOKENS = "llm.engine.tokens"  # counter of tokens fed, attribute llm.engine.phase
UNIT_BLOCK = "{block}"

# Attribute keys and values.
ATTR_PHASE = "llm.engine.phase"
PHASE_PREFILL = "prefill"  # prompt tokens and recomputed tokens after a preemption
PHASE_DECODE = "decode"
ATTR_STEP_INDEX = "llm.engine.step.index"
ATTR_BATCH_SIZE = "llm.engine.batch_size"
ATTR_PREFILL_TOKENS = "llm.engine.prefill_tokens"
ATTR_DECODE_TOKENS = "llm.engine.decode_tokens"
ATTR_FORWARD_TIME = "llm.engine.forward_time"  # seconds
ATTR_PREEMPTED = "llm.engine.preempted_requests"
ATTR_KV_BLOCKS_USED = METRIC_KV_BLOCKS_USED

BUCKETS_STEP_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
BUCKETS_FORWARD = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)

_SCOPE = "otel_llm.engine"


def parse_traceparent(value: str | None) -> SpanContext | None:
    """A remote SpanContext from a W3C ``traceparent`` value, or None if it is missing or malformed."""
    parsed = identity.parse_traceparent(value)
    if parsed is None:
        return None
    trace_id, span_id, flags = parsed
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags))


class EngineTelemetry:
    """Step-level metrics (cheap: three records per step) and, when asked, one span per step."""

    def __init__(
        self,
        scheduler: Scheduler,
        meter_provider: metrics.MeterProvider | None = None,
        tracer_provider: trace.TracerProvider | None = None,
        step_spans: bool = False,
        clock: Clock | None = None,
    ) -> None:
        """``clock``: the tracker's, so step spans line up with its request spans (else one of its own)."""
        self._scheduler = scheduler
        meter = (meter_provider or metrics.get_meter_provider()).get_meter(_SCOPE)
        gauges = (
            (METRIC_KV_BLOCKS_USED, UNIT_BLOCK, lambda s: s.block_manager.num_used_blocks),
            (METRIC_KV_BLOCKS_TOTAL, UNIT_BLOCK, lambda s: s.block_manager.num_blocks),
            (METRIC_REQUESTS_RUNNING, semconv.UNIT_REQUEST, lambda s: len(s.running)),
            (METRIC_REQUESTS_WAITING, semconv.UNIT_REQUEST, lambda s: len(s.waiting)),
        )
        for name, unit, read in gauges:
            meter.create_observable_gauge(name, callbacks=[self._observer(read)], unit=unit)
        self._step_tokens = meter.create_histogram(
            METRIC_STEP_TOKENS,
            unit=semconv.UNIT_TOKEN,
            explicit_bucket_boundaries_advisory=BUCKETS_STEP_TOKENS,
        )
        self._forward = meter.create_histogram(
            METRIC_STEP_FORWARD,
            unit=semconv.UNIT_SECONDS,
            explicit_bucket_boundaries_advisory=BUCKETS_FORWARD,
        )
        self._tokens = meter.create_counter(METRIC_TOKENS, unit=semconv.UNIT_TOKEN)
        self._tracer = (
            (tracer_provider or trace.get_tracer_provider()).get_tracer(_SCOPE) if step_spans else None
        )
        self._wall_ns = (clock or Clock()).wall_ns  # monotonic -> epoch, one offset
        self._step_index = 0

    def _observer(
        self, read: Callable[[Scheduler], int]
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(read(self._scheduler))]

        return callback

    @property
    def step_spans(self) -> bool:
        return self._tracer is not None

    def record_step(
        self,
        seqs: Sequence[EngineSequence],
        prefill_tokens: int,
        decode_tokens: int,
        num_preempted: int,
        forward_s: float,
        start_ts: float,
        end_ts: float,
    ) -> None:
        """One step's facts; ``start_ts``/``end_ts`` are ``time.monotonic()`` seconds."""
        self._step_index += 1
        if seqs:
            self._step_tokens.record(prefill_tokens + decode_tokens)
            self._forward.record(forward_s)
            if prefill_tokens:
                self._tokens.add(prefill_tokens, {ATTR_PHASE: PHASE_PREFILL})
            if decode_tokens:
                self._tokens.add(decode_tokens, {ATTR_PHASE: PHASE_DECODE})
        if self._tracer is None or not (seqs or num_preempted):
            return
        links = [
            Link(seq.trace_link, {semconv.LLM_REQUEST_ID: seq.request_id})
            for seq in seqs
            if isinstance(seq.trace_link, SpanContext)
        ]
        attributes = {
            ATTR_STEP_INDEX: self._step_index,
            ATTR_BATCH_SIZE: len(seqs),
            ATTR_PREFILL_TOKENS: prefill_tokens,
            ATTR_DECODE_TOKENS: decode_tokens,
            ATTR_FORWARD_TIME: forward_s,
            ATTR_PREEMPTED: num_preempted,
            ATTR_KV_BLOCKS_USED: self._scheduler.block_manager.num_used_blocks,
        }
        span = self._tracer.start_span(
            semconv.SPAN_ENGINE_STEP,
            context=trace.set_span_in_context(trace.INVALID_SPAN),  # a root: each step is its own trace
            links=links,
            attributes=attributes,
            start_time=self._wall_ns(start_ts),
        )
        span.end(end_time=self._wall_ns(end_ts))
