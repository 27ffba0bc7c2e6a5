"""The demo's summary table, computed from finished request traces and per-step token timestamps."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence

from rich.table import Table

from otel_llm import semconv as sc
from otel_llm.kit.waterfall import RequestTrace


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of ``values``; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def inter_token_latencies(token_ts: Mapping[str, Sequence[float]]) -> list[float]:
    """Gaps between consecutive token timestamps of each request, seconds."""
    return [b - a for ts in token_ts.values() for a, b in itertools.pairwise(ts)]


def stall_events(requests: Sequence[RequestTrace]) -> list[tuple[RequestTrace, dict[str, object]]]:
    """Every ``llm.stall`` event of the requests, with its request."""
    return [(trace, attrs) for trace in requests for _, attrs in trace.events(sc.EVENT_STALL)]


def stall_counts(requests: Sequence[RequestTrace]) -> dict[str, int] | None:
    """Stall events by cause; None when no request carries stall figures (the engine did not report its
    batches)."""
    if not any(sc.LLM_STALLS in t.root.attributes for t in requests):
        return None
    counts: dict[str, int] = {}
    for _, attrs in stall_events(requests):
        cause = str(attrs.get(sc.LLM_STALL_CAUSE))
        counts[cause] = counts.get(cause, 0) + 1
    return counts


def stall_durations(requests: Sequence[RequestTrace]) -> list[float]:
    """Seconds of every ``llm.stall`` event of the requests."""
    found = (a.get(sc.LLM_STALL_DURATION) for _, a in stall_events(requests))
    return [float(d) for d in found if isinstance(d, (int, float))]


def engine_time_line(requests: Sequence[RequestTrace]) -> str | None:
    """``engine time: 1.84 s over 40 requests, 0.31 s (17%) of it recompute work after preemptions``: the
    sum of the requests' ``llm.engine.time``; None when the engine did not report its batches."""
    spent = [t.root.attributes.get(sc.LLM_ENGINE_TIME) for t in requests]
    again = [t.root.attributes.get(sc.LLM_ENGINE_TIME_RECOMPUTE) for t in requests]
    total = sum(float(v) for v in spent if isinstance(v, (int, float)))
    wasted = sum(float(v) for v in again if isinstance(v, (int, float)))
    counted = sum(1 for v in spent if isinstance(v, (int, float)))
    if not counted:
        return None
    share = f" ({wasted / total:.0%})" if total > 0 else ""
    return (
        f"engine time: {total:.2f} s over {counted} requests, {wasted:.2f} s{share} of it recompute work "
        "after preemptions"
    )


def causes_text(counts: dict[str, int]) -> str:
    """``prefill 10, preemption 5, ...``: stalls by cause, the most common first."""
    return ", ".join(f"{cause} {n}" for cause, n in sorted(counts.items(), key=lambda item: -item[1]))


def telling_stall(requests: Sequence[RequestTrace]) -> tuple[RequestTrace, dict[str, object]] | None:
    """The stall worth showing: the longest one other requests' prefill or recompute caused, else the
    longest of any cause; None without stalls."""
    timed = [
        (t, a) for t, a in stall_events(requests) if isinstance(a.get(sc.LLM_STALL_DURATION), (int, float))
    ]
    shared = [(t, a) for t, a in timed if a.get(sc.LLM_STALL_CAUSE) in (sc.STALL_PREFILL, sc.STALL_RECOMPUTE)]
    pool = shared or timed
    return max(pool, key=lambda item: float(item[1][sc.LLM_STALL_DURATION])) if pool else None  # type: ignore[arg-type]


def summary_table(
    requests: Sequence[RequestTrace],
    token_ts: Mapping[str, Sequence[float]],
    engine_preemptions: int,
    steps: int,
    elapsed_s: float,
) -> Table:
    def attr(key: str) -> list[float]:
        return [float(t.root.attributes[key]) for t in requests if key in t.root.attributes]

    table = Table(title="otel-llm demo", title_justify="left")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("p50", justify="right")
    table.add_column("p99", justify="right")
    out_tokens = sum(int(t.root.attributes.get(sc.GEN_AI_USAGE_OUTPUT_TOKENS, 0)) for t in requests)
    table.add_row("requests (traced)", str(len(requests)), "", "")
    table.add_row("output tokens", str(out_tokens), "", "")
    table.add_row(
        "preemptions (spans / engine)",
        f"{sum(t.preemptions for t in requests)} / {engine_preemptions}",
        "",
        "",
    )
    table.add_row("preempted requests", str(sum(1 for t in requests if t.preemptions)), "", "")
    table.add_row("engine steps", str(steps), "", "")
    table.add_row("wall time", f"{elapsed_s:.2f} s", "", "")
    for label, values in (
        ("TTFT", attr(sc.LLM_LATENCY_TTFT)),
        ("inter-token latency", inter_token_latencies(token_ts)),
        ("queue", attr(sc.LLM_LATENCY_QUEUE)),
        ("e2e", attr(sc.LLM_LATENCY_E2E)),
        *((("stalls", stall_durations(requests)),) if stall_counts(requests) is not None else ()),
    ):
        p50, p99 = percentile(values, 50), percentile(values, 99)
        table.add_row(
            f"{label} (ms)",
            f"n={len(values)}",
            "-" if p50 is None else f"{p50 * 1000:.1f}",
            "-" if p99 is None else f"{p99 * 1000:.1f}",
        )
    return table
