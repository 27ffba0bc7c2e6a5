"""The emit side's view of one tracer: its ids and sampler made to serve a request whose ids and
sampling decision were fixed on the hook side (``otel_llm.record.RequestRecord``).

A request's ``llm.request`` span has the trace id and span id drawn at ``queued``, and, when the hook
side asked the sampler before the request ended (``traceparent()``), exactly that decision. On the
tracer's own path (``tracer.start_span()``) the SDK tracer is made to use them:

- ``PresetIds`` wraps the SDK tracer's ``id_generator`` (a public attribute of the SDK ``Tracer``) and
  hands out the preset pair once, on the building thread, otherwise deferring to the original;
- ``PresetSampler`` wraps the tracer's ``sampler`` the same way and replays the request's decision once.

Where the record carries no decision, ``TracerView.decide`` asks the tracer's sampler here, with all of
the request span's attributes (the sampler is asked once per request either way). A decision in the
record's plain form (``otel_llm.record.Sampling``) becomes the SDK's ``SamplingResult`` in ``replay``.
"""

from __future__ import annotations

import threading
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, ProxyTracer, SpanContext, SpanKind, TraceFlags, TraceState

from otel_llm import semconv as sc
from otel_llm.record import RECORD_AND_SAMPLE, RECORD_ONLY, Parent, RequestRecord, Sampling

# W3C Trace Context level 2's "random trace id" flag. SDKs whose API has no such constant never set it
# on their spans.
RANDOM_TRACE_ID_FLAG = int(getattr(TraceFlags, "RANDOM_TRACE_ID", 0))


class PresetIds:
    """An IdGenerator that returns a preset trace id / span id once, then defers to ``inner``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._local = threading.local()

    def preset(self, trace_id: int, span_id: int) -> None:
        self._local.trace_id = trace_id
        self._local.span_id = span_id

    def clear(self) -> None:
        self._local.trace_id = self._local.span_id = None

    def generate_trace_id(self) -> int:
        trace_id = getattr(self._local, "trace_id", None)
        if trace_id is None:
            return self.inner.generate_trace_id()
        self._local.trace_id = None
        return trace_id

    def generate_span_id(self) -> int:
        span_id = getattr(self._local, "span_id", None)
        if span_id is None:
            return self.inner.generate_span_id()
        self._local.span_id = None
        return span_id

    def is_trace_id_random(self) -> bool:
        probe = getattr(self.inner, "is_trace_id_random", None)  # absent from older SDKs' generators
        return bool(probe()) if probe is not None else False


class PresetSampler:
    """A Sampler that replays a preset ``SamplingResult`` once, on this thread, then defers to ``inner``.

    The tracer calls ``should_sample`` when the root span is started; replaying the decision taken for
    ``traceparent()`` keeps the sampler to one call per request and the exported flags equal to the
    ones the client was given.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._local = threading.local()

    def preset(self, result: Any) -> None:
        self._local.result = result

    def clear(self) -> None:
        self._local.result = None

    def should_sample(self, *args: Any, **kwargs: Any) -> Any:
        result = getattr(self._local, "result", None)
        if result is None:
            return self.inner.should_sample(*args, **kwargs)
        self._local.result = None
        return result

    def get_description(self) -> str:
        return self.inner.get_description()


class TracerView:
    """One tracer as the emit side uses it: the SDK tracer behind a proxy, with ``PresetIds`` /
    ``PresetSampler`` installed once (``ids`` / ``sampler``: None on a tracer that is not the SDK's)."""

    def __init__(self, tracer: Any) -> None:
        self._tracer = tracer
        self._proxy = isinstance(tracer, ProxyTracer)  # asked once: an ABC's isinstance() is slow
        self._resolved: Any = None
        self.ids: PresetIds | None = None
        self.sampler: PresetSampler | None = None
        # The decision taken here for the record whose spans this thread is building (records are
        # immutable, and two threads may finish requests at once).
        self._local = threading.local()

    def tracer(self) -> Any:
        """The SDK tracer behind a proxy, with PresetIds / PresetSampler installed once."""
        tracer = self._tracer._tracer if self._proxy else self._tracer
        if tracer is not self._resolved:
            self._resolved = tracer
            generator = getattr(tracer, "id_generator", None)
            sampler = getattr(tracer, "sampler", None)
            if generator is None or sampler is None:
                self.ids = self.sampler = None
            else:
                if not isinstance(generator, PresetIds):
                    generator = tracer.id_generator = PresetIds(generator)
                if not isinstance(sampler, PresetSampler):
                    sampler = tracer.sampler = PresetSampler(sampler)
                self.ids, self.sampler = generator, sampler
        return tracer

    def decide(self, rec: RequestRecord, attributes: dict[str, Any]) -> Sampling | None:
        """The request span's decision: the record's, else this tracer's sampler asked now with the
        span's full ``attributes`` (once per record: the answer is kept for the record being built).
        None: no SDK sampler here (the tracer decides as it starts the span)."""
        if rec.sampling is not None or self.sampler is None:
            return rec.sampling
        decided = getattr(self._local, "decided", None)
        if decided is not None and decided[0] is rec:
            return decided[1]
        result = self.sampler.inner.should_sample(
            parent_context(rec.parent), rec.trace_id, sc.SPAN_REQUEST, request_kind(rec), attributes
        )
        added = {k: v for k, v in (result.attributes or {}).items() if k not in attributes}
        state = result.trace_state
        pairs = tuple(state.items()) if state else None
        sampling = (int(result.decision.value), added or None, pairs)
        self._local.decided = (rec, sampling)
        return sampling

    def sampled(self, rec: RequestRecord, attributes: dict[str, Any]) -> bool:
        """Whether the request's trace is sampled (its parent's flag where no SDK sampler decides)."""
        decided = self.decide(rec, attributes)
        if decided is not None:
            return decided[0] == RECORD_AND_SAMPLE
        return rec.parent is None or bool(rec.parent[2] & 0x01)


def flags(rec: RequestRecord, sampled: bool) -> int:
    """The trace flags of the request span: sampled, and W3C's random-trace-id flag where it applies."""
    value = 0x01 if sampled else 0x00
    return value | RANDOM_TRACE_ID_FLAG if rec.random_trace_id else value


def trace_state(pairs: Any) -> TraceState | None:
    """A record's trace state ((key, value) pairs) as the API's ``TraceState``; None for none."""
    return TraceState(list(pairs)) if pairs else None


def parent_span(parent: Parent | None) -> SpanContext | None:
    """A record's parent as a ``SpanContext``."""
    if parent is None:
        return None
    trace_id, span_id, trace_flags, remote, state = parent
    return SpanContext(trace_id, span_id, remote, TraceFlags(trace_flags), trace_state(state))


def parent_context(parent: Parent | None) -> Context | None:
    """A record's parent as the context a tracer takes (None: a new trace)."""
    span = parent_span(parent)
    return None if span is None else trace.set_span_in_context(NonRecordingSpan(span))


def request_kind(rec: RequestRecord) -> SpanKind:
    """A request served for a caller in another process is a SERVER span; under a local span it is one
    step of that span's work (INTERNAL)."""
    parent = rec.parent
    return SpanKind.INTERNAL if parent is not None and not parent[3] else SpanKind.SERVER


def replay(decided: Sampling, attributes: dict[str, Any]) -> Any:
    """The decision in the record's form as the SDK's ``SamplingResult``, carrying the span's full
    attributes (the SDK starts the span with the result's) plus those the sampler added itself."""
    from opentelemetry.sdk.trace.sampling import Decision, SamplingResult  # an SDK tracer: loaded

    decision, added, state = decided
    kind = (
        Decision.RECORD_AND_SAMPLE
        if decision == RECORD_AND_SAMPLE
        else Decision.RECORD_ONLY
        if decision == RECORD_ONLY
        else Decision.DROP
    )
    return SamplingResult(kind, {**attributes, **added} if added else dict(attributes), trace_state(state))
