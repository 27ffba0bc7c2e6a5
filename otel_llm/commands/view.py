"""``otel-llm view FILE``: a terminal waterfall of one request from an OTLP JSON traces file.

The time axis adapts its unit (µs, ms, s, min) to what it shows, every span with a duration gets at
least one cell, and lines are laid out to the terminal's width (60 columns or more), so bars never
collapse. ``--phase`` zooms on one phase (e.g. ``queue``, ``decode``) and ``--window`` on a stretch of
time; spans outside the window show ``‹`` / ``›`` at the edge they lie beyond. Output is coloured with
rich when it is installed and plain otherwise (every span has its own glyph, so colour is never needed).
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from otel_llm import semconv as sc
from otel_llm.waterfall import RequestTrace, SpanRecord, group_requests, load_otlp_json, pick_request

MIN_WIDTH = 60
# Glyph and colour per span name; distinct glyphs so the waterfall reads without colour too.
STYLES: dict[str, tuple[str, str]] = {
    sc.SPAN_REQUEST: ("═", "bright_white"),
    sc.SPAN_ADMISSION: ("╌", "blue"),
    sc.SPAN_QUEUE: ("▒", "yellow"),
    sc.SPAN_PREFILL: ("▓", "cyan"),
    sc.SPAN_DECODE: ("█", "green"),
    sc.SPAN_PREEMPTED: ("░", "red"),
    sc.SPAN_RECOMPUTE: ("▚", "magenta"),
    sc.SPAN_INSTANCE_PREFILL: ("━", "bright_cyan"),
    sc.SPAN_INSTANCE_DECODE: ("┅", "bright_green"),
    sc.SPAN_KV_TRANSFER: ("⇄", "bright_magenta"),
}
GAP = ("·", "red")  # the time a prefill or decode phase spent evicted
OTHER = ("─", "white")
LEGEND = (
    (sc.SPAN_REQUEST, "request"),
    (sc.SPAN_ADMISSION, "admission"),
    (sc.SPAN_QUEUE, "queue"),
    (sc.SPAN_PREFILL, "prefill"),
    (sc.SPAN_DECODE, "decode"),
    (sc.SPAN_PREEMPTED, "evicted"),
    (sc.SPAN_RECOMPUTE, "recompute"),
    (sc.SPAN_KV_TRANSFER, "KV transfer"),
    (sc.SPAN_INSTANCE_PREFILL, "prefill instance"),
    (sc.SPAN_INSTANCE_DECODE, "decode instance"),
)
Segment = tuple[str, str | None]  # text and its rich style (None: plain)
Line = list[Segment]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "view",
        help="print the waterfall of one request from an OTLP JSON traces file",
        description="Print the waterfall of one request from OTLP JSON traces files. Without --request, "
        "--trace-id or --slowest it shows the most preempted request (the longest of those); --list "
        "prints every request in the files to pick one.",
    )
    p.add_argument(
        "file",
        nargs="+",
        help="OTLP JSON lines traces files, or folders holding them (a disaggregated run writes one per "
        "worker: pass its folder to see both instances of a request)",
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument("--request", metavar="ID", help="the request id (llm.request.id); latest if repeated")
    which.add_argument("--trace-id", metavar="HEX", help="the trace id (32 hex digits, e.g. an x-trace-id)")
    which.add_argument("--slowest", action="store_true", help="the request with the longest duration")
    which.add_argument(
        "--list",
        action="store_true",
        help="list the requests instead (id, TTFT, e2e, preemptions, finish, trace id), in start order",
    )
    zoom = p.add_mutually_exclusive_group()
    zoom.add_argument(
        "--phase", help="zoom on one phase: admission, queue, prefill, decode, preempted, recompute"
    )
    zoom.add_argument(
        "--window",
        metavar="FROM:TO",
        help="zoom on a stretch from the request's start, e.g. 0:2s, 150ms:300ms, 1m:2m (bare numbers: s)",
    )
    p.add_argument(
        "--width",
        type=int,
        default=None,
        help=f"columns of the output (default: the terminal's; >= {MIN_WIDTH})",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        requests = group_requests(load_all(args.file))
        if args.list:
            if not requests:
                raise ValueError("no llm.request spans found; is this a traces file written by otel_llm?")
            print("\n".join(list_lines(requests)))
            return 0
        trace = pick_request(requests, request_id=args.request, slowest=args.slowest, trace_id=args.trace_id)
        window = zoom_window(trace, args.phase, args.window)
    except BrokenPipeError:
        raise  # the reader of the output left, not a problem with the files (otel_llm.cli says nothing)
    except (OSError, ValueError) as exc:
        print(f"otel-llm view: {exc}", file=sys.stderr)
        return 2
    width = args.width if args.width is not None else terminal_width()
    if width < MIN_WIDTH:
        print(f"otel-llm view: --width {width} is too narrow; pass {MIN_WIDTH} or more", file=sys.stderr)
        return 2
    emit(render_lines(trace, width, window))
    return 0


def load_all(paths: Sequence[str]) -> list[SpanRecord]:
    """The spans of every file named; a folder stands for every ``traces.jsonl`` below it."""
    records: list[SpanRecord] = []
    for name in paths:
        path = Path(name)
        files = sorted(path.rglob("traces.jsonl")) if path.is_dir() else [path]
        if not files:
            raise ValueError(f"{name}: no traces.jsonl in this folder")
        for file in files:
            records += load_otlp_json(file)
    return records


def list_lines(requests: Sequence[RequestTrace]) -> list[str]:
    """One line per request (a header first): what ``--request ID`` or ``--trace-id HEX`` picks from."""
    rows = [("request", "TTFT", "e2e", "preemptions", "finish", "trace")]
    for t in requests:
        a = t.root.attributes
        rows.append(
            (
                t.request_id,
                _time(a.get(sc.LLM_LATENCY_TTFT)),
                _time(a.get(sc.LLM_LATENCY_E2E, t.root.duration_s)),
                str(t.preemptions),
                ",".join(map(str, a.get(sc.GEN_AI_RESPONSE_FINISH_REASONS) or ["-"])),
                t.root.trace_id,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    right = {1, 2, 3}  # the numbers, aligned on their ends
    return [
        "  ".join(
            cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))
        ).rstrip()
        for row in rows
    ]


def terminal_width() -> int:
    """The terminal's columns (COLUMNS wins), at least MIN_WIDTH; 100 when not a terminal."""
    columns = shutil.get_terminal_size((100, 24)).columns
    return max(MIN_WIDTH, columns)


def emit(lines: Sequence[Line], file: object = None) -> None:
    """Print ``lines``: with rich's colours when rich is installed, else as plain text. Never wraps."""
    try:
        from rich.console import Console
        from rich.text import Text
    except ImportError:
        out = file if file is not None else sys.stdout
        for line in lines:
            print("".join(text for text, _ in line), file=out)  # type: ignore[arg-type]
        return
    console = Console(file=file, soft_wrap=True)  # type: ignore[arg-type]
    for line in lines:
        console.print(Text.assemble(*[(t, s or "") for t, s in line]))


# --- time ------------------------------------------------------------------------------------------

_UNITS = (("µs", 1e-6), ("ms", 1e-3), ("s", 1.0), ("min", 60.0))


def fmt_duration(seconds: float) -> str:
    """At most 8 characters, in the unit that fits: 850 µs, 12.3 ms, 35.9 s, 12.5 min."""
    if seconds < 0:
        return "-" + fmt_duration(-seconds)
    if seconds == 0:
        return "0"
    if seconds < 1e-3:
        value, unit = seconds * 1e6, "µs"
    elif seconds < 1:
        value, unit = seconds * 1e3, "ms"
    elif seconds < 100:
        value, unit = seconds, "s"
    else:
        value, unit = seconds / 60, "min"
    return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"


_SPAN_OF_TIME = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(us|µs|ms|s|m|min)?\s*$")


def parse_time(text: str) -> float:
    """``150ms`` / ``2s`` / ``1.5m`` / ``300us`` / ``2`` (seconds) -> seconds."""
    match = _SPAN_OF_TIME.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a time: write e.g. 150ms, 2s, 1.5m or 300us")
    scale = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, None: 1.0}[match.group(2)]
    return float(match.group(1)) * scale


def zoom_window(trace: RequestTrace, phase: str | None, window: str | None) -> tuple[int, int] | None:
    """The (start, end) epoch nanoseconds to draw, or None for the whole request."""
    root = trace.root
    if phase is not None:
        name = phase if phase.startswith("llm.") else f"llm.{phase}"
        spans = [s for s in trace.spans if s.name == name]
        if not spans:
            present = sorted({s.name.removeprefix("llm.") for s in trace.spans})
            raise ValueError(f"request {trace.request_id} has no {name} span; it has {', '.join(present)}")
        return min(s.start_ns for s in spans), max(s.end_ns for s in spans)
    if window is not None:
        start, sep, end = window.partition(":")
        if not sep:
            raise ValueError(f"--window {window!r}: write FROM:TO, e.g. 0:2s or 150ms:300ms")
        t0 = root.start_ns + int(parse_time(start) * 1e9) if start.strip() else root.start_ns
        t1 = root.start_ns + int(parse_time(end) * 1e9) if end.strip() else root.end_ns
        if t1 <= t0:
            raise ValueError(f"--window {window!r}: the end must come after the start")
        return t0, t1
    return None


# --- layout ----------------------------------------------------------------------------------------


def _tree(trace: RequestTrace) -> list[tuple[int, SpanRecord]]:
    rows: list[tuple[int, SpanRecord]] = []

    def walk(span: SpanRecord, depth: int) -> None:
        rows.append((depth, span))
        for child in sorted(trace.children(span), key=lambda s: s.start_ns):
            walk(child, depth + 1)

    walk(trace.root, 0)
    return rows


def _bar(span: SpanRecord, trace: RequestTrace, t0: int, t1: int, cols: int) -> Line:
    """The span's cells on [t0, t1] in ``cols`` columns; any span overlapping it gets a cell or more."""
    ns_per_col = max(1, t1 - t0) / cols

    def col(ns: int) -> int:
        return min(cols - 1, max(0, int((ns - t0) / ns_per_col)))

    glyph, style = STYLES.get(span.name, OTHER)
    cells: list[Segment] = [(" ", None)] * cols
    if span.end_ns < t0 or (span.end_ns == t0 and span.start_ns < t0):  # ends where the window starts
        cells[0] = ("‹", "dim")
    elif span.start_ns > t1 or (span.start_ns == t1 and span.end_ns > t1):
        cells[-1] = ("›", "dim")
    else:
        last = col(max(span.start_ns, span.end_ns - 1))
        for c in range(col(span.start_ns), last + 1):
            cells[c] = (glyph, style)
        if span.name in (sc.SPAN_PREFILL, sc.SPAN_DECODE):  # punch out the time the request was evicted
            for child in trace.children(span):
                if child.name == sc.SPAN_PREEMPTED and child.end_ns >= t0 and child.start_ns <= t1:
                    for c in range(col(child.start_ns), col(max(child.start_ns, child.end_ns - 1)) + 1):
                        cells[c] = GAP
    merged: Line = []
    for text, st in cells:
        if merged and merged[-1][1] == st:
            merged[-1] = (merged[-1][0] + text, st)
        else:
            merged.append((text, st))
    return merged


def render_lines(trace: RequestTrace, width: int = 100, window: tuple[int, int] | None = None) -> list[Line]:
    """The waterfall of ``trace`` in lines of at most ``width`` columns (>= MIN_WIDTH), then its numbers."""
    width = max(MIN_WIDTH, width)
    root = trace.root
    t0, t1 = window if window is not None else (root.start_ns, root.end_ns)
    t1 = max(t1, t0 + 1)
    rows = _tree(trace)
    labels = ["  " * depth + span.name for depth, span in rows]
    name_w = min(max(len(label) for label in labels), 24)
    time_w = 8
    cols = width - name_w - 2 * (time_w + 1) - 2
    lines = _wrap([[(f"request {trace.request_id}", "bold")], [(f"trace {root.trace_id}", "bold")]], width)
    left, right = fmt_duration((t0 - root.start_ns) / 1e9), fmt_duration((t1 - root.start_ns) / 1e9)
    axis = left + " " * max(1, cols - len(left) - len(right)) + right
    header = f"{'span':<{name_w}} {'start':>{time_w}} {'duration':>{time_w}}  "
    lines.append([(header, "bold"), (axis, "bold")])
    for label, (_, span) in zip(labels, rows):
        if len(label) > name_w:
            label = label[: name_w - 1] + "…"
        start = fmt_duration((span.start_ns - root.start_ns) / 1e9)
        lead = f"{label:<{name_w}} {start:>{time_w}} {fmt_duration(span.duration_s):>{time_w}}  "
        lines.append([(lead, None), *_bar(span, trace, t0, t1, cols)])
    lines += _wrap([[(fact, "bold")] for fact in _numbers(trace)], width)
    lines += _wrap(_legend(trace), width)
    return lines


def _legend(trace: RequestTrace) -> list[Line]:
    """One entry per glyph drawn for ``trace``: a single-instance request shows no KV-transfer or
    instance entries, a request never evicted no gap."""
    drawn = {span.name for span in trace.spans}
    entries: list[Line] = [[STYLES[name], (f" {word}", None)] for name, word in LEGEND if name in drawn]
    phases = [s for s in trace.spans if s.name in (sc.SPAN_PREFILL, sc.SPAN_DECODE)]
    if any(child.name == sc.SPAN_PREEMPTED for phase in phases for child in trace.children(phase)):
        entries.append([GAP, (" evicted (gap in its phase)", None)])
    return entries


def _wrap(items: list[Line], width: int, sep: str = "  ") -> list[Line]:
    """``items`` side by side, ``sep`` apart, in as many lines of at most ``width`` columns as needed."""
    lines: list[Line] = []
    line: Line = []
    used = 0
    for item in items:
        size = sum(len(text) for text, _ in item)
        if line and used + len(sep) + size > width:
            lines.append(line)
            line, used = [], 0
        if line:
            line.append((sep, None))
            used += len(sep)
        line += item
        used += size
    if line:
        lines.append(line)
    return lines


def _time(value: object) -> str:
    return fmt_duration(float(value)) if isinstance(value, (int, float)) else "-"


def _covered_s(spans: list[SpanRecord]) -> float:
    """Seconds covered by the union of the spans' intervals (overlaps counted once)."""
    total, end = 0, None
    for s in sorted(spans, key=lambda s: s.start_ns):
        start = s.start_ns if end is None else max(s.start_ns, end)
        if s.end_ns > start:
            total += s.end_ns - start
        end = s.end_ns if end is None else max(end, s.end_ns)
    return total / 1e9


def _numbers(trace: RequestTrace) -> list[str]:
    a = dict(trace.root.attributes)
    for span in trace.spans:  # a disaggregated request: the prefill instance's own values
        if span.name == sc.SPAN_INSTANCE_PREFILL:
            a.setdefault(sc.LLM_LATENCY_PREFILL, span.attributes.get(sc.LLM_LATENCY_PREFILL))
    preempted = [s for s in trace.spans if s.name == sc.SPAN_PREEMPTED]
    recompute = [s for s in trace.spans if s.name == sc.SPAN_RECOMPUTE]
    facts = [
        ("TTFT", _time(a.get(sc.LLM_LATENCY_TTFT))),
        ("queue", _time(a.get(sc.LLM_LATENCY_QUEUE))),
        ("prefill", _time(a.get(sc.LLM_LATENCY_PREFILL))),
        # llm.latency.decode: first to last token (0 for one token); the llm.decode span runs from the
        # first token to the request's end, so the two differ by the last step: name which this is.
        ("decode (first to last token)", _time(a.get(sc.LLM_LATENCY_DECODE))),
        ("e2e", _time(a.get(sc.LLM_LATENCY_E2E, trace.root.duration_s))),
        ("preemptions", str(trace.preemptions)),
        ("evicted for", _time(_covered_s(preempted)) if preempted else "-"),
        ("recomputing", _time(_covered_s(recompute)) if recompute else "-"),
        (
            "tokens in/out",
            f"{a.get(sc.GEN_AI_USAGE_INPUT_TOKENS, '-')}/{a.get(sc.GEN_AI_USAGE_OUTPUT_TOKENS, '-')}",
        ),
        ("finish", ",".join(map(str, a.get(sc.GEN_AI_RESPONSE_FINISH_REASONS) or ["-"]))),
    ]
    cached = a.get(sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS)
    if cached is not None:  # after tokens in/out
        facts.insert(len(facts) - 1, ("prompt tokens from the prefix cache", str(cached)))
    work = _recompute_work(trace)
    if work is not None:  # after the preemptions
        facts.insert(facts.index(("preemptions", str(trace.preemptions))) + 1, ("recomputes", work))
    if trace.steps:
        facts.append(("engine steps", str(trace.steps)))
    return [f"{k}: {v}" for k, v in facts]


def _recompute_work(trace: RequestTrace) -> str | None:
    """What the request's recomputes cost and saved, in tokens, from the sums on ``llm.request`` (and,
    for a disaggregated request, on its prefill instance's span); None when the engine did not say."""
    carriers = [trace.root] + [s for s in trace.spans if s.name == sc.SPAN_INSTANCE_PREFILL]
    recomputed = [s.attributes.get(sc.LLM_PREEMPTIONS_RECOMPUTE_TOKENS) for s in carriers]
    cached = [s.attributes.get(sc.LLM_PREEMPTIONS_RECOMPUTE_CACHED_TOKENS) for s in carriers]
    if all(v is None for v in cached):
        return None
    saved = f"{sum(int(v) for v in cached if v is not None)} read from the prefix cache"
    if all(v is None for v in recomputed):
        return saved
    return f"{sum(int(v) for v in recomputed if v is not None)} tokens computed again, {saved}"
