"""A finished request's timeline -> its spans, with explicit start/end times, events and attributes.

Built once per request when it finishes (docs/lifecycle.md, "The trace"):

    llm.request [A, E]
    ├─ llm.admission [A, Q]        only when A < Q (an API server's parsing, tokenizing, admission)
    ├─ llm.queue [Q, S1 | E]
    ├─ llm.prefill [S1, F | E]     ── llm.preempted [P_k, R_k | E], llm.recompute [R_k, T_k | E] before F
    └─ llm.decode [F, E]           ── the same pair for each preemption after F

A disaggregated request (README, "Disaggregated prefill and decode") has one ``llm.request``, emitted by
the decode instance, with each instance's part below it: ``llm.instance.prefill`` [A, K_p] (admission,
queue, prefill, ``llm.kv_transfer`` [F, K_p]), emitted by the prefill instance when it hands the request
off, and ``llm.instance.decode`` [Q_d, E] (``llm.kv_transfer`` [Q_d, K_d], queue [K_d, S1_d], decode
[S1_d, E] with every preemption of that instance).

A request preempted more than ``MAX_PREEMPTION_SPANS`` times gets spans and events for the first ones
only; the rest are summarised on ``llm.request`` (how many, and the time they spent evicted and
recomputing), so a thrashing request costs a bounded number of spans on the thread that finishes it.

At trace detail ``request`` only ``llm.request`` is built; at ``steps`` the engine steps the request ran
in are added under its phases (``otel_llm.steps``).

Monotonic seconds become wall-clock nanoseconds through the tracker's clock (``otel_llm.clock``).

One walk of the tree (``_children``) emits through either of two emitters with the same calls in the
same order: ``_ApiSpans`` (``tracer.start_span()``, any provider) or, on an SDK provider whose set-up
allows it, ``otel_llm.sdk_spans.RequestSpans`` (the SDK's ReadableSpans straight to its processors).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)

from otel_llm import semconv as sc
from otel_llm._version import __version__
from otel_llm.clock import Clock
from otel_llm.handoff import remote_request_context
from otel_llm.identity import TraceIdentity, parent_span_context, replay, request_kind
from otel_llm.recompute import span_attributes as recompute_attributes
from otel_llm.records import MAX_PREEMPTION_SPANS, describe, request_events
from otel_llm.steps import DETAIL_PHASES, DETAIL_REQUEST, MAX_STEP_SPANS, StepRecord, longest, step_attributes
from otel_llm.timeline import FinishedRequest, Timeline

__all__ = ["MAX_PREEMPTION_SPANS", "SpanBuilder"]

if TYPE_CHECKING:
    from otel_llm.sdk_spans import SdkSpans

_set_span_in_context = trace.set_span_in_context


def sdk_spans() -> Any:
    """``otel_llm.sdk_spans``, imported once a tracer is the SDK's (the SDK is loaded then): importing
    otel_llm loads no SDK module."""
    from otel_llm import sdk_spans as module

    return module


class SpanBuilder:
    """Emits the spans of finished requests through one tracer."""

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None,
        base_attributes: dict[str, Any],
        clock: Clock,
        detail: str = DETAIL_PHASES,
    ) -> None:
        self.detail = detail
        provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
        self.identity = TraceIdentity(provider.get_tracer("otel_llm", __version__))
        self._base = dict(base_attributes)
        self.wall_ns = clock.wall_ns  # monotonic seconds -> wall-clock ns, the tracker's one offset
        self._resolved: Any = None
        self._direct: SdkSpans | None = None

    def _real_tracer(self) -> Any:
        """The tracer the spans go through now, and the direct path for it when there is one."""
        tracer = self.identity.tracer()
        if tracer is not self._resolved:
            self._resolved = tracer
            ids, sampler = self.identity.ids, self.identity.sampler
            self._direct = None
            if ids is not None and sampler is not None:
                self._direct = sdk_spans().for_tracer(tracer, sampler.inner, ids.inner)
        return tracer

    def build(
        self,
        fin: FinishedRequest,
        root_attributes: dict[str, Any],
        before_end: Callable[[Span, FinishedRequest], None] | None = None,
        steps: list[tuple[float, StepRecord]] | None = None,
    ) -> Any:
        """The request's spans; returns the span whose context the metrics' exemplars point at
        (``llm.request``, or ``llm.instance.prefill`` for a request handed off to a decode instance).
        ``steps``: (span start, step) of the engine steps it ran in, for the ``steps`` detail level
        (None otherwise). On an SDK tracer provider the spans go straight to its processors
        (``otel_llm.sdk_spans``), elsewhere through the tracer."""
        tracer = self._real_tracer()
        direct = self._direct
        if direct is not None and direct.ready():
            built = self._build_direct(direct, fin, root_attributes, before_end, steps)
            if built is not None:
                return built
        return self._build_api(tracer, fin, root_attributes, before_end, steps)

    def _root(self, tl: Timeline, fin: FinishedRequest, attributes: dict[str, Any]) -> tuple[Any, ...]:
        """(name, parent context, kind, preset ids) of the request's top span on this instance."""
        if fin.handed_off:
            # The decode instance emits llm.request (it knows its end); this instance's part is a child.
            parent = remote_request_context(tl.trace_id, tl.span_id, self.identity.sampled(tl, attributes))
            return sc.SPAN_INSTANCE_PREFILL, parent, SpanKind.SERVER, False
        return sc.SPAN_REQUEST, tl.parent, request_kind(tl), True

    def _build_api(
        self,
        tracer: Any,
        fin: FinishedRequest,
        root_attributes: dict[str, Any],
        before_end: Callable[[Span, FinishedRequest], None] | None,
        steps: list[tuple[float, StepRecord]] | None,
    ) -> Span:
        tl = fin.timeline
        name, parent, kind, preset = self._root(tl, fin, root_attributes)
        root = self._start_decided(tracer, tl, name, parent, kind, root_attributes, tl.arrival, preset)
        if not root.is_recording():
            return root
        self._finish_tree(_ApiSpans(tracer), root, fin, steps)
        if before_end is not None:
            before_end(root, fin)
        root.end(end_time=self.wall_ns(fin.finished))
        return root

    def _build_direct(
        self,
        direct: SdkSpans,
        fin: FinishedRequest,
        root_attributes: dict[str, Any],
        before_end: Callable[[Span, FinishedRequest], None] | None,
        steps: list[tuple[float, StepRecord]] | None,
    ) -> Any:
        """The spans ``_build_api`` makes, as ReadableSpans given to the processors; None when this
        request's spans need the tracer (descendants that would not all be recorded)."""
        tl = fin.timeline
        name, parent, kind, preset = self._root(tl, fin, root_attributes)
        self.identity.decide(tl, root_attributes)
        result = replay(tl.sampling, root_attributes)
        parent_span = parent_span_context(parent)
        span_id = tl.span_id if preset else direct.new_span_id()
        flags = self.identity.flags(parent_span, result.decision.is_sampled())
        context = SpanContext(tl.trace_id, span_id, False, TraceFlags(flags), result.trace_state)
        if not result.decision.is_recording():
            return NonRecordingSpan(context)
        emit = direct.request(context, self.detail != DETAIL_REQUEST)
        if emit is None:
            return None
        root = sdk_spans().Open(
            name, context, parent_span, kind, dict(result.attributes), self.wall_ns(tl.arrival)
        )
        self._finish_tree(emit, root, fin, steps)
        end = self.wall_ns(fin.finished)
        if before_end is None:
            return emit.end(root, end)
        live = emit.live(root, parent)
        before_end(live, fin)
        live.end(end_time=end)
        return live

    def _finish_tree(
        self, emit: Any, root: Any, fin: FinishedRequest, steps: list[tuple[float, StepRecord]] | None
    ) -> None:
        """Everything under and on ``root`` but its end: children, the request's events, the status."""
        ns = self.wall_ns
        top = _children(emit, ns, root, fin, steps) if self.detail != DETAIL_REQUEST else root
        add_event = emit.add_event
        for name, attributes, at in request_events(fin.timeline, fin):
            add_event(top, name, attributes, ns(at))
        if fin.reason in sc.FAILED_REASONS:
            emit.set_status(root, Status(StatusCode.ERROR, describe(fin)))
        if top is not root:
            emit.end(top, ns(fin.finished))

    def _start_decided(
        self,
        tracer: Any,
        tl: Timeline,
        name: str,
        parent: Any,
        kind: SpanKind,
        attributes: dict[str, Any],
        at: float,
        preset_ids: bool = False,
    ) -> Span:
        """Start a span with the request's one sampling decision (and its preset ids when asked)."""
        ids, sampler = self.identity.ids, self.identity.sampler
        if ids is not None and sampler is not None:
            if preset_ids:
                ids.preset(tl.trace_id, tl.span_id)
            self.identity.decide(tl, attributes)
            sampler.preset(replay(tl.sampling, attributes))
        try:
            return tracer.start_span(
                name, context=parent, kind=kind, attributes=attributes, start_time=self.wall_ns(at)
            )
        finally:
            if ids is not None and sampler is not None:
                ids.clear()
                sampler.clear()


class _ApiSpans:
    """The emitter ``_children`` walks a trace with, through ``tracer.start_span()`` (any provider)."""

    __slots__ = ("_start",)

    def __init__(self, tracer: Any) -> None:
        self._start = tracer.start_span

    under = staticmethod(_set_span_in_context)

    def start(self, name: str, parent: Any, t0: int, attributes: Any = None) -> Span:
        return self._start(name, context=parent, start_time=t0, attributes=attributes)

    def child(self, name: str, parent: Any, t0: int, t1: int, attributes: Any = None) -> None:
        self._start(name, context=parent, start_time=t0, attributes=attributes).end(end_time=t1)

    @staticmethod
    def end(span: Span, t1: int) -> None:
        span.end(end_time=t1)

    @staticmethod
    def set_attribute(span: Span, key: str, value: Any) -> None:
        span.set_attribute(key, value)

    @staticmethod
    def add_event(span: Span, name: str, attributes: Any, at: int) -> None:
        span.add_event(name, attributes, timestamp=at)

    @staticmethod
    def set_status(span: Span, status: Status) -> None:
        span.set_status(status)


def _children(
    emit: Any,
    ns: Callable[[float], int],
    root: Any,
    fin: FinishedRequest,
    steps: list[tuple[float, StepRecord]] | None,
) -> Any:
    """The instance, phase and preemption spans under ``root`` (and the step spans, given ``steps``),
    through ``emit`` (``_ApiSpans`` or ``otel_llm.sdk_spans.RequestSpans``: the same calls, in the same
    order, so both draw span ids alike); returns the span the request's events belong on (the decode
    instance's span, or ``root``). ``ns``: monotonic seconds -> wall-clock ns."""
    tl = fin.timeline
    end = fin.finished
    start, child, under = emit.start, emit.child, emit.under
    top, top_ctx = root, under(root)
    if tl.handed_in:
        top = start(sc.SPAN_INSTANCE_DECODE, top_ctx, ns(tl.queued), {sc.LLM_ROLE: sc.ROLE_DECODE})
        top_ctx = under(top)
    s1, first = tl.first_scheduled, tl.first_token
    kv_attrs = {sc.LLM_KV_TRANSFER_BYTES: tl.kv_bytes} if tl.kv_bytes is not None else None
    prefill = decode = None
    if tl.handed_in:
        # Decode instance: [Q, K] the KV arriving, [K, S1] waiting to be scheduled, [S1, E] decoding.
        ready = tl.queued
        if tl.kv_done is not None:
            ready = tl.kv_done
            child(sc.SPAN_KV_TRANSFER, top_ctx, ns(tl.queued), ns(ready), kv_attrs)
        child(sc.SPAN_QUEUE, top_ctx, ns(ready), ns(s1 if s1 is not None else end))
        if s1 is not None:
            decode = prefill = start(sc.SPAN_DECODE, top_ctx, ns(s1))
    else:
        if tl.arrival < tl.queued:  # the API server's part: not queue time, but in TTFT and e2e
            child(sc.SPAN_ADMISSION, top_ctx, ns(tl.arrival), ns(tl.queued))
        child(sc.SPAN_QUEUE, top_ctx, ns(tl.queued), ns(s1 if s1 is not None else end))
        if s1 is not None:
            prefill = start(sc.SPAN_PREFILL, top_ctx, ns(s1))
        if first is not None and not fin.handed_off:
            decode = start(sc.SPAN_DECODE, top_ctx, ns(first))
    preemptions = tl.preemptions
    for k, p in enumerate(preemptions[:MAX_PREEMPTION_SPANS]):
        phase = decode if p.after_first_token else prefill
        if phase is not None:
            # A recompute cut short by the next preemption ends there, so the spans never overlap.
            until = preemptions[k + 1].preempted if k + 1 < len(preemptions) else end
            ctx = under(phase)
            resumed = p.rescheduled
            child(sc.SPAN_PREEMPTED, ctx, ns(p.preempted), ns(resumed if resumed is not None else until))
            if resumed is not None:
                recomputed = p.recomputed if p.recomputed is not None else until
                child(sc.SPAN_RECOMPUTE, ctx, ns(resumed), ns(recomputed), recompute_attributes(p))
    if steps is not None:
        emit.set_attribute(root, sc.LLM_STEPS, len(steps))
        emit.set_attribute(root, sc.LLM_STEPS_UNSPANNED, max(0, len(steps) - MAX_STEP_SPANS))
        prefill_ctx = under(prefill) if prefill is not None else top_ctx
        decode_ctx = under(decode) if decode is not None else top_ctx
        for t0, record in longest(steps, MAX_STEP_SPANS):
            ctx = prefill_ctx if first is None or record.ts <= first else decode_ctx
            child(sc.SPAN_ENGINE_STEP, ctx, ns(t0), ns(record.ts), step_attributes(record))
    if prefill is not None and prefill is not decode:
        emit.end(prefill, ns(first if first is not None else end))
    if decode is not None:
        emit.end(decode, ns(end))
    if fin.handed_off:  # [F, K]: the KV cache held after the first token until it was sent
        child(
            sc.SPAN_KV_TRANSFER, top_ctx, ns(first if first is not None else tl.last_event), ns(end), kv_attrs
        )
    return top
