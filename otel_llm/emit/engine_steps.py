"""A window of the engine's own steps -> its trace: ``llm.engine.window`` with one ``llm.engine.step``
span per spanned step, each linked to the ``llm.request`` spans of the requests in it
(``otel_llm.hooks.step_windows`` says which steps, and why so few).

The ids were drawn on the hook side (requests that finished while the window was open already link to
its steps), so the spans are started through the tracer with those ids preset (``PresetIds``); the
provider's own sampler decides the window's trace like any root span's (tail sampling is for requests).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags

from otel_llm import semconv as sc
from otel_llm.emit.preset import TracerView
from otel_llm.logs import warn_once
from otel_llm.record import (
    ENGINE_STEP_REQUEST_LINKS,
    ENGINE_STEP_SPAN_ID,
    ENGINE_STEP_START,
    ENGINE_STEP_TOKENS_AT,
    EngineStepRow,
    StepWindow,
)

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NO_PARENT = Context()  # a window's trace is its own, whatever span is current where it is emitted


def engine_step_attributes(row: EngineStepRow) -> dict[str, Any]:
    """The attributes of one engine step span: index, batch size, tokens and KV-cache usage as on a
    request's step span, and what the step computed by kind when the engine reports its batches."""
    _, _, _, index, batch_size, tokens, kv_cache_usage, _, composition = row
    attrs: dict[str, Any] = {sc.LLM_STEP_INDEX: index, sc.LLM_STEP_BATCH_SIZE: batch_size}
    if tokens is not None:
        attrs[sc.LLM_STEP_TOKENS] = tokens
    if kv_cache_usage is not None:
        attrs[sc.LLM_STEP_KV_CACHE_USAGE] = kv_cache_usage
    if composition is not None:
        prefill, recompute, decode, spec = composition
        attrs[sc.LLM_STEP_PREFILL_TOKENS] = prefill
        attrs[sc.LLM_STEP_RECOMPUTE_TOKENS] = recompute
        attrs[sc.LLM_STEP_DECODE_TOKENS] = decode
        attrs[sc.LLM_STEP_SPEC_TOKENS] = spec
    return attrs


def emit_window(
    view: TracerView, wall_ns: Callable[[float], int], base: dict[str, Any], window: StepWindow
) -> int:
    """The spans of ``window`` through ``view``'s tracer; returns how many were started. ``wall_ns``:
    the producing tracker's monotonic seconds -> wall-clock ns; ``base``: its spans' attributes."""
    tracer = view.tracer()
    ids = view.ids
    if ids is None:
        warn_once(
            "engine-steps-ids",
            "otel_llm: the tracer provider is not the SDK's: engine step spans get ids of its own, so "
            "the links between them and the requests' step spans lead nowhere",
        )
    trace_id, span_id, start, end, steps, rows = window
    attributes = {**base, sc.LLM_STEPS: steps, sc.LLM_STEPS_UNSPANNED: steps - len(rows)}
    root = _start(
        tracer, ids, trace_id, span_id, sc.SPAN_ENGINE_WINDOW, _NO_PARENT, attributes, wall_ns(start)
    )
    under = trace.set_span_in_context(root, _NO_PARENT)
    for row in rows:
        links = [Link(SpanContext(t, s, False, _SAMPLED)) for t, s in row[ENGINE_STEP_REQUEST_LINKS]]
        span = _start(
            tracer,
            ids,
            trace_id,
            row[ENGINE_STEP_SPAN_ID],
            sc.SPAN_ENGINE_STEP,
            under,
            engine_step_attributes(row),
            wall_ns(row[ENGINE_STEP_START]),
            links,
        )
        span.end(end_time=wall_ns(row[ENGINE_STEP_TOKENS_AT]))
    root.end(end_time=wall_ns(end))
    return 1 + len(rows)


def _start(
    tracer: Any,
    ids: Any,
    trace_id: int,
    span_id: int,
    name: str,
    parent: Context,
    attributes: dict[str, Any],
    at: int,
    links: list[Link] | None = None,
) -> Any:
    if ids is not None:
        ids.preset(trace_id, span_id)
    try:
        return tracer.start_span(
            name, context=parent, kind=SpanKind.INTERNAL, attributes=attributes, links=links, start_time=at
        )
    finally:
        if ids is not None:
            ids.clear()  # a child takes only the span id: the trace id must not reach the next root
