"""A request's trace identity, fixed at ``queued`` so ``traceparent()`` works while the request runs.

Spans are built only when a request finishes, but a client may want the trace id at once. So the root
span's trace id and span id are drawn at ``queued``, from the tracer provider's own ``id_generator``
(X-Ray and other custom generators included), and when the spans are built the SDK tracer is made to use
exactly those ids and exactly one sampling decision:

- ``PresetIds`` wraps the SDK tracer's ``id_generator`` (a public attribute of the SDK ``Tracer``) and
  hands out the preset pair once, on the building thread, otherwise deferring to the original;
- ``PresetSampler`` wraps the tracer's ``sampler`` the same way: the request's sampler decision is taken
  once (by ``traceparent()`` or at build time, whichever comes first) and replayed for the root span.

Parents come from a W3C carrier (remote) or the caller's active span (local). ``TraceIdentity`` holds
a tracker's decisions (ids, the one sampling decision, the request span's flags); ``parse_traceparent``
is the one reader of otel_llm's own carriers.
"""

from __future__ import annotations

import logging
import os
import random
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import ProxyTracer, SpanContext, SpanKind, TraceFlags

from otel_llm import semconv as sc

if TYPE_CHECKING:
    from otel_llm.timeline import Timeline

_log = logging.getLogger(__name__)

_TRACEPARENT_VERSION = "00"


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
    if trace.get_current_span(current).get_span_context().is_valid:
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
    sampling decision, and the flags its request span gets (for ``traceparent()`` and the spans alike).

    ``ids`` / ``sampler``: the SDK tracer's id generator and sampler, wrapped once by ``PresetIds`` /
    ``PresetSampler``; None on a tracer that has neither (not the SDK's)."""

    def __init__(self, tracer: Any) -> None:
        self._tracer = tracer
        self._resolved: Any = None
        self.ids: PresetIds | None = None
        self.sampler: PresetSampler | None = None

    def tracer(self) -> Any:
        """The SDK tracer behind a proxy, with PresetIds / PresetSampler installed once."""
        tracer = self._tracer._tracer if isinstance(self._tracer, ProxyTracer) else self._tracer
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

    def new_ids(self, parent: SpanContext | None) -> tuple[int, int]:
        """(trace id, span id) of a new request span, from the tracer provider's id generator."""
        self.tracer()
        ids = self.ids
        if ids is None:
            return (parent.trace_id if parent is not None else new_trace_id()), new_span_id()
        trace_id = parent.trace_id if parent is not None else ids.inner.generate_trace_id()
        return trace_id, ids.inner.generate_span_id()

    def decide(self, tl: Timeline, attributes: dict[str, Any]) -> Any:
        """The sampler's result for the request span, asked once per request (None: no SDK sampler).

        Kept with the attribute names the sampler saw, so a replay can tell the ones it added."""
        if tl.sampling is None and self.sampler is not None:
            result = self.sampler.inner.should_sample(
                tl.parent, tl.trace_id, sc.SPAN_REQUEST, request_kind(tl), attributes
            )
            tl.sampling = (result, frozenset(attributes))
        return tl.sampling[0] if tl.sampling is not None else None

    def sampled(self, tl: Timeline, attributes: dict[str, Any]) -> bool:
        """Whether the request's trace is sampled (its parent's flag where no SDK sampler decides)."""
        result = self.decide(tl, attributes)
        if result is not None:
            return bool(result.decision.is_sampled())
        parent = parent_span_context(tl.parent)
        return parent is None or bool(parent.trace_flags.sampled)

    def flags(self, parent: SpanContext | None, sampled: bool) -> int:
        """The trace flags the SDK gives a span under ``parent``: sampled, and W3C's random-trace-id
        flag from the id generator (a new trace) or the parent, where the SDK sets it."""
        flags = 0x01 if sampled else 0x00
        if parent is None:
            random_id = self.ids is not None and self.ids.is_trace_id_random()
        else:
            random_id = bool(getattr(parent.trace_flags, "random_trace_id", False))
        return flags | RANDOM_TRACE_ID_FLAG if random_id else flags

    def traceparent(self, tl: Timeline, attributes: dict[str, Any]) -> str:
        """The W3C traceparent of the request's root span, with the flags the SDK gives that span.
        ``attributes``: those known so far."""
        self.tracer()
        parent = parent_span_context(tl.parent)
        result = self.decide(tl, attributes)
        if result is not None:
            sampled = result.decision.is_sampled()
        else:
            sampled = bool(parent is not None and parent.trace_flags.sampled)
        return format_traceparent(tl.trace_id, tl.span_id, self.flags(parent, sampled))

    def continue_sampling(self, tl: Timeline, sampled: bool) -> None:
        """Take the sampling decision of a request handed in by a prefill instance, whose sampler
        already decided it (the flag of the carried traceparent): the trace is sampled on both sides
        or on neither, and this instance's sampler is not asked."""
        self.tracer()
        if self.sampler is None:
            return
        from opentelemetry.sdk.trace.sampling import Decision, SamplingResult  # an SDK tracer: loaded

        decision = Decision.RECORD_AND_SAMPLE if sampled else Decision.DROP
        tl.sampling = (SamplingResult(decision, None, None), frozenset())


def request_kind(tl: Timeline) -> SpanKind:
    """A request served for a caller in another process is a SERVER span; under a local span it is one
    step of that span's work (INTERNAL)."""
    parent = parent_span_context(tl.parent)
    return SpanKind.INTERNAL if parent is not None and not parent.is_remote else SpanKind.SERVER


def replay(decided: tuple[Any, frozenset[str]], attributes: dict[str, Any]) -> Any:
    """The decision taken earlier, carrying the root span's full attributes: the SDK starts the span
    with the result's attributes, and a decision taken by traceparent() saw only those known then.
    Attributes the sampler added itself are kept."""
    result, seen = decided
    extra = {k: v for k, v in (result.attributes or {}).items() if k not in seen}
    return type(result)(result.decision, {**attributes, **extra}, result.trace_state)
