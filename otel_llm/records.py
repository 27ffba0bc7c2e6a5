"""What a finished request's spans carry: the request span's attributes, its events, its status text.

Plain data from the timeline (``otel_llm.timeline``) and its intervals (``otel_llm.intervals``), no
OpenTelemetry: ``otel_llm.spans`` turns them into spans. Times are monotonic seconds.
"""

from __future__ import annotations

from typing import Any

from otel_llm import semconv as sc
from otel_llm.intervals import Intervals
from otel_llm.recompute import request_attributes as recompute_attributes
from otel_llm.timeline import FinishedRequest, Timeline

# Preemptions drawn as spans (and events) per request; 2 spans and 2 events each. A request preempted
# more often than this is thrashing, and the first ones show the pattern.
MAX_PREEMPTION_SPANS = 32


def request_events(tl: Timeline, fin: FinishedRequest) -> list[tuple[str, dict[str, Any] | None, float]]:
    """The events of ``llm.request`` as (name, attributes, monotonic seconds), in time order.

    Trace UIs list events in the order they were added, so they are sorted here; the sort is stable, so
    events at one instant keep their lifecycle order (a preemption before the scheduling that resumes it).
    """
    events: list[tuple[str, dict[str, Any] | None, float]] = [(sc.EVENT_QUEUED, None, tl.queued)]
    if tl.first_scheduled is not None:
        events.append((sc.EVENT_SCHEDULED, {sc.LLM_RESUMED: False}, tl.first_scheduled))
    if tl.first_token is not None:
        events.append((sc.EVENT_FIRST_TOKEN, None, tl.first_token))
    for p in tl.preemptions[:MAX_PREEMPTION_SPANS]:
        events.append((sc.EVENT_PREEMPTED, {sc.LLM_OUTPUT_TOKENS: p.output_tokens}, p.preempted))
        if p.rescheduled is not None:
            events.append((sc.EVENT_SCHEDULED, {sc.LLM_RESUMED: True}, p.rescheduled))
    if tl.kv_done is not None or fin.handed_off:
        kv = {sc.LLM_KV_TRANSFER_BYTES: tl.kv_bytes} if tl.kv_bytes is not None else None
        if fin.handed_off:
            events.append((sc.EVENT_KV_SENT, kv, fin.finished))
        else:
            events.append((sc.EVENT_KV_RECEIVED, kv, tl.kv_done))  # type: ignore[arg-type]
    events.sort(key=lambda e: e[2])
    return events


def start_attributes(tl: Timeline, base: dict[str, Any]) -> dict[str, Any]:
    """The request span's attributes known from ``queued`` on (what a sampler sees before the end)."""
    attrs: dict[str, Any] = dict(tl.attributes) if tl.attributes else {}
    attrs.update(base)
    attrs[sc.LLM_REQUEST_ID] = str(tl.request_id)
    if tl.prompt_tokens is not None:
        attrs[sc.GEN_AI_USAGE_INPUT_TOKENS] = tl.prompt_tokens
    return attrs


def root_attributes(
    fin: FinishedRequest, iv: Intervals, base: dict[str, Any], err: str | None
) -> dict[str, Any]:
    """The attributes of ``llm.request``: the user's from ``queued`` first, so ours win on a clash."""
    tl = fin.timeline
    attrs = start_attributes(tl, base)
    attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] = tl.output_tokens
    attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] = (fin.reason,)
    attrs[sc.LLM_PREEMPTIONS] = len(tl.preemptions)
    if tl.preemptions:
        attrs.update(recompute_attributes(tl.preemptions))
    if tl.cached_tokens is not None:
        attrs[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] = tl.cached_tokens
    if len(tl.preemptions) > MAX_PREEMPTION_SPANS:
        count, preempted_s, recompute_s = _unspanned(fin)
        attrs[sc.LLM_PREEMPTIONS_UNSPANNED] = count
        attrs[sc.LLM_PREEMPTIONS_UNSPANNED_PREEMPTED] = preempted_s
        attrs[sc.LLM_PREEMPTIONS_UNSPANNED_RECOMPUTE] = recompute_s
    if err is not None:
        attrs[sc.ERROR_TYPE] = err
    attrs.update(iv.span_attributes())
    return attrs


def _unspanned(fin: FinishedRequest) -> tuple[int, float, float]:
    """Preemptions past the span cap: their count, and seconds evicted and recomputing, measured with the
    bounds their spans would have had (a recompute cut short by the next preemption ends there)."""
    preemptions = fin.timeline.preemptions
    preempted_s = recompute_s = 0.0
    for k in range(MAX_PREEMPTION_SPANS, len(preemptions)):
        p = preemptions[k]
        until = preemptions[k + 1].preempted if k + 1 < len(preemptions) else fin.finished
        resumed = p.rescheduled
        preempted_s += (resumed if resumed is not None else until) - p.preempted
        if resumed is not None:
            recompute_s += (p.recomputed if p.recomputed is not None else until) - resumed
    return len(preemptions) - MAX_PREEMPTION_SPANS, preempted_s, recompute_s


def describe(fin: FinishedRequest) -> str:
    if fin.error is None:
        return fin.reason
    if isinstance(fin.error, BaseException):
        return f"{type(fin.error).__name__}: {fin.error}"
    return str(fin.error)


def error_type(fin: FinishedRequest) -> str | None:
    """``error.type`` for a failed request: the exception's class, else the reason itself."""
    if fin.reason not in sc.FAILED_REASONS:
        return None
    if isinstance(fin.error, BaseException):
        return type(fin.error).__qualname__
    return fin.reason
