"""The vLLM cost benchmark's figures, from the rounds of one workload (``vllm_fleet.run_workload``).

CPU figures are milliseconds of CPU per 1,000 output tokens (CPU nanoseconds / tokens x 1e-3), the
median over rounds; rates are output tokens per wall-clock second. "Added" CPU is a variant's minus
bare's, paired round by round (round ``r`` of every variant ran within one turn of the others, so the
machine's drift cancels), then the median of those differences.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from benchmarks.vllm_setups import BARE, OTEL_PHASES, OTEL_TAIL, VLLM_TRACING


def per_1k(cpu_ns: float, tokens: float) -> float:
    """CPU milliseconds per 1,000 output tokens."""
    return cpu_ns / tokens * 1e-3


@dataclass(frozen=True)
class VariantFigures:
    """One variant's medians over its timed rounds."""

    main: float  # frontend main thread, ms per 1k tokens
    other: float  # the frontend's other threads
    total: float  # the whole frontend process
    engine: float  # the engine-core process(es)
    export: float  # otel-llm's export process(es), export mode "process"; 0 in-process or without otel-llm
    tokens_per_s: float
    flush_ms: float  # wall milliseconds of the span flush at the end of the window


def variant_figures(rounds: list[dict[str, Any]]) -> VariantFigures:
    med = statistics.median
    return VariantFigures(
        main=med(per_1k(r["main_ns"], r["tokens"]) for r in rounds),
        other=med(per_1k(r["process_ns"] - r["main_ns"], r["tokens"]) for r in rounds),
        total=med(per_1k(r["process_ns"], r["tokens"]) for r in rounds),
        engine=med(per_1k(r["engine_ns"], r["tokens"]) for r in rounds),
        export=med(per_1k(r.get("export_ns", 0), r["tokens"]) for r in rounds),
        tokens_per_s=med(r["tokens"] / r["wall_ns"] * 1e9 for r in rounds),
        flush_ms=med(r["flush_wall_ns"] / 1e6 for r in rounds),
    )


def added(result: dict[str, Any], variant: str) -> float:
    """Median over rounds of the variant's frontend CPU minus bare's in the same round, ms per 1k."""
    rounds = result["rounds"]
    return statistics.median(
        per_1k(v["process_ns"], v["tokens"]) - per_1k(b["process_ns"], b["tokens"])
        for v, b in zip(rounds[variant], rounds[BARE])
    )


def added_ratio(result: dict[str, Any], variant: str) -> float | None:
    """The variant's added frontend CPU / vLLM tracing's; None when vLLM tracing added nothing."""
    tracing = added(result, VLLM_TRACING)
    return added(result, variant) / tracing if tracing > 0 else None


def added_ratio_halves(result: dict[str, Any], variant: str) -> tuple[float | None, float | None]:
    """``added_ratio`` of the even rounds and of the odd rounds apart: the ratio measured twice in one
    run, so its spread is known (each half has its own rounds, and so its own machine noise)."""
    halves = []
    for start in (0, 1):
        rounds = {name: r[start::2] for name, r in result["rounds"].items()}
        halves.append(added_ratio({**result, "rounds": rounds}, variant) if rounds[BARE] else None)
    return halves[0], halves[1]


@dataclass(frozen=True)
class Spread:
    median: float
    q1: float
    q3: float
    low: float
    high: float


def rate_ratio(result: dict[str, Any], variant: str = OTEL_PHASES) -> Spread:
    """Tokens per second of ``variant`` / bare's, paired per round: median, quartiles and range."""
    rounds = result["rounds"]
    ratios = sorted(
        (v["tokens"] / v["wall_ns"]) / (b["tokens"] / b["wall_ns"])
        for v, b in zip(rounds[variant], rounds[BARE])
    )
    if len(ratios) >= 2:
        q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    else:
        q1 = q3 = ratios[0]
    return Spread(statistics.median(ratios), q1, q3, ratios[0], ratios[-1])


@dataclass(frozen=True)
class SpanNotes:
    """What the receiver got during the timed rounds: spans per request of each variant that exports
    (vLLM tracing: its ``llm_request`` spans, not its start-up spans), preemptions per round (the phases
    variant's ``llm.preempted`` spans, one per preemption) and requests preempted at least once per round
    (the traces holding them), and the share of traces tail sampling kept."""

    spans_per_request: dict[str, float]
    preemptions_per_round: float
    preempted_requests_per_round: float
    tail_kept: float


def span_notes(result: dict[str, Any]) -> SpanNotes:
    rounds = len(result["rounds"][BARE])
    requests = result["workload"]["prompts"] * rounds
    spans = result["spans"]
    per_request = {
        name: sum(n for what, n in counts.items() if what != "preempted requests") / requests
        for name, counts in spans.items()
        if counts
    }
    if VLLM_TRACING in per_request:
        per_request[VLLM_TRACING] = spans[VLLM_TRACING].get("llm_request", 0) / requests
    return SpanNotes(
        per_request,
        spans.get(OTEL_PHASES, {}).get("llm.preempted", 0) / rounds,
        spans.get(OTEL_PHASES, {}).get("preempted requests", 0) / rounds,
        spans.get(OTEL_TAIL, {}).get("llm.request", 0) / requests,
    )


@dataclass(frozen=True)
class Breakdown:
    """The phases variant's frontend CPU by where it went, over its profile rounds.

    ``rows``: (what, ms per 1k tokens, µs per call or None, calls per round or None), the main thread's
    parts first, then the other threads by name; ``metric_export_ms``: CPU of one metric collection and
    export; ``total``: the whole process, ms per 1k tokens, with the counters on.
    """

    rows: list[tuple[str, float, float | None, float | None]]
    metric_export_ms: float
    total: float
    rounds: int
    export_mode: str | None = None  # the frontend's otel-llm export mode


def breakdown(profile: list[dict[str, Any]], min_thread_ms: float = 0.05) -> Breakdown | None:
    if not profile:
        return None
    tokens = sum(p["tokens"] for p in profile)
    rounds = len(profile)
    rows: list[tuple[str, float, float | None, float | None]] = []
    counted = 0
    names = profile[-1]["entry_points"]
    for name in names:
        cpu = sum(p["cpu_ns"].get(name, 0) for p in profile)
        calls = sum(p["calls"].get(name, 0) for p in profile)
        if not any(name.startswith(f"{outer}: ") for outer in names):  # a part is in its whole's CPU
            counted += cpu
        rows.append(
            (
                f"main thread: {name}",
                per_1k(cpu, tokens),
                cpu / calls / 1e3 if calls else None,
                calls / rounds,
            )
        )
    flush = sum(p["flush_ns"] for p in profile)
    if profile[-1].get("export_mode") == "process":
        flush_what = "main thread: flush (asks the export process, waits for its answer)"
    else:
        flush_what = "main thread: span flush (OTLP encoding and gRPC send)"
    rows.append((flush_what, per_1k(flush, tokens), None, None))
    main = sum(p["main_ns"] for p in profile)
    rows.append(
        ("main thread: the rest (vLLM's own work)", per_1k(main - counted - flush, tokens), None, None)
    )
    threads: dict[str, int] = {}
    for p in profile:
        for name, ns in p["threads_ns"].items():
            threads[name] = threads.get(name, 0) + ns
    small = 0
    for name, ns in sorted(threads.items(), key=lambda item: -item[1]):
        # The SDK's export threads (OtelBatchSpanRecordProcessor, OtelPeriodicExportingMetricReader) are
        # always shown, also when the flush on the main thread left them nothing to do.
        if per_1k(ns, tokens) >= min_thread_ms or name.startswith("Otel"):
            rows.append((f"thread {name}", per_1k(ns, tokens), None, None))
        else:
            small += ns
    if small:
        rows.append(
            (
                f"other threads (each under {min_thread_ms} ms per 1k tokens)",
                per_1k(small, tokens),
                None,
                None,
            )
        )
    process = sum(p["process_ns"] for p in profile)
    ended = process - main - sum(threads.values())
    rows.append(("threads that ended during the rounds", per_1k(ended, tokens), None, None))
    metric = statistics.median(p["metric_export_ns"] for p in profile) / 1e6
    return Breakdown(rows, metric, per_1k(process, tokens), rounds, profile[-1].get("export_mode"))
