"""The attributes of an ``llm.engine.step`` span (trace detail ``steps``), from a record's step row.

The hook side remembers the engine's steps and puts a request's longest ones in its record
(``otel_llm.hooks.steps``, ``otel_llm.record.StepRow``); each becomes one span here, linked to the
engine's own span of that step when it has one (``otel_llm.emit.engine_steps``).
"""

from __future__ import annotations

from typing import Any

from opentelemetry.trace import Link, SpanContext, TraceFlags

from otel_llm import semconv as sc
from otel_llm.record import (
    STEP_BATCH_SIZE,
    STEP_INDEX,
    STEP_KV_CACHE_USAGE,
    STEP_SPAN_ID,
    STEP_TOKENS,
    STEP_TRACE_ID,
    StepRow,
)

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


def step_attributes(row: StepRow) -> dict[str, Any]:
    """``llm.engine.step.index`` and ``.batch_size``, and the step's tokens and KV-cache usage when the
    engine reported them (``engine_state()``)."""
    tokens, kv_cache_usage = row[STEP_TOKENS], row[STEP_KV_CACHE_USAGE]
    attrs: dict[str, Any] = {sc.LLM_STEP_INDEX: row[STEP_INDEX], sc.LLM_STEP_BATCH_SIZE: row[STEP_BATCH_SIZE]}
    if tokens is not None:
        attrs[sc.LLM_STEP_TOKENS] = tokens
    if kv_cache_usage is not None:
        attrs[sc.LLM_STEP_KV_CACHE_USAGE] = kv_cache_usage
    return attrs


def step_links(row: StepRow) -> list[Link] | None:
    """The link from a request's step span to the engine's own span of that step (None: it has none)."""
    trace_id, span_id = row[STEP_TRACE_ID], row[STEP_SPAN_ID]
    if trace_id is None or span_id is None:  # both None together: the step has no span of its own
        return None
    return [Link(SpanContext(trace_id, span_id, False, _SAMPLED))]
