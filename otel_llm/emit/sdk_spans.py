"""A finished request's spans handed straight to an SDK TracerProvider's span processors.

otel_llm builds a request's spans once it has finished, with every time known. Through
``tracer.start_span()`` / ``end()`` each span pays for what only a live span needs (the current
context, a sampler call, a lock, a mutable span copied into a ``ReadableSpan`` at its end). Here the
SDK's own ``ReadableSpan`` objects are made directly, as the SDK tracer would make them, and given to
the provider's span processor's ``on_end``:

- sampling is decided once per trace with the provider's own sampler: the request span's decision is the
  one ``traceparent()`` gave (``otel_llm.hooks.identity``); its descendants' is asked once, for a child of it;
- ids come from the provider's id generator, in the order the tracer would draw them;
- attributes and events are bounded by the provider's span limits through the SDK's own
  ``BoundedAttributes`` / ``BoundedList``; resource and instrumentation scope are the tracer's;
- a ``span_hook`` gets a real SDK span for ``llm.request`` (made with the tracer's own arguments).

So the processors and exporters receive the same spans either way (a test compares both paths field by
field). This path is taken only where that holds; otherwise the tracer's own ``start_span()`` is used
(correct, slower), after one warning:

- a span processor with an ``on_start`` of its own (the SDK's batch and simple processors have none):
  it would not see our spans start;
- a sampler other than the SDK's static, trace-id-ratio and parent-based ones (a custom one may decide
  each span by its name or add attributes to it);
- an SDK laid out otherwise than expected. Internals read (present from SDK 1.35 to 1.45, the versions
  tested): ``Tracer._span_limits``, ``Tracer._instrumentation_scope``, the tracer's span class
  ``_Span`` (for a ``span_hook``), the multi span processor's ``_span_processors``, ``ParentBased``'s
  ``_local_parent_sampled`` / ``_local_parent_not_sampled``, ``StaticSampler._decision``, ``Link._attributes``
  (bounded as the SDK's span bounds them); from 1.39
  on, where present, ``Tracer._is_enabled`` and ``Tracer._tracer_metrics`` (the SDK's own span
  metrics: with them on, the tracer's path is taken), and processors' ``_on_ending``.
"""

from __future__ import annotations

import logging
from typing import Any

from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk import trace as sdk_trace
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.sampling import Decision, ParentBased, StaticSampler, TraceIdRatioBased
from opentelemetry.sdk.util import BoundedList
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, TraceFlags

from otel_llm.logs import warn_once

_log = logging.getLogger("otel_llm")

_INTERNAL = SpanKind.INTERNAL
_UNSET = Status()
# on_start implementations known to do nothing.
_NO_OP_ON_START = frozenset(
    {SpanProcessor.on_start, SimpleSpanProcessor.on_start, BatchSpanProcessor.on_start}
)
_NO_OP_ON_ENDING = frozenset(
    {getattr(c, "_on_ending", None) for c in (SpanProcessor, SimpleSpanProcessor, BatchSpanProcessor)}
)  # SDK 1.39 on: called with the live span before it ends; None where the SDK has no such hook
# Samplers whose decision for a span under a local parent depends only on the trace id and the parent's
# flags (not the span's name, kind or attributes), and that add no attributes: one call decides every
# descendant of the request span.
_ALIKE_SAMPLE = frozenset({StaticSampler.should_sample, TraceIdRatioBased.should_sample})
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)


def _decides_children_alike(sampler: Any) -> bool:
    should_sample = getattr(type(sampler), "should_sample", None)
    if should_sample in _ALIKE_SAMPLE:
        return True
    if should_sample is ParentBased.should_sample:
        delegates = [
            getattr(sampler, n, None) for n in ("_local_parent_sampled", "_local_parent_not_sampled")
        ]
        if None in delegates:
            raise AttributeError("ParentBased has no _local_parent_sampled / _local_parent_not_sampled")
        return all(_decides_children_alike(d) for d in delegates)
    return False


def _samples_children_of_sampled(sampler: Any) -> bool:
    """Whether ``sampler`` samples every span under a sampled local parent, as the SDK's default
    ``ParentBased(ALWAYS_ON)`` does (so no call is needed to know it)."""
    if type(sampler).should_sample is not ParentBased.should_sample:
        return False
    delegate = sampler._local_parent_sampled
    return (
        type(delegate).should_sample is StaticSampler.should_sample
        and getattr(delegate, "_decision", None) is Decision.RECORD_AND_SAMPLE
    )


def for_tracer(tracer: Any, sampler: Any, ids: Any) -> SdkSpans | None:
    """The direct path for SDK ``tracer`` (its unwrapped ``sampler`` and id generator ``ids``), or None
    after one warning saying why the tracer's ``start_span()`` is used instead."""
    try:
        if not _decides_children_alike(sampler):
            warn_once(
                f"sdk-spans-sampler-{type(sampler).__qualname__}",
                "otel_llm: spans go through tracer.start_span() (correct, slower): the sampler %r may "
                "decide each span on its own",
                sampler,
            )
            return None
        return SdkSpans(tracer, sampler, ids)
    except Exception as exc:  # an SDK whose internals moved: degrade loudly, never silently
        warn_once(
            "sdk-spans-layout",
            "otel_llm: spans go through tracer.start_span() (correct, slower): this opentelemetry-sdk is "
            "laid out otherwise than expected (%s: %s)",
            type(exc).__name__,
            exc,
        )
        return None


class SdkSpans:
    """What the SDK tracer would give its spans: processor, resource, scope, limits, sampler, ids."""

    def __init__(self, tracer: Any, sampler: Any, ids: Any) -> None:
        self.tracer = tracer
        self.processor = tracer.span_processor
        self._processors = self.processor._span_processors
        self.resource = tracer.resource
        self.info = tracer.instrumentation_info
        self.scope = tracer._instrumentation_scope
        self.limits = limits = tracer._span_limits
        self.max_attributes = limits.max_span_attributes
        self.max_attribute_length = limits.max_span_attribute_length
        self.max_events = limits.max_events
        self.max_event_attributes = limits.max_event_attributes
        self.max_value_length = limits.max_attribute_length
        # No length limit: attribute values are never cut, so valid ones need no second look.
        self.plain = limits.max_span_attribute_length is None and limits.max_attribute_length is None
        # Shared by every span without attributes, events or links: read-only once handed over.
        self.no_attributes = BoundedAttributes(
            self.max_attributes, None, max_value_len=self.max_attribute_length
        )
        self.no_events: BoundedList = BoundedList(self.max_events)
        self.no_links: BoundedList = BoundedList(limits.max_links)
        self.live_span = sdk_trace._Span  # the SDK's Span refuses to be made but by its tracer's class
        self.sampler = sampler
        self.follow_sampled = _samples_children_of_sampled(sampler)
        self.new_span_id = ids.generate_span_id
        self._enabled = getattr(tracer, "_is_enabled", None)  # SDK 1.39 on: a configurator may disable it
        self.usable = self._check_processors() and self._no_self_metrics(tracer)

    def ready(self) -> bool:
        """Whether spans may take this path now: checked again when a processor was added; not for a
        tracer the provider's configurator disabled (the tracer's own path answers that)."""
        enabled = self._enabled
        if enabled is not None and not enabled():
            return False
        if self.processor._span_processors is not self._processors:
            self._processors = self.processor._span_processors
            self.usable = self._check_processors()
        return self.usable

    @staticmethod
    def _no_self_metrics(tracer: Any) -> bool:
        metrics = getattr(tracer, "_tracer_metrics", None)  # SDK 1.39 on, off unless asked for
        if metrics is None or type(metrics).__name__ == "NoOpTracerMetrics":
            return True
        warn_once(
            "sdk-spans-self-metrics",
            "otel_llm: spans go through tracer.start_span() (correct, slower): the SDK's own span metrics "
            "are on (OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED) and count only spans it starts",
        )
        return False

    def _check_processors(self) -> bool:
        for processor in self._processors:
            kind = type(processor)
            if (
                kind.on_start not in _NO_OP_ON_START
                or getattr(kind, "_on_ending", None) not in _NO_OP_ON_ENDING
            ):
                warn_once(
                    f"sdk-spans-on-start-{type(processor).__qualname__}",
                    "otel_llm: spans go through tracer.start_span() (correct, slower): span processor %r "
                    "has an on_start (or _on_ending) of its own",
                    processor,
                )
                return False
        return True

    def request(self, context: SpanContext, children: bool) -> RequestSpans | None:
        """The emitter of one request whose top span has ``context`` (recording), with its descendants'
        sampling decided once (``children``: whether it has any). None when they would not all be
        recorded: the tracer's path then gives each its own decision."""
        if not children or (self.follow_sampled and context.trace_flags.sampled):
            # No descendants, or a sampler known to sample every child of a sampled span: the SDK
            # would give each the root's flags (sampled, random trace id) and trace state.
            return RequestSpans(self, context.trace_id, context.trace_flags, context.trace_state)
        parent = trace.set_span_in_context(NonRecordingSpan(context))
        result = self.sampler.should_sample(parent, context.trace_id, "llm.child", _INTERNAL, None, ())
        if not result.decision.is_recording() or result.attributes:
            return None
        flags = _SAMPLED if result.decision.is_sampled() else _NOT_SAMPLED
        if getattr(context.trace_flags, "random_trace_id", False):  # SDK 1.39 on: a child inherits it
            flags = TraceFlags(flags | TraceFlags.RANDOM_TRACE_ID)
        return RequestSpans(self, context.trace_id, flags, result.trace_state)


class Open:
    """A span of the direct path while its request's spans are built (times in wall-clock ns)."""

    __slots__ = ("attributes", "context", "events", "kind", "name", "parent", "start", "status")

    def __init__(
        self,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        kind: SpanKind,
        attributes: dict[str, Any] | None,
        start: int,
    ) -> None:
        self.name = name
        self.context = context
        self.parent = parent
        self.kind = kind
        self.attributes = attributes
        self.start = start
        self.events: list[tuple[str, Any, int]] | None = None
        self.status = _UNSET


class RequestSpans:
    """One request's spans on the direct path: the emitter ``otel_llm.emit.spans`` walks the trace with."""

    __slots__ = ("_flags", "_sdk", "_state", "_trace_id", "wall_ns")

    def __init__(self, sdk: SdkSpans, trace_id: int, flags: TraceFlags, state: Any) -> None:
        self._sdk = sdk
        self._trace_id = trace_id
        self._flags = flags
        self._state = state

    @staticmethod
    def under(span: Open) -> SpanContext:
        return span.context

    def start(
        self, name: str, parent: SpanContext, t0: int, attributes: dict[str, Any] | None = None
    ) -> Open:
        context = SpanContext(self._trace_id, self._sdk.new_span_id(), False, self._flags, self._state)
        return Open(name, context, parent, _INTERNAL, attributes, t0)

    def child(
        self,
        name: str,
        parent: SpanContext,
        t0: int,
        t1: int,
        attributes: dict[str, Any] | None = None,
        links: list[Any] | None = None,
    ) -> None:
        context = SpanContext(self._trace_id, self._sdk.new_span_id(), False, self._flags, self._state)
        sdk = self._sdk
        sdk.processor.on_end(
            ReadableSpan(
                name,
                context,
                parent,
                sdk.resource,
                sdk.no_attributes if attributes is None else self._attributes(attributes),
                sdk.no_events,
                sdk.no_links if links is None else self._links(links),
                _INTERNAL,
                sdk.info,
                _UNSET,
                t0,
                t1,
                sdk.scope,
            )
        )

    @staticmethod
    def set_attribute(span: Open, key: str, value: Any) -> None:
        attributes = span.attributes
        if attributes is None:
            span.attributes = {key: value}
        else:
            attributes.pop(key, None)  # as BoundedAttributes does: a key set again moves to the end
            attributes[key] = value

    @staticmethod
    def set_status(span: Open, status: Status) -> None:
        span.status = status

    @staticmethod
    def add_event(span: Open, name: str, attributes: Any, at: int) -> None:
        if span.events is None:
            span.events = []
        span.events.append((name, attributes, at))

    def end(self, span: Open, t1: int) -> ReadableSpan:
        sdk = self._sdk
        attributes = span.attributes
        readable = ReadableSpan(
            span.name,
            span.context,
            span.parent,
            sdk.resource,
            sdk.no_attributes if attributes is None else self._attributes(attributes),
            sdk.no_events if span.events is None else self._events(span.events),
            sdk.no_links,
            span.kind,
            sdk.info,
            span.status,
            span.start,
            t1,
            sdk.scope,
        )
        sdk.processor.on_end(readable)
        return readable

    def live(self, span: Open, parent: Any) -> Any:
        """``span`` as a started SDK span, made as the tracer makes one (for a ``span_hook``); the
        caller ends it. ``parent``: the context the tracer would have been given."""
        sdk = self._sdk
        live = sdk.live_span(
            name=span.name,
            context=span.context,
            parent=span.parent,
            sampler=sdk.tracer.sampler,
            resource=sdk.resource,
            attributes=span.attributes,
            span_processor=sdk.processor,
            kind=span.kind,
            links=(),
            instrumentation_info=sdk.info,
            limits=sdk.limits,
            instrumentation_scope=sdk.scope,
        )
        live.start(start_time=span.start, parent_context=parent)
        for name, attributes, at in span.events or ():
            live.add_event(name, attributes, timestamp=at)
        if span.status is not _UNSET:
            live.set_status(span.status)
        return live

    def _attributes(self, attributes: dict[str, Any]) -> Any:
        """The span's attributes as the SDK bounds them. Ours are valid attribute values already (the
        user's were cleaned at ``queued``), so within the limits and with no length limit they are
        kept as they are: what ``BoundedAttributes`` would hold, without checking each value again."""
        sdk = self._sdk
        limit = sdk.max_attributes
        if sdk.plain and (limit is None or len(attributes) <= limit) and "" not in attributes:
            return attributes
        return BoundedAttributes(limit, attributes, immutable=False, max_value_len=sdk.max_attribute_length)

    def _links(self, links: list[Any]) -> Any:
        """The span's links as the SDK's span keeps them: each link's attributes bounded and frozen, at
        most ``max_links``. Ours always have a valid context."""
        limits = self._sdk.limits
        for link in links:
            link._attributes = BoundedAttributes(
                limits.max_link_attributes,
                link.attributes,
                max_value_len=limits.max_attribute_length,
                immutable=True,
            )
        return BoundedList.from_seq(limits.max_links, links)

    def _events(self, events: list[tuple[str, Any, int]]) -> Any:
        sdk = self._sdk
        limit, length = sdk.max_event_attributes, sdk.max_value_length
        if sdk.plain and (sdk.max_events is None or len(events) <= sdk.max_events):
            empty = sdk.no_attributes
            return [
                Event(name, empty if attributes is None else attributes, at)
                if attributes is None or limit is None or len(attributes) <= limit
                else Event(name, BoundedAttributes(limit, attributes, max_value_len=length), at)
                for name, attributes, at in events
            ]
        bounded: BoundedList = BoundedList(sdk.max_events)
        bounded.extend(
            [
                Event(name, BoundedAttributes(limit, attributes, max_value_len=length), at)
                for name, attributes, at in events
            ]
        )
        return bounded
