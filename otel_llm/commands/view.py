"""``otel-llm view FILE``: a terminal waterfall of one request from an OTLP JSON traces file."""

from __future__ import annotations

import argparse

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from otel_llm import semconv as sc
from otel_llm.waterfall import RequestTrace, SpanRecord, group_requests, load_otlp_json, pick_request

# Bar glyph and colour per span; a preempted interval shows as a gap in its phase's bar.
_STYLE = {
    sc.SPAN_REQUEST: ("█", "bright_white"),
    sc.SPAN_QUEUE: ("█", "yellow"),
    sc.SPAN_PREFILL: ("█", "cyan"),
    sc.SPAN_DECODE: ("█", "green"),
    sc.SPAN_PREEMPTED: ("░", "red"),
    sc.SPAN_RECOMPUTE: ("█", "magenta"),
}
_GAP = ("·", "red")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("view", help="print the waterfall of one request from an OTLP JSON traces file")
    p.add_argument("file", help="OTLP JSON lines traces file (e.g. otel-llm-output/traces.jsonl)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--request", metavar="ID", help="the request id (llm.request.id); latest if repeated")
    which.add_argument("--slowest", action="store_true", help="the request with the longest duration")
    p.add_argument(
        "--width", type=int, default=None, help="columns of the time axis (default: fit the terminal)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    console = Console()
    try:
        requests = group_requests(load_otlp_json(args.file))
        trace = pick_request(requests, request_id=args.request, slowest=args.slowest)
    except (OSError, ValueError) as exc:
        Console(stderr=True).print(f"[red]otel-llm view:[/red] {exc}")
        return 2
    console.print(render_waterfall(trace, width=args.width or axis_width(console)))
    return 0


def axis_width(console: Console) -> int:
    """Columns left for the time axis once the span, start and duration columns are drawn."""
    return max(20, console.width - 40)


def _covered_s(spans: list[SpanRecord]) -> float:
    """Seconds covered by the union of the spans' intervals (overlaps counted once)."""
    total, end = 0, None
    for s in sorted(spans, key=lambda s: s.start_ns):
        start = s.start_ns if end is None else max(s.start_ns, end)
        if s.end_ns > start:
            total += s.end_ns - start
        end = s.end_ns if end is None else max(end, s.end_ns)
    return total / 1e9


def _bar(span: SpanRecord, trace: RequestTrace, t0: int, ns_per_col: float, width: int) -> Text:
    def col(ns: int) -> int:
        return min(width - 1, max(0, int((ns - t0) / ns_per_col)))

    glyph, style = _STYLE.get(span.name, ("█", "white"))
    cells = [(" ", "")] * width
    for c in range(col(span.start_ns), col(span.end_ns) + 1):
        cells[c] = (glyph, style)
    if span.name in (sc.SPAN_PREFILL, sc.SPAN_DECODE):  # punch out the time the request was evicted
        for child in trace.children(span):
            if child.name == sc.SPAN_PREEMPTED:
                for c in range(col(child.start_ns), col(child.end_ns) + 1):
                    cells[c] = _GAP
    text = Text()
    for ch, st in cells:
        text.append(ch, style=st)
    return text


def _tree(trace: RequestTrace) -> list[tuple[int, SpanRecord]]:
    rows: list[tuple[int, SpanRecord]] = []

    def walk(span: SpanRecord, depth: int) -> None:
        rows.append((depth, span))
        for child in trace.children(span):
            walk(child, depth + 1)

    walk(trace.root, 0)
    return rows


def _ms(seconds: object) -> str:
    return f"{seconds * 1000:.1f} ms" if isinstance(seconds, (int, float)) else "-"


def render_waterfall(trace: RequestTrace, width: int = 40) -> Group:
    """A table of the request's spans on one time axis, then its key numbers."""
    root = trace.root
    t0, span_ns = root.start_ns, max(1, root.end_ns - root.start_ns)
    ns_per_col = span_ns / width
    table = Table(title=f"request {trace.request_id}", title_justify="left", box=None, pad_edge=False)
    table.add_column("span", no_wrap=True, min_width=17)
    table.add_column("start ms", justify="right", no_wrap=True, min_width=8)
    table.add_column("duration", justify="right", no_wrap=True, min_width=9)
    table.add_column(f"0 … {span_ns / 1e6:.1f} ms", no_wrap=True)
    for depth, span in _tree(trace):
        table.add_row(
            "  " * depth + span.name,
            f"{(span.start_ns - t0) / 1e6:.1f}",
            f"{span.duration_s * 1000:.1f} ms",
            _bar(span, trace, t0, ns_per_col, width),
        )
    a = root.attributes
    preempted = [s for s in trace.spans if s.name == sc.SPAN_PREEMPTED]
    recompute = [s for s in trace.spans if s.name == sc.SPAN_RECOMPUTE]
    facts = [
        ("TTFT", _ms(a.get(sc.LLM_LATENCY_TTFT))),
        ("queue", _ms(a.get(sc.LLM_LATENCY_QUEUE))),
        ("prefill", _ms(a.get(sc.LLM_LATENCY_PREFILL))),
        ("decode", _ms(a.get(sc.LLM_LATENCY_DECODE))),
        ("e2e", _ms(a.get(sc.LLM_LATENCY_E2E, root.duration_s))),
        ("preemptions", str(trace.preemptions)),
        ("evicted for", _ms(_covered_s(preempted)) if preempted else "-"),
        ("recomputing", _ms(_covered_s(recompute)) if recompute else "-"),
        (
            "tokens in/out",
            f"{a.get(sc.GEN_AI_USAGE_INPUT_TOKENS, '-')}/{a.get(sc.GEN_AI_USAGE_OUTPUT_TOKENS, '-')}",
        ),
        ("finish", ",".join(map(str, a.get(sc.GEN_AI_RESPONSE_FINISH_REASONS) or ["-"]))),
    ]
    if trace.steps:
        facts.append(("engine steps", str(trace.steps)))
    numbers = Text("  ".join(f"{k}: {v}" for k, v in facts), style="bold")
    legend = Text.assemble(
        ("█", "cyan"),
        " prefill  ",
        ("█", "green"),
        " decode  ",
        ("░", "red"),
        " evicted  ",
        ("·", "red"),
        " gap  ",
        ("█", "magenta"),
        " recompute",
    )
    return Group(table, numbers, legend)
