"""What a finished request's ``llm.request`` span carries: its attributes and its events.

Plain data from the request's record (``otel_llm.record``) and its intervals (``otel_llm.emit.intervals``),
no OpenTelemetry: ``otel_llm.emit.spans`` turns them into spans. Times are monotonic seconds.
"""

from __future__ import annotations

from typing import Any

from otel_llm import semconv as sc
from otel_llm.emit.intervals import Intervals
from otel_llm.emit.recompute import request_attributes as recompute_attributes
from otel_llm.emit.stalls import stall_attributes
from otel_llm.record import (
    MAX_PREEMPTION_SPANS,
    PREEMPTION_OUTPUT_TOKENS,
    PREEMPTION_PREEMPTED,
    PREEMPTION_RESCHEDULED,
    RequestRecord,
    start_attributes,
)

__all__ = ["MAX_PREEMPTION_SPANS", "request_events", "root_attributes"]


def request_events(rec: RequestRecord) -> list[tuple[str, dict[str, Any] | None, float]]:
    """The events of ``llm.request`` as (name, attributes, monotonic seconds), in time order.

    Trace UIs list events in the order they were added, so they are sorted here; the sort is stable, so
    events at one instant keep their lifecycle order (a preemption before the scheduling that resumes it).
    """
    events: list[tuple[str, dict[str, Any] | None, float]] = [(sc.EVENT_QUEUED, None, rec.queued)]
    if rec.first_scheduled is not None:
        events.append((sc.EVENT_SCHEDULED, {sc.LLM_RESUMED: False}, rec.first_scheduled))
    if rec.first_token is not None:
        events.append((sc.EVENT_FIRST_TOKEN, None, rec.first_token))
    for p in rec.preemptions[:MAX_PREEMPTION_SPANS]:
        events.append(
            (sc.EVENT_PREEMPTED, {sc.LLM_OUTPUT_TOKENS: p[PREEMPTION_OUTPUT_TOKENS]}, p[PREEMPTION_PREEMPTED])
        )
        rescheduled = p[PREEMPTION_RESCHEDULED]
        if rescheduled is not None:
            events.append((sc.EVENT_SCHEDULED, {sc.LLM_RESUMED: True}, rescheduled))
    if rec.kv_done is not None or rec.handed_off:
        kv = {sc.LLM_KV_TRANSFER_BYTES: rec.kv_bytes} if rec.kv_bytes is not None else None
        if rec.handed_off:
            events.append((sc.EVENT_KV_SENT, kv, rec.finished))
        else:
            events.append((sc.EVENT_KV_RECEIVED, kv, rec.kv_done))  # type: ignore[arg-type]
    events.sort(key=lambda e: e[2])
    return events


def root_attributes(rec: RequestRecord, iv: Intervals, base: dict[str, Any]) -> dict[str, Any]:
    """The attributes of ``llm.request``: the user's from ``queued`` first, so ours win on a clash."""
    attrs = start_attributes(rec.request_id, rec.attributes, rec.prompt_tokens, base)
    attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] = rec.output_tokens
    attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] = (rec.reason,)
    preemptions = rec.preemptions
    attrs[sc.LLM_PREEMPTIONS] = len(preemptions)
    if preemptions:
        attrs.update(recompute_attributes(preemptions))
    if rec.cached_tokens is not None:
        attrs[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] = rec.cached_tokens
    if len(preemptions) > MAX_PREEMPTION_SPANS:
        count, preempted_s, recompute_s = _unspanned(rec)
        attrs[sc.LLM_PREEMPTIONS_UNSPANNED] = count
        attrs[sc.LLM_PREEMPTIONS_UNSPANNED_PREEMPTED] = preempted_s
        attrs[sc.LLM_PREEMPTIONS_UNSPANNED_RECOMPUTE] = recompute_s
    if rec.error_type is not None:
        attrs[sc.ERROR_TYPE] = rec.error_type
    if rec.stalls is not None:
        attrs.update(stall_attributes(rec))
    cost = rec.engine_time
    if cost is not None:
        attrs[sc.LLM_ENGINE_TIME], attrs[sc.LLM_ENGINE_TIME_RECOMPUTE] = cost
    attrs.update(iv.span_attributes())
    return attrs


def _unspanned(rec: RequestRecord) -> tuple[int, float, float]:
    """Preemptions past the span cap: their count, and seconds evicted and recomputing, measured with the
    bounds their spans would have had (a recompute cut short by the next preemption ends there)."""
    preemptions = rec.preemptions
    preempted_s = recompute_s = 0.0
    for k in range(MAX_PREEMPTION_SPANS, len(preemptions)):
        preempted, _, _, resumed, recomputed, _, _ = preemptions[k]
        until = preemptions[k + 1][PREEMPTION_PREEMPTED] if k + 1 < len(preemptions) else rec.finished
        preempted_s += (resumed if resumed is not None else until) - preempted
        if resumed is not None:
            recompute_s += (recomputed if recomputed is not None else until) - resumed
    return len(preemptions) - MAX_PREEMPTION_SPANS, preempted_s, recompute_s
