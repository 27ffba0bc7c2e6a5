"""A request's trace identity, fixed at ``queued`` so ``traceparent()`` works while the request runs.

Spans are built only when a request finishes (by the emit side, maybe in another process), but a client
may want the trace id at once. So the request span's trace id and span id are drawn at ``queued``, from
the tracer provider's own ``id_generator`` (X-Ray and other custom generators included), and when a
sampling decision is needed before the request ends (``traceparent()``, a hand-off) the provider's
sampler is asked once; the ids and that decision travel in the request's record
(``otel_llm.record.RequestRecord``), so the exported spans carry exactly what the client was given.

Parents come from a W3C carrier (remote) or the caller's active span (local). ``TraceIdentity`` holds
a tracker's decisions (ids, the one sampling decision, the request span's flags); ``parse_traceparent``
is the one reader of otel_llm's own carriers.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import ProxyTracer, SpanContext, SpanKind, TraceFlags

from otel_llm import semconv as sc
from otel_llm.record import DROP, RECORD_AND_SAMPLE, Parent, Sampling

if TYPE_CHECKING:
    from otel_llm.hooks.timeline import Timeline

_log = logging.getLogger(__name__)

_TRACEPARENT_VERSION = "00"
_INVALID_SPAN = trace.INVALID_SPAN


# Ids come from a generator of our own, seeded from the OS, not from the `random` module's shared one:
# engines seed that for reproducible sampling (vLLM calls random.seed(0) by default where its engine core
# runs), which made every such process draw the same trace and span ids, so that two instances of a
# disaggregated pair gave spans of one trace the same id. A forked child reseeds, for the same reason.
_ids = random.Random(int.from_bytes(os.urandom(16), "big"))
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _ids.seed(int.from_bytes(os.urandom(16), "big")))


def random_bits(bits: int) -> int:
    """``bits`` random bits from otel_llm's own generator (unaffected by ``random.seed``)."""
    return _ids.getrandbits(bits)


def new_trace_id() -> int:
    """128 random bits, never zero (W3C: all-zero ids are invalid): the ids of configure()'s provider,
    and of tracers that have no SDK ``id_generator`` (only ``traceparent()`` needs an id there)."""
    return random_bits(128) or 1


def new_span_id() -> int:
    return random_bits(64) or 1


def normalize_carrier(carrier: Any) -> dict[str, str] | None:
    """Header names lower-cased, values made strings; None when nothing usable is in it.

    Clients send header names in any case and frameworks hand over bytes or lists; the W3C propagator
    expects lower-case string keys with string values.
    """
    if carrier is None:
        return None
    items = carrier.items() if isinstance(carrier, Mapping) else carrier
    headers: dict[str, str] = {}
    try:
        for key, value in items:
            if isinstance(key, bytes):
                key = key.decode("latin-1")
            if not isinstance(key, str):
                continue
            if isinstance(value, (list, tuple)):
                value = value[0] if value else ""
            if isinstance(value, bytes):
                value = value.decode("latin-1")
            if isinstance(value, str):
                headers[key.lower()] = value
    except (TypeError, ValueError):  # not a mapping nor pairs: treated as no carrier at all
        return None
    return headers or None


def parent_context(carrier: Any) -> tuple[otel_context.Context | None, bool]:
    """(parent context or None, whether that parent is remote).

    A valid W3C ``traceparent`` in the carrier wins; otherwise the caller's active span, if any;
    otherwise a new trace. A malformed header is ignored, never an error.
    """
    headers = normalize_carrier(carrier)
    if headers:
        try:
            ctx = propagate.extract(headers)
        except Exception:  # a third-party propagator may raise on garbage; the request still runs
            _log.debug("could not extract a parent from the carrier", exc_info=True)
            ctx = None
        if ctx is not None and trace.get_current_span(ctx).get_span_context().is_valid:
            return ctx, True
    current = otel_context.get_current()
    span = trace.get_current_span(current)
    if span is not _INVALID_SPAN and span.get_span_context().is_valid:  # no active span: the usual case
        return current, False
    return None, False


def parent_span_context(parent: otel_context.Context | None) -> SpanContext | None:
    if parent is None:
        return None
    span_context = trace.get_current_span(parent).get_span_context()
    return span_context if span_context.is_valid else None


# W3C Trace Context level 2's "random trace id" flag. SDKs whose API has no such constant never set it
# on their spans, so neither does traceparent() there.
RANDOM_TRACE_ID_FLAG = int(getattr(TraceFlags, "RANDOM_TRACE_ID", 0))


def parse_traceparent(value: str | None) -> tuple[int, int, int] | None:
    """(trace id, span id, flags) of a W3C ``traceparent`` value, or None when it is missing or malformed
    (wrong field sizes, not hex, an all-zero id). The one parser of otel_llm's own carriers; a caller's
    headers go through the configured propagator (``parent_context``)."""
    if not value:
        return None
    parts = value.strip().split("-")
    if len(parts) < 4 or [len(p) for p in parts[:4]] != [2, 32, 16, 2]:
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
    except ValueError:
        return None
    if not trace_id or not span_id:
        return None
    return trace_id, span_id, flags


def format_traceparent(trace_id: int, span_id: int, flags: int) -> str:
    return f"{_TRACEPARENT_VERSION}-{trace_id:032x}-{span_id:016x}-{flags & 0xFF:02x}"


class TraceIdentity:
    """A tracker's trace-identity decisions on its tracer: a request's ids (drawn at ``queued``), its one
    sampling decision when one is needed before the request ends, and the flags its request span gets.

    The SDK tracer's ``id_generator`` and ``sampler`` are public attributes; a tracer that has neither
    (not the SDK's, or the global proxy before a provider is set) gets ids of otel_llm's own and no
    decision here (the emit side's tracer decides when it builds the spans)."""

    def __init__(self, tracer: Any) -> None:
        self._tracer = tracer
        # The API's tracer classes are ABCs, whose isinstance() costs a fifth of a microsecond: asked once.
        self._proxy = isinstance(tracer, ProxyTracer)
        self._resolved: Any = None
        self._generator: Any = None
        self._sampler: Any = None
        self._own_ids = True  # ids from otel_llm's own generator: no generator, or configure()'s
        self._random_ids = False  # the generator marks its trace ids random (W3C level 2)

    def _sdk(self) -> tuple[Any, Any]:
        """(id generator, sampler) of the SDK tracer behind a proxy, or (None, None)."""
        tracer = self._tracer._tracer if self._proxy else self._tracer
        if tracer is not self._resolved:
            self._resolved = tracer
            generator = getattr(tracer, "id_generator", None)
            sampler = getattr(tracer, "sampler", None)
            if generator is None or sampler is None:
                generator = sampler = None
            self._generator, self._sampler = generator, sampler
            # configure()'s generator draws from _ids too: drawn here directly, at a third of the cost.
            self._own_ids = generator is None or bool(getattr(generator, "draws_otel_llm_ids", False))
            probe = getattr(generator, "is_trace_id_random", None)  # absent from older SDKs' generators
            self._random_ids = bool(probe()) if probe is not None else False
        return self._generator, self._sampler

    def new_ids(self, parent: SpanContext | None) -> tuple[int, int]:
        """(trace id, span id) of a new request span, from the tracer provider's id generator."""
        generator, _ = self._sdk()
        if self._own_ids:
            bits = _ids.getrandbits
            return (parent.trace_id if parent is not None else bits(128) or 1), bits(64) or 1
        trace_id = parent.trace_id if parent is not None else generator.generate_trace_id()
        return trace_id, generator.generate_span_id()

    def new_span_id(self, trace_id: int) -> int:
        """A span id for a span of trace ``trace_id`` (an engine step's), from the same generator."""
        generator, _ = self._sdk()
        if self._own_ids:
            return _ids.getrandbits(64) or 1
        return generator.generate_span_id()

    def decide(self, tl: Timeline, attributes: dict[str, Any]) -> Sampling | None:
        """The sampler's decision for the request span, asked once per request (None: no SDK sampler).

        Kept on the timeline in the record's plain form (``otel_llm.record.Sampling``): the decision, the
        attributes the sampler added beyond ``attributes``, and its trace state."""
        if tl.sampling is None:
            _, sampler = self._sdk()
            if sampler is not None:
                result = sampler.should_sample(
                    tl.parent, tl.trace_id, sc.SPAN_REQUEST, request_kind(tl), attributes
                )
                added = {k: v for k, v in (result.attributes or {}).items() if k not in attributes}
                state = result.trace_state
                tl.sampling = (
                    int(result.decision.value),
                    added or None,
                    tuple(state.items()) if state else None,
                )
        return tl.sampling

    def random_trace_id(self, parent: SpanContext | None) -> bool:
        """Whether the request span gets W3C's random-trace-id flag, where the SDK sets it: from the id
        generator for a new trace, from the parent otherwise."""
        if not RANDOM_TRACE_ID_FLAG:
            return False
        if parent is None:
            self._sdk()
            return self._random_ids
        return bool(getattr(parent.trace_flags, "random_trace_id", False))

    def traceparent(self, tl: Timeline, attributes: dict[str, Any]) -> str:
        """The W3C traceparent of the request's root span, with the flags the SDK gives that span.
        ``attributes``: those known so far."""
        parent = parent_span_context(tl.parent)
        decided = self.decide(tl, attributes)
        if decided is not None:
            sampled = decided[0] == RECORD_AND_SAMPLE
        else:
            sampled = bool(parent is not None and parent.trace_flags.sampled)
        flags = 0x01 if sampled else 0x00
        if self.random_trace_id(parent):
            flags |= RANDOM_TRACE_ID_FLAG
        return format_traceparent(tl.trace_id, tl.span_id, flags)

    def continue_sampling(self, tl: Timeline, sampled: bool) -> None:
        """Take the sampling decision of a request handed in by a prefill instance, whose sampler
        already decided it (the flag of the carried traceparent): the trace is sampled on both sides
        or on neither, and this instance's sampler is not asked."""
        _, sampler = self._sdk()
        if sampler is not None:
            tl.sampling = (RECORD_AND_SAMPLE if sampled else DROP, None, None)


def request_kind(tl: Timeline) -> SpanKind:
    """A request served for a caller in another process is a SERVER span; under a local span it is one
    step of that span's work (INTERNAL)."""
    parent = parent_span_context(tl.parent)
    return SpanKind.INTERNAL if parent is not None and not parent.is_remote else SpanKind.SERVER


def plain_parent(parent: SpanContext | None) -> Parent | None:
    """A parent span context in the record's plain form (``otel_llm.record.Parent``)."""
    if parent is None:
        return None
    state = parent.trace_state
    return (
        parent.trace_id,
        parent.span_id,
        int(parent.trace_flags),
        bool(parent.is_remote),
        tuple(state.items()) if state else (),
    )
