"""A record's stalls (``otel_llm.record.Stalls``, from the ``batch()`` hook) -> span events and attributes.

One ``llm.stall`` event per stall row, at the stalled token's time, saying its cause, how long it waited
against the request's typical gap, what the steps in the gap computed and how long the longest ran;
``llm.request`` gets the count and the seconds by cause. Times are monotonic seconds;
``otel_llm.emit.spans`` places them.
"""

from __future__ import annotations

from typing import Any

from otel_llm import semconv as sc
from otel_llm.record import RequestRecord


def stall_events(rec: RequestRecord) -> list[tuple[str, dict[str, Any], float]]:
    """(name, attributes, monotonic seconds) of each stall row, in time order."""
    stalls = rec.stalls
    if not stalls:
        return []
    events = []
    for t0, t1, cause, token, prefill, recompute, decode, steps, named, took, typical in stalls[1]:
        attrs: dict[str, Any] = {
            sc.LLM_STALL_CAUSE: cause,
            sc.LLM_STALL_DURATION: t1 - t0,
            sc.LLM_STALL_TOKEN: token,
            sc.LLM_STALL_STEPS: steps,
            sc.LLM_STALL_PREFILL_TOKENS: prefill,
            sc.LLM_STALL_RECOMPUTE_TOKENS: recompute,
            sc.LLM_STALL_DECODE_TOKENS: decode,
            sc.LLM_STALL_TYPICAL_GAP: typical,
        }
        if steps:
            attrs[sc.LLM_STALL_STEP_TIME] = took
        if named:
            attrs[sc.LLM_STALL_REQUESTS] = tuple(rid for rid, _ in named)
            attrs[sc.LLM_STALL_REQUEST_TOKENS] = tuple(n for _, n in named)
        events.append((sc.EVENT_STALL, attrs, t1))
    return events


def stall_attributes(rec: RequestRecord) -> dict[str, Any]:
    """``llm.stalls`` and ``llm.stalled.<cause>`` (seconds) of ``llm.request``; nothing without the hook."""
    stalls = rec.stalls
    if stalls is None:
        return {}
    totals = stalls[0]
    attrs: dict[str, Any] = {sc.LLM_STALLS: sum(n for _, n, _ in totals)}
    for cause, _, seconds in totals:
        attrs[sc.LLM_STALLED_PREFIX + cause] = seconds
    return attrs
