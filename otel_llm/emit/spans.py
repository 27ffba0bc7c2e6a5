"""A finished request's record -> its spans, with explicit start/end times, events and attributes.

Built once per request when it finishes (docs/lifecycle.md, "The trace"):

    llm.request [A, E]
    ├─ llm.admission [A, Q]        only when A < Q (an API server's parsing, tokenizing, admission)
    ├─ llm.queue [Q, S1 | E]
    ├─ llm.prefill [S1, F | E]     ── llm.preempted [P_k, R_k | E], llm.recompute [R_k, T_k | E] before F
    └─ llm.decode [F, E]           ── the same pair for each preemption after F

A disaggregated request (docs/disaggregated.md) has one ``llm.request``, emitted by
the decode instance, with each instance's part below it: ``llm.instance.prefill`` [A, K_p] (admission,
queue, prefill, ``llm.kv_transfer`` [F, K_p]), emitted by the prefill instance when it hands the request
off, and ``llm.instance.decode`` [Q_d, E] (``llm.kv_transfer`` [Q_d, K_d], queue [K_d, S1_d], decode
[S1_d, E] with every preemption of that instance).

A request preempted more than ``MAX_PREEMPTION_SPANS`` times gets spans and events for the first ones
only; the rest are summarised on ``llm.request`` (how many, and the time they spent evicted and
recomputing), so a thrashing request costs a bounded number of spans on the thread that finishes it.

At trace detail ``request`` only ``llm.request`` is built; at ``steps`` the engine steps the request ran
in are added under its phases (``otel_llm.hooks.steps``, ``otel_llm.emit.steps``).

Monotonic seconds become wall-clock nanoseconds through the producing tracker's clock offset
(``otel_llm.record.TrackerInfo``).

One walk of the tree (``_children``) emits through either of two emitters with the same calls in the
same order: ``_ApiSpans`` (``tracer.start_span()``, any provider) or, on an SDK provider whose set-up
allows it, ``otel_llm.emit.sdk_spans.RequestSpans`` (the SDK's ReadableSpans straight to its processors).
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
from otel_llm.emit.preset import (
    TracerView,
    flags,
    parent_context,
    replay,
    request_kind,
    trace_state,
)
from otel_llm.emit.recompute import span_attributes as recompute_attributes
from otel_llm.emit.span_data import request_events
from otel_llm.emit.stalls import stall_events
from otel_llm.emit.steps import step_attributes, step_links
from otel_llm.record import (
    DETAIL_PHASES,
    DETAIL_REQUEST,
    DROP,
    MAX_PREEMPTION_SPANS,
    MAX_STEP_SPANS,
    PREEMPTION_PREEMPTED,
    RECORD_AND_SAMPLE,
    STEP_START,
    STEP_TOKENS_AT,
    RequestRecord,
)

__all__ = ["SpanBuilder"]

if TYPE_CHECKING:
    from otel_llm.emit.sdk_spans import SdkSpans

_set_span_in_context = trace.set_span_in_context


def sdk_spans() -> Any:
    """``otel_llm.emit.sdk_spans``, imported once a tracer is the SDK's (the SDK is loaded then):
    importing otel_llm loads no SDK module."""
    from otel_llm.emit import sdk_spans as module

    return module


class SpanBuilder:
    """Emits the spans of finished requests through one tracer."""

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None,
        wall_ns: Callable[[float], int],
        detail: str = DETAIL_PHASES,
    ) -> None:
        """``wall_ns``: monotonic seconds of the producing tracker -> wall-clock ns (its one offset)."""
        self.detail = detail
        provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
        self.view = TracerView(provider.get_tracer("otel_llm", __version__))
        self.wall_ns = wall_ns
        self._resolved: Any = None
        self._direct: SdkSpans | None = None

    def _real_tracer(self) -> Any:
        """The tracer the spans go through now, and the direct path for it when there is one."""
        tracer = self.view.tracer()
        if tracer is not self._resolved:
            self._resolved = tracer
            ids, sampler = self.view.ids, self.view.sampler
            self._direct = None
            if ids is not None and sampler is not None:
                self._direct = sdk_spans().for_tracer(tracer, sampler.inner, ids.inner)
        return tracer

    def build(
        self,
        rec: RequestRecord,
        root_attributes: dict[str, Any],
        before_end: Callable[[Span, RequestRecord], None] | None = None,
    ) -> Any:
        """The request's spans; returns the span whose context the metrics' exemplars point at
        (``llm.request``, or ``llm.instance.prefill`` for a request handed off to a decode instance).
        On an SDK tracer provider the spans go straight to its processors
        (``otel_llm.emit.sdk_spans``), elsewhere through the tracer."""
        tracer = self._real_tracer()
        direct = self._direct
        if direct is not None and direct.ready():
            built = self._build_direct(direct, rec, root_attributes, before_end)
            if built is not None:
                return built
        return self._build_api(tracer, rec, root_attributes, before_end)

    def _root(self, rec: RequestRecord, attributes: dict[str, Any]) -> tuple[Any, ...]:
        """(name, parent context, kind, preset ids) of the request's top span on this instance."""
        if rec.handed_off:
            # The decode instance emits llm.request (it knows its end); this instance's part is a child.
            sampled = self.view.sampled(rec, attributes)
            context = SpanContext(
                rec.trace_id, rec.span_id, is_remote=True, trace_flags=TraceFlags(0x01 if sampled else 0x00)
            )
            parent = trace.set_span_in_context(NonRecordingSpan(context))
            return sc.SPAN_INSTANCE_PREFILL, parent, SpanKind.SERVER, False
        return sc.SPAN_REQUEST, parent_context(rec.parent), request_kind(rec), True

    def _build_api(
        self,
        tracer: Any,
        rec: RequestRecord,
        root_attributes: dict[str, Any],
        before_end: Callable[[Span, RequestRecord], None] | None,
    ) -> Span:
        name, parent, kind, preset = self._root(rec, root_attributes)
        root = self._start_decided(tracer, rec, name, parent, kind, root_attributes, rec.arrival, preset)
        if not root.is_recording():
            return root
        self._finish_tree(_ApiSpans(tracer), root, rec)
        if before_end is not None:
            before_end(root, rec)
        root.end(end_time=self.wall_ns(rec.finished))
        return root

    def _build_direct(
        self,
        direct: SdkSpans,
        rec: RequestRecord,
        root_attributes: dict[str, Any],
        before_end: Callable[[Span, RequestRecord], None] | None,
    ) -> Any:
        """The spans ``_build_api`` makes, as ReadableSpans given to the processors; None when this
        request's spans need the tracer (descendants that would not all be recorded)."""
        name, parent, kind, preset = self._root(rec, root_attributes)
        decision, added, state = self.view.decide(rec, root_attributes)  # type: ignore[misc]
        parent_of_root = trace.get_current_span(parent).get_span_context() if parent is not None else None
        span_id = rec.span_id if preset else direct.new_span_id()
        sampled = decision == RECORD_AND_SAMPLE
        # llm.request gets the flags the hook side fixed; a handed-off request's part those of a child of
        # llm.request as the decode instance sees it (sampled only).
        trace_flags = flags(rec, sampled) if preset else (0x01 if sampled else 0x00)
        context = SpanContext(rec.trace_id, span_id, False, TraceFlags(trace_flags), trace_state(state))
        if decision == DROP:
            return NonRecordingSpan(context)
        emit = direct.request(context, self.detail != DETAIL_REQUEST)
        if emit is None:
            return None
        attributes = {**root_attributes, **added} if added else dict(root_attributes)
        root = sdk_spans().Open(name, context, parent_of_root, kind, attributes, self.wall_ns(rec.arrival))
        self._finish_tree(emit, root, rec)
        end = self.wall_ns(rec.finished)
        if before_end is None:
            return emit.end(root, end)
        live = emit.live(root, parent)
        before_end(live, rec)
        live.end(end_time=end)
        return live

    def _finish_tree(self, emit: Any, root: Any, rec: RequestRecord) -> None:
        """Everything under and on ``root`` but its end: children, the request's events, the status."""
        ns = self.wall_ns
        top = _children(emit, ns, root, rec) if self.detail != DETAIL_REQUEST else root
        add_event = emit.add_event
        for name, attributes, at in request_events(rec):
            add_event(top, name, attributes, ns(at))
        if self.detail == DETAIL_REQUEST and rec.stalls:  # no llm.decode to put them on
            for name, attributes, at in stall_events(rec):
                add_event(root, name, attributes, ns(at))
        if rec.status_message is not None:
            emit.set_status(root, Status(StatusCode.ERROR, rec.status_message))
        if top is not root:
            emit.end(top, ns(rec.finished))

    def _start_decided(
        self,
        tracer: Any,
        rec: RequestRecord,
        name: str,
        parent: Any,
        kind: SpanKind,
        attributes: dict[str, Any],
        at: float,
        preset_ids: bool = False,
    ) -> Span:
        """Start a span with the request's one sampling decision (and its preset ids when asked)."""
        ids, sampler = self.view.ids, self.view.sampler
        if ids is not None and sampler is not None:
            if preset_ids:
                ids.preset(rec.trace_id, rec.span_id)
            sampler.preset(replay(self.view.decide(rec, attributes), attributes))  # type: ignore[arg-type]
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

    def child(
        self, name: str, parent: Any, t0: int, t1: int, attributes: Any = None, links: Any = None
    ) -> None:
        self._start(name, context=parent, start_time=t0, attributes=attributes, links=links).end(end_time=t1)

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


_UNSET_STATUS = Status(StatusCode.UNSET)


def _cut_short(rec: RequestRecord) -> Status | None:
    """The status for the spans a request was in when it ended, when it was cut short (aborted: UNSET;
    failed: the request's ERROR); None for a request that ended as it should (docs/lifecycle.md)."""
    if rec.reason not in sc.CUT_SHORT_REASONS:
        return None
    if rec.status_message is None:
        return _UNSET_STATUS
    return Status(StatusCode.ERROR, rec.status_message)


def _if(condition: bool, cut: Status | None) -> Status | None:
    return cut if condition else None


def _mark(emit: Any, span: Any, status: Status) -> None:
    """Mark ``span`` as the one its request was in when cut short."""
    emit.set_attribute(span, sc.LLM_CUT_SHORT, True)
    if status.status_code is StatusCode.ERROR:
        emit.set_status(span, status)


def _child(emit: Any, name: str, parent: Any, t0: int, t1: int, attributes: Any, cut: Status | None) -> None:
    """A span that ends at once; one the request was cut short in (``cut`` a status) is marked first.
    Both ways draw one span id, so the two emitters still agree."""
    if cut is None:
        emit.child(name, parent, t0, t1, attributes)
        return
    span = emit.start(name, parent, t0, attributes)
    _mark(emit, span, cut)
    emit.end(span, t1)


def _children(emit: Any, ns: Callable[[float], int], root: Any, rec: RequestRecord) -> Any:
    """The instance, phase and preemption spans under ``root`` (and the step spans, for the ``steps``
    detail level), through ``emit`` (``_ApiSpans`` or ``otel_llm.emit.sdk_spans.RequestSpans``: the same
    calls, in the same order, so both draw span ids alike); returns the span the request's events belong
    on (the decode instance's span, or ``root``). ``ns``: monotonic seconds -> wall-clock ns."""
    end = rec.finished
    start, child, under = emit.start, emit.child, emit.under
    cut = _cut_short(rec)
    top, top_ctx = root, under(root)
    if rec.handed_in:
        top = start(sc.SPAN_INSTANCE_DECODE, top_ctx, ns(rec.queued), {sc.LLM_ROLE: sc.ROLE_DECODE})
        top_ctx = under(top)
    s1, first = rec.first_scheduled, rec.first_token
    kv_attrs = {sc.LLM_KV_TRANSFER_BYTES: rec.kv_bytes} if rec.kv_bytes is not None else None
    prefill = decode = None
    if rec.handed_in:
        # Decode instance: [Q, K] the KV arriving, [K, S1] waiting to be scheduled, [S1, E] decoding.
        ready = rec.queued
        if rec.kv_done is not None:
            ready = rec.kv_done
            child(sc.SPAN_KV_TRANSFER, top_ctx, ns(rec.queued), ns(ready), kv_attrs)
        _child(
            emit,
            sc.SPAN_QUEUE,
            top_ctx,
            ns(ready),
            ns(s1 if s1 is not None else end),
            None,
            _if(s1 is None, cut),
        )
        if s1 is not None:
            decode = prefill = start(sc.SPAN_DECODE, top_ctx, ns(s1))
    else:
        if rec.arrival < rec.queued:  # the API server's part: not queue time, but in TTFT and e2e
            child(sc.SPAN_ADMISSION, top_ctx, ns(rec.arrival), ns(rec.queued))
        queue_end = ns(s1 if s1 is not None else end)
        _child(emit, sc.SPAN_QUEUE, top_ctx, ns(rec.queued), queue_end, None, _if(s1 is None, cut))
        if s1 is not None:
            prefill = start(sc.SPAN_PREFILL, top_ctx, ns(s1))
        if first is not None and not rec.handed_off:
            decode = start(sc.SPAN_DECODE, top_ctx, ns(first))
    preemptions = rec.preemptions
    for k, p in enumerate(preemptions[:MAX_PREEMPTION_SPANS]):
        preempted, _, last_token, resumed, recomputed, _, _ = p
        phase = decode if last_token is not None else prefill  # after the first token: decode's
        if phase is not None:
            # A recompute cut short by the next preemption ends there, so the spans never overlap.
            last = k + 1 == len(preemptions)
            until = end if last else preemptions[k + 1][PREEMPTION_PREEMPTED]
            ctx = under(phase)
            evicted_at_end = _if(last and resumed is None, cut)
            t1 = ns(resumed if resumed is not None else until)
            _child(emit, sc.SPAN_PREEMPTED, ctx, ns(preempted), t1, None, evicted_at_end)
            if resumed is not None:
                _child(
                    emit,
                    sc.SPAN_RECOMPUTE,
                    ctx,
                    ns(resumed),
                    ns(recomputed if recomputed is not None else until),
                    recompute_attributes(p),
                    _if(last and recomputed is None, cut),
                )
    steps = rec.steps
    if steps is not None:
        total, rows = steps
        emit.set_attribute(root, sc.LLM_STEPS, total)
        emit.set_attribute(root, sc.LLM_STEPS_UNSPANNED, max(0, total - MAX_STEP_SPANS))
        prefill_ctx = under(prefill) if prefill is not None else top_ctx
        decode_ctx = under(decode) if decode is not None else top_ctx
        for row in rows:
            t0, ts = row[STEP_START], row[STEP_TOKENS_AT]
            ctx = prefill_ctx if first is None or ts <= first else decode_ctx
            child(sc.SPAN_ENGINE_STEP, ctx, ns(t0), ns(ts), step_attributes(row), step_links(row))
    if prefill is not None and prefill is not decode:
        if first is None and cut is not None:
            _mark(emit, prefill, cut)
        emit.end(prefill, ns(first if first is not None else end))
    if decode is not None:
        if rec.stalls:
            for name, attributes, at in stall_events(rec):
                emit.add_event(decode, name, attributes, ns(at))
        if cut is not None:
            _mark(emit, decode, cut)
        emit.end(decode, ns(end))
    if rec.handed_off:  # [F, K]: the KV cache held after the first token until it was sent
        child(
            sc.SPAN_KV_TRANSFER,
            top_ctx,
            ns(first if first is not None else rec.last_event),
            ns(end),
            kv_attrs,
        )
    return top
