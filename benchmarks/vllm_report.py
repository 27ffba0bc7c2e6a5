"""BENCHMARKS-vllm.md's sections from the workloads' results: the targets, per workload the six
variants side by side, and where the phases variant's frontend CPU went."""

from __future__ import annotations

from typing import Any

from benchmarks import vllm_figures as fig
from benchmarks.vllm_setups import BARE, OTEL_PHASES, OTEL_REQUEST, OTEL_TAIL, VARIANTS, VLLM_TRACING

TARGET_HEADER = ["measure", "now", "target", "measured", "verdict"]
# The "now" column and targets for otel-llm's added frontend CPU / vLLM tracing's added CPU.
ADDED_RATIO_TARGETS = (
    (
        OTEL_PHASES,
        "otel-llm's added frontend CPU ÷ vLLM's own tracing's added CPU, phases, every trace kept",
        1.08,
        0.5,
    ),
    (OTEL_REQUEST, "same, detail `request` (one span per request, as vLLM's)", 0.89, 0.3),
)


def _ratio_text(value: float | None) -> str:
    return "n/a (vLLM tracing added no CPU)" if value is None else f"{value:.2f}"


def target_rows(results: list[dict[str, Any]]) -> list[list[str]]:
    """This benchmark's rows of the targets table, judged on the first workload (the issue's); the other
    workloads' values follow in brackets."""
    if not results:
        return []
    first, others = results[0], results[1:]
    rows = []
    for variant, measure, now, target in ADDED_RATIO_TARGETS:
        value = fig.added_ratio(first, variant)
        measured = _ratio_text(value)
        if others:
            measured += (
                " ("
                + ", ".join(
                    f"{r['workload']['name']}: {_ratio_text(fig.added_ratio(r, variant))}" for r in others
                )
                + ")"
            )
        if value is None:
            verdict = "not measurable in this run"
        elif value <= target:
            verdict = "met"
        else:
            verdict = f"not met: {value - target:+.2f} above the target"
        rows.append([measure, f"{now:.2f}", f"≤ {target}", measured, verdict])
    spread = fig.rate_ratio(first)
    measured = (
        f"{spread.median:.3f} with ÷ without, paired per round (quartiles {spread.q1:.3f}–{spread.q3:.3f}, "
        f"range {spread.low:.3f}–{spread.high:.3f})"
    )
    within = spread.q1 <= 1.0 <= spread.q3
    distance = spread.q1 - 1.0 if spread.q1 > 1.0 else spread.q3 - 1.0
    verdict = (
        "met (1.0 within the quartiles)" if within else f"not met: quartiles end {distance:+.3f} from 1.0"
    )
    rows.append(
        [
            "tokens per second with otel-llm (phases) vs without (bare)",
            "within noise",
            "within noise",
            measured,
            verdict,
        ]
    )
    return rows


def targets_lines(rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(TARGET_HEADER) + " |", "|" + "---|" * len(TARGET_HEADER)]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return out


def workload_lines(letter: str, result: dict[str, Any]) -> list[str]:
    """One workload: its six variants side by side, what the receiver got, where otel-llm's CPU went."""
    workload = result["workload"]
    figures = {name: fig.variant_figures(rounds) for name, rounds in result["rounds"].items()}
    bare, tracing = figures[BARE].total, figures[VLLM_TRACING].total
    notes = fig.span_notes(result)
    rounds = len(result["rounds"][BARE])
    out = [
        f"### ({letter}) {workload['title']}",
        "",
        f"{workload['prompts']} prompts x {workload['max_tokens']} output tokens; KV cache of "
        f"{workload['blocks']} blocks x {workload['block_size']} tokens; "
        f"up to {workload['max_num_seqs']} requests running; "
        f"{notes.preemptions_per_round:.1f} preemptions a round, {notes.preempted_requests_per_round:.1f} "
        f"requests preempted at least once; {rounds} rounds per variant.",
        "",
        "| variant | frontend CPU, ms per 1k tokens: main thread | other threads | total | x bare "
        "| x vLLM tracing | engine-core CPU, ms per 1k tokens | tokens/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for variant in VARIANTS:
        f = figures[variant.name]
        out.append(
            f"| {variant.label} | {f.main:.1f} | {f.other:.1f} | {f.total:.1f} | {f.total / bare:.2f} | "
            f"{f.total / tracing:.2f} | {f.engine:.0f} | {f.tokens_per_s:,.0f} |"
        )
    kept = ", ".join(f"{name} {value:.2f}" for name, value in notes.spans_per_request.items())
    out += [
        "",
        "Added frontend CPU over bare (median of the paired rounds), ms per 1k tokens: "
        + ", ".join(f"{v.name} {fig.added(result, v.name):+.1f}" for v in VARIANTS if v.name != BARE)
        + f". Spans received per request: {kept or 'none'}; tail sampling kept "
        f"{notes.tail_kept:.0%} of the traces ({OTEL_TAIL}). Span flush at the end of the window, wall "
        f"ms: "
        + ", ".join(f"{name} {f.flush_ms:.1f}" for name, f in figures.items() if f.flush_ms >= 0.05)
        + ".",
        "",
    ]
    out += breakdown_lines(result)
    return out


def breakdown_lines(result: dict[str, Any]) -> list[str]:
    found = fig.breakdown(result["profile"])
    if found is None:
        return []
    out = [
        f"Where the phases variant's frontend CPU goes ({found.rounds} extra round(s) after the timed ones, "
        "each entry point wrapped in `time.thread_time_ns` counters; every thread's CPU from its schedstat):",
        "",
        "| where | ms per 1k tokens | µs per call | calls per round |",
        "|---|---|---|---|",
    ]
    for what, ms, per_call, calls in found.rows:
        out.append(
            f"| {what} | {ms:.2f} | {'' if per_call is None else f'{per_call:.1f}'} | "
            f"{'' if calls is None else f'{calls:.0f}'} |"
        )
    out += [
        f"| whole frontend process (counters on) | {found.total:.2f} | | |",
        "",
        f"One metric collection and export (every 60 s by default, `OTEL_METRIC_EXPORT_INTERVAL`): "
        f"{found.metric_export_ms:.1f} ms of CPU.",
        "",
    ]
    return out
