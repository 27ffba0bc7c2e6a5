"""``RequestTracker``: the hook side's tracker (``otel_llm.hooks``) wired to what consumes its records.

This module is where the two halves meet, and the only one: the tracker records numbers and hands
each finished request's record (``otel_llm.record``) to a consumer chosen here:

- the export process's feed (``otel_llm.export.channel``), when the tracker is on the providers of a
  ``configure()`` whose export mode is ``process`` (or the global ones, when that ``configure()`` set
  them) and has no ``span_hook``: spans and metric values are then built and exported beside the
  engine, in a child process;
- an ``otel_llm.emit.pipeline.Emitter`` in this process otherwise: providers of the user's own, a
  ``span_hook`` (it needs the live span), or ``export_mode="in_process"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import metrics, trace

from otel_llm import semconv as sc
from otel_llm.emit.pipeline import Emitter, SpanHook
from otel_llm.emit.sampling import TailSampling, resolve_tail
from otel_llm.hooks.options import (
    DEFAULT_MAX_AGE_S,
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_OPERATION_NAME,
    DEFAULT_PROVIDER_NAME,
    resolve_options,
)
from otel_llm.hooks.tracker import Tracker
from otel_llm.record import RecordConsumer

__all__ = ["RequestTracker", "SpanHook", "consumer_for"]


class RequestTracker(Tracker):
    """Turns engine events into one trace and the latency metrics per request.

    Args:
        tracer_provider / meter_provider: where spans and metrics go; the global providers if None.
        model: ``gen_ai.request.model`` on spans and metrics.
        provider_name / operation_name: ``gen_ai.provider.name`` / ``gen_ai.operation.name``.
        max_in_flight: requests kept at most; past it the oldest is closed with reason ``abandoned``.
        max_age_s: a request in flight longer than this (monotonic seconds since queued) is abandoned.
        span_hook: called as ``span_hook(span, record)`` on each ``llm.request`` span before it ends
            (add attributes, events); ``record`` is the request's ``otel_llm.record.RequestRecord``. An
            exception from it is logged once and counted; the span is still exported. A tracker with a
            span hook builds its spans in this process.
        tail_sampling: which finished requests keep their trace (``otel_llm.emit.sampling``): a
            ``TailSampling``, False for every one, or None to read ``OTEL_LLM_TAIL_SAMPLING*`` (default:
            off, every trace kept). Metrics count every request either way.
        trace_detail: ``request``, ``phases`` or ``steps`` (``otel_llm.hooks.steps``); None reads
            ``OTEL_LLM_TRACE_DETAIL`` (default ``phases``).
        role: the engine instance's part in disaggregated serving: ``"prefill"`` (hands requests off
            with ``kv_sent``), ``"decode"`` (continues requests whose ``queued`` carrier is a prefill
            instance's ``handoff_carrier``), or ``"both"`` (the default: the whole request here). A
            role other than ``both`` is the ``llm.role`` attribute of every span and metric point.
        attributes: more attributes of every span and metric point, for what the integration knows of the
            server: ``server.address``, ``server.port``, ``gen_ai.response.model`` (the tracker's own
            attributes, e.g. ``gen_ai.request.model``, are not overridden).
    """

    def __init__(
        self,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        model: str | None = None,
        provider_name: str = DEFAULT_PROVIDER_NAME,
        operation_name: str = DEFAULT_OPERATION_NAME,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        max_age_s: float = DEFAULT_MAX_AGE_S,
        span_hook: SpanHook | None = None,
        tail_sampling: TailSampling | bool | None = None,
        trace_detail: str | None = None,
        role: str = sc.ROLE_BOTH,
        attributes: Mapping[str, str | int | float | bool] | None = None,
    ) -> None:
        tail = resolve_tail(tail_sampling)
        options = resolve_options(
            model=model,
            provider_name=provider_name,
            operation_name=operation_name,
            max_in_flight=max_in_flight,
            max_age_s=max_age_s,
            trace_detail=trace_detail,
            role=role,
            attributes=attributes,
        )
        if span_hook is not None and not callable(span_hook):
            raise TypeError(f"span_hook must be a callable (span, record) -> None, got {span_hook!r}")
        consumer = self._make_consumer(tracer_provider, meter_provider, tail, span_hook)
        super().__init__(options, tracer_provider, consumer)
        if isinstance(tracer_provider, trace.NoOpTracerProvider) and isinstance(
            meter_provider, metrics.NoOpMeterProvider
        ):
            self.telemetry_off()

    def _make_consumer(
        self,
        tracer_provider: trace.TracerProvider | None,
        meter_provider: metrics.MeterProvider | None,
        tail: TailSampling | None,
        span_hook: SpanHook | None,
    ) -> RecordConsumer:
        """Where this tracker's records go (see the module docstring); a subclass may wrap it."""
        return consumer_for(tracer_provider, meter_provider, tail, span_hook)


def consumer_for(
    tracer_provider: trace.TracerProvider | None,
    meter_provider: metrics.MeterProvider | None,
    tail: TailSampling | None,
    span_hook: SpanHook | None,
) -> RecordConsumer:
    """Where a new tracker's records go (see the module docstring)."""
    if span_hook is None:
        from otel_llm.export import channel

        feed = channel.feed_for(tracer_provider, meter_provider, tail)
        if feed is not None:
            return feed
    emitter: Any = Emitter(tracer_provider, meter_provider, tail, span_hook)
    return emitter
