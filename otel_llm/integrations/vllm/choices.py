"""One trace for a request that asked for ``n > 1`` choices.

vLLM runs each choice as its own engine sequence (its own queue, prefill, decode and preemptions), so
each choice keeps its own ``llm.request`` span and its own metric values, as vLLM counts them. What ties
them together is a parent span, ``llm.choices``, from the request's arrival to the end of its last
choice: it carries the id the client saw and the number of choices, and is the child of the caller's
``traceparent`` when there was one. Each ``llm.request`` is then a local child (kind INTERNAL).

Times: the span's start and end are the same monotonic seconds as its children's arrival and finish,
converted to wall-clock nanoseconds with the tracker's own offset, so the children nest exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind

from otel_llm import semconv as sc

_SCOPE = "otel_llm.integrations.vllm"


def wall_offset_ns(tracker: Any) -> int:
    """The tracker's monotonic-to-wall-clock offset (ns), so our spans line up with its spans exactly."""
    return int(tracker.clock.offset_ns)


class Choices:
    """The ``llm.choices`` span of one ``n > 1`` request while its choices run."""

    __slots__ = ("_end", "_offset_ns", "_remaining", "arrival", "context", "span")

    def __init__(
        self,
        tracker: Any,
        arrival: float,
        count: int,
        attributes: Mapping[str, Any],
        carrier: Mapping[str, str] | None,
    ) -> None:
        """``arrival``: monotonic seconds; ``count``: choices that will finish (``n``)."""
        provider = tracker.tracer_provider
        tracer = trace.get_tracer(_SCOPE, tracer_provider=provider)
        parent = propagate.extract(dict(carrier)) if carrier else None
        self._offset_ns = wall_offset_ns(tracker)
        self.span = tracer.start_span(
            sc.SPAN_CHOICES,
            context=parent,
            kind=SpanKind.SERVER,
            attributes=dict(attributes),
            start_time=self._offset_ns + int(arrival * 1e9),
        )
        self.context = trace.set_span_in_context(self.span, otel_context.Context())
        self._remaining = count
        self.arrival = arrival
        self._end = arrival

    def child_finished(self, finished: float) -> bool:
        """One choice finished at ``finished`` (monotonic s); True when it was the last and the span ended."""
        self._remaining -= 1
        self._end = max(self._end, finished)
        if self._remaining > 0:
            return False
        self.span.end(end_time=self._offset_ns + int(self._end * 1e9))
        return True
