"""Spans as keys that two exports of one workload share whichever process built them.

A request's ``llm.request`` keeps the span id the engine's process fixed at ``queued``; the ids of its
children are drawn where the spans are built (the engine's process, or the export process), so a child is
named here by what it is: its name and times, and its parent's. Two exports of the same requests give the
same keys, field by field, exactly when they hold the same spans in the same tree.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from otel_llm import semconv as sc

Key = tuple[Any, ...]


def _sdk(span: Any) -> tuple[str, str, str, str, int, int]:
    parent = f"{span.parent.span_id:016x}" if span.parent else ""
    return (
        f"{span.context.trace_id:032x}",
        f"{span.context.span_id:016x}",
        parent,
        span.name,
        span.start_time,
        span.end_time,
    )


def _otlp(span: Any) -> tuple[str, str, str, str, int, int]:
    return (
        span.trace_id.hex(),
        span.span_id.hex(),
        span.parent_span_id.hex(),
        span.name,
        span.start_time_unix_nano,
        span.end_time_unix_nano,
    )


def keys(rows: list[tuple[str, str, str, str, int, int]]) -> Counter[Key]:
    by_id = {(trace, span): (name, start, end) for trace, span, _, name, start, end in rows}
    out: Counter[Key] = Counter()
    for trace, span, parent, name, start, end in rows:
        own = span if name == sc.SPAN_REQUEST else None
        above = by_id.get((trace, parent), parent)  # a parent outside the export: its id as it is
        out[(trace, own, above, name, start, end)] += 1
    return out


def sdk_keys(spans: Any) -> Counter[Key]:
    """Keys of SDK ``ReadableSpan``s (an in-memory copy)."""
    return keys([_sdk(s) for s in spans])


def otlp_keys(spans: Any) -> Counter[Key]:
    """Keys of decoded OTLP spans (what a receiver got)."""
    return keys([_otlp(s) for s in spans])
