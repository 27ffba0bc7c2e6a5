"""One request's waterfall as lines of text: a row per span, its numbers, and a legend of what is drawn.

The time axis adapts its unit (µs, ms, s, min) to what it shows, every span with a duration gets at
least one cell, and lines are laid out to a width of 60 columns or more, so bars never collapse. Every
span name has its own glyph, so the waterfall reads without colour; ``emit`` adds rich's colours when rich
is installed. A preempted row carries the tokens its rescheduling computed again and found in the prefix
cache (``llm.recompute.tokens`` / ``.cached_tokens`` of the ``llm.recompute`` span that follows it).
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence

from otel_llm import semconv as sc
from otel_llm.kit.waterfall import REASON_ABANDONED, RequestTrace, SpanRecord

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
GAP = ("·", "red")  # the time a prefill or decode phase spent preempted
STALL = ("╳", "bright_red")  # a stall of the decode phase (llm.stall), other than its own preemption
OTHER = ("─", "white")  # a span of another name (e.g. llm.engine.step)
BEFORE = ("‹", "dim")  # a span that ends before the zoomed stretch (--phase / --window)
AFTER = ("›", "dim")  # a span that starts after it
FIGURES = "italic"  # the style of the token figures written beside a preempted row's bar
# What each glyph stands for, in the legend's order; the legend lists those drawn.
LEGEND: tuple[tuple[tuple[str, str], str], ...] = (
    (STYLES[sc.SPAN_REQUEST], "request"),
    (STYLES[sc.SPAN_ADMISSION], "admission"),
    (STYLES[sc.SPAN_QUEUE], "queue"),
    (STYLES[sc.SPAN_PREFILL], "prefill"),
    (STYLES[sc.SPAN_DECODE], "decode"),
    (STYLES[sc.SPAN_PREEMPTED], "preempted"),
    (STYLES[sc.SPAN_RECOMPUTE], "recompute"),
    (STYLES[sc.SPAN_KV_TRANSFER], "KV transfer"),
    (STYLES[sc.SPAN_INSTANCE_PREFILL], "prefill instance"),
    (STYLES[sc.SPAN_INSTANCE_DECODE], "decode instance"),
    (GAP, "preempted (gap in its phase)"),
    (STALL, "stalled (llm.stall; the longest one is told below)"),
    (OTHER, "other span"),
    (BEFORE, "ends before the zoomed stretch"),
    (AFTER, "starts after the zoomed stretch"),
)
# What a finish reason means, where the bare word would not say it.
FINISH_WORDS = {REASON_ABANDONED: "never finished: otel-llm gave up on it"}
Segment = tuple[str, str | None]  # text and its rich style (None: plain)
Line = list[Segment]


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


# Starts closer to the request's start than this are drawn as 0. A disaggregated request's spans come
# from two processes, each turning monotonic time into wall-clock time with its own offset, so the same
# instant (the arrival) can differ by a few nanoseconds between them: no step of the request.
_START_RESOLUTION_S = 1e-6


def fmt_start(offset_s: float) -> str:
    """A span's start, seconds after its request's, as ``fmt_duration`` writes it; 0 under 1 µs."""
    return "0" if abs(offset_s) < _START_RESOLUTION_S else fmt_duration(offset_s)


def fmt_time(value: object) -> str:
    """A number of seconds as ``fmt_duration`` writes it; ``-`` when it is not a number."""
    return fmt_duration(float(value)) if isinstance(value, (int, float)) else "-"


def finish_text(trace: RequestTrace) -> str:
    """The finish reasons, comma-separated (``-`` for none)."""
    return ",".join(trace.finish_reasons) or "-"


# --- rows -------------------------------------------------------------------------------------------


def _tree(trace: RequestTrace) -> list[tuple[int, SpanRecord]]:
    rows: list[tuple[int, SpanRecord]] = []

    def walk(span: SpanRecord, depth: int) -> None:
        rows.append((depth, span))
        for child in sorted(trace.children(span), key=lambda s: s.start_ns):
            walk(child, depth + 1)

    walk(trace.root, 0)
    return rows


def _cells(span: SpanRecord, trace: RequestTrace, t0: int, t1: int, cols: int) -> list[Segment]:
    """The span's cells on [t0, t1] in ``cols`` columns; any span overlapping it gets a cell or more."""
    ns_per_col = max(1, t1 - t0) / cols

    def col(ns: int) -> int:
        return min(cols - 1, max(0, int((ns - t0) / ns_per_col)))

    cells: list[Segment] = [(" ", None)] * cols
    if span.end_ns < t0 or (span.end_ns == t0 and span.start_ns < t0):  # ends where the window starts
        cells[0] = BEFORE
    elif span.start_ns > t1 or (span.start_ns == t1 and span.end_ns > t1):
        cells[-1] = AFTER
    else:
        style = STYLES.get(span.name, OTHER)
        for c in range(col(span.start_ns), col(max(span.start_ns, span.end_ns - 1)) + 1):
            cells[c] = style
        if span.name in (sc.SPAN_PREFILL, sc.SPAN_DECODE):  # punch out the time the request was preempted
            for child in trace.children(span):
                if child.name == sc.SPAN_PREEMPTED and child.end_ns >= t0 and child.start_ns <= t1:
                    for c in range(col(child.start_ns), col(max(child.start_ns, child.end_ns - 1)) + 1):
                        cells[c] = GAP
            for start, end, _ in stalls(span):
                if end >= t0 and start <= t1:
                    for c in range(col(start), col(max(start, end - 1)) + 1):
                        cells[c] = STALL
    return cells


def stalls(span: SpanRecord) -> list[tuple[int, int, dict[str, object]]]:
    """(start, end epoch ns, attributes) of the span's ``llm.stall`` events but its own preemptions'
    (drawn as the gap already)."""
    out = []
    for name, at, attrs in span.events:
        duration = attrs.get(sc.LLM_STALL_DURATION)
        if name != sc.EVENT_STALL or attrs.get(sc.LLM_STALL_CAUSE) == sc.STALL_PREEMPTION:
            continue
        if isinstance(duration, (int, float)):
            out.append((at - int(duration * 1e9), at, attrs))
    return out


def stall_words(attrs: dict[str, object]) -> str:
    """One ``llm.stall`` event in words: which token waited how long, and for what."""
    token, cause = attrs.get(sc.LLM_STALL_TOKEN, "?"), attrs.get(sc.LLM_STALL_CAUSE, sc.STALL_UNKNOWN)
    text = f"token {token} waited {fmt_time(attrs.get(sc.LLM_STALL_DURATION))}"
    steps = attrs.get(sc.LLM_STALL_STEPS)
    in_steps = f"in the same {steps} steps" if steps != 1 else "in the same step"
    if cause in (sc.STALL_PREFILL, sc.STALL_RECOMPUTE):
        names = list(attrs.get(sc.LLM_STALL_REQUESTS) or ())  # type: ignore[call-overload]
        counts = list(attrs.get(sc.LLM_STALL_REQUEST_TOKENS) or ())  # type: ignore[call-overload]
        tokens = attrs.get(
            sc.LLM_STALL_PREFILL_TOKENS if cause == sc.STALL_PREFILL else sc.LLM_STALL_RECOMPUTE_TOKENS
        )
        verb = "prefilled" if cause == sc.STALL_PREFILL else "recomputed"
        who = f"{len(names)} other request{'s' if len(names) != 1 else ''}"
        named = ", ".join(f"{rid} {n:,}" for rid, n in zip(names, counts))
        amount = f"{tokens:,}" if isinstance(tokens, int) else "?"
        return f"{text}: {who} {verb} {amount} tokens {in_steps} ({named})"
    in_gap = "the one step in the gap" if steps == 1 else f"the {steps} steps in the gap"
    if cause == sc.STALL_SLOW_STEP:
        return text + _slow_step(attrs)
    return text + {
        sc.STALL_PREEMPTION: ": it was preempted",
        sc.STALL_IDLE: ": the engine ran no step for most of it",
        sc.STALL_SKIPPED: f": the engine ran steps without it ({in_gap})",
    }.get(str(cause), f": nothing in {in_gap} explains it")


def _slow_step(attrs: dict[str, object]) -> str:
    """``: the engine's step took 28 ms, 6.1x its typical 4.6 ms``, as far as the event says."""
    took, typical = attrs.get(sc.LLM_STALL_STEP_TIME), attrs.get(sc.LLM_STALL_TYPICAL_GAP)
    if not isinstance(took, (int, float)):
        return ": the engine's step was slow, with nothing in it to blame"
    text = f": the engine's step took {fmt_time(took)}"
    if isinstance(typical, (int, float)) and typical > 0:
        text += f", {took / typical:.1f}x the typical {fmt_time(typical)}"
    return text + ", with nothing in it to blame"


def _merged(cells: list[Segment]) -> Line:
    """Runs of cells of one style as one segment each."""
    merged: Line = []
    for text, st in cells:
        if merged and merged[-1][1] == st:
            merged[-1] = (merged[-1][0] + text, st)
        else:
            merged.append((text, st))
    return merged


def recompute_after(preempted: SpanRecord, trace: RequestTrace) -> SpanRecord | None:
    """The ``llm.recompute`` span of the preemption ``preempted`` stands for: its sibling that starts
    when the request was rescheduled (where ``preempted`` ends); None when it was never rescheduled."""
    siblings = [s for s in trace.spans if s.parent_id == preempted.parent_id and s.name == sc.SPAN_RECOMPUTE]
    return next((s for s in siblings if s.start_ns == preempted.end_ns), None)


def preemption_figures(preempted: SpanRecord, trace: RequestTrace) -> tuple[int | None, int] | None:
    """(tokens computed again, tokens found in the prefix cache) at the rescheduling after
    ``preempted``; the first is None when the engine gave no prompt length. None when nothing was said."""
    recompute = recompute_after(preempted, trace)
    if recompute is None:
        return None
    cached = recompute.attributes.get(sc.LLM_RECOMPUTE_CACHED_TOKENS)
    if not isinstance(cached, int):
        return None
    again = recompute.attributes.get(sc.LLM_RECOMPUTE_TOKENS)
    return (again if isinstance(again, int) else None), cached


def _figure_texts(again: int | None, cached: int) -> list[str]:
    """The figures in words, the longest first: the first that fits beside the bar is written."""
    if again is None:
        return [f"{cached} {_tokens(cached)} cached", f"{cached} cached"]
    return [f"{again} {_tokens(again)} recomputed, {cached} cached", f"{again} recomputed, {cached} cached"]


def _tokens(n: int) -> str:
    return "token" if n == 1 else "tokens"


def _write_beside(cells: list[Segment], texts: list[str]) -> bool:
    """Write the first of ``texts`` that fits into the blank cells after the bar (one blank between),
    else before it; False when none fits."""
    drawn = [c for c, (text, _) in enumerate(cells) if text != " "]
    first, last = (drawn[0], drawn[-1]) if drawn else (0, -1)
    for text in texts:
        if last + 2 + len(text) <= len(cells):
            at = last + 2
        elif first - 1 - len(text) >= 0:
            at = first - 1 - len(text)
        else:
            continue
        for i, char in enumerate(text):
            cells[at + i] = (char, FIGURES)
        return True
    return False


def render_lines(trace: RequestTrace, width: int = 100, window: tuple[int, int] | None = None) -> list[Line]:
    """The waterfall of ``trace`` in lines of at most ``width`` columns (>= MIN_WIDTH), then its numbers
    and the legend of the glyphs drawn. ``window``: the (start, end) epoch ns to draw, None for all."""
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
    drawn: set[tuple[str, str]] = set()
    unwritten: list[tuple[int | None, int]] = []  # preemption figures with no room on their row
    for label, (_, span) in zip(labels, rows):
        if len(label) > name_w:
            label = label[: name_w - 1] + "…"
        start = fmt_start((span.start_ns - root.start_ns) / 1e9)
        lead = f"{label:<{name_w}} {start:>{time_w}} {fmt_duration(span.duration_s):>{time_w}}  "
        cells = _cells(span, trace, t0, t1, cols)
        drawn |= {cell for cell in cells if cell[0] != " "}  # type: ignore[misc]
        figures = preemption_figures(span, trace) if span.name == sc.SPAN_PREEMPTED else None
        if figures is not None and not _write_beside(cells, _figure_texts(*figures)):
            unwritten.append(figures)
        lines.append([(lead, None), *_merged(cells)])
    lines += _wrap([[(fact, "bold")] for fact in numbers(trace, unwritten)], width)
    lines += _wrap(_legend(drawn, trace), width)
    return lines


def _legend(drawn: set[tuple[str, str]], trace: RequestTrace) -> list[Line]:
    """One entry per glyph in ``drawn``, in LEGEND's order: a single-instance request shows no KV-transfer
    or instance entries, a request never preempted no gap, a whole request no zoom edges."""
    entries: list[Line] = []
    for style, word in LEGEND:
        if style not in drawn:
            continue
        if style == OTHER:  # name them: llm.engine.step, or whatever another tool added
            known = set(STYLES)
            word = ", ".join(sorted({s.name for s in trace.spans if s.name not in known}))
        entries.append([style, (f" {word}", None)])
    return entries


def _wrap(items: list[Line], width: int, sep: str = "  ") -> list[Line]:
    """``items`` side by side, ``sep`` apart, in as many lines of at most ``width`` columns as needed; a
    plain item wider than that is broken at its spaces."""
    lines: list[Line] = []
    line: Line = []
    used = 0
    for item in (piece for whole in items for piece in _pieces(whole, width)):
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


def _pieces(item: Line, width: int) -> list[Line]:
    """``item``, or for a one-segment item wider than ``width`` its words in pieces that fit."""
    if len(item) != 1 or len(item[0][0]) <= width:
        return [item]
    text, style = item[0]
    pieces, piece = [], ""
    for word in text.split(" "):
        if piece and len(piece) + 1 + len(word) > width:
            pieces.append(piece)
            piece = word
        else:
            piece = f"{piece} {word}" if piece else word
    return [[(p, style)] for p in [*pieces, piece]]


# --- numbers ----------------------------------------------------------------------------------------


def _covered_s(spans: list[SpanRecord]) -> float:
    """Seconds covered by the union of the spans' intervals (overlaps counted once)."""
    total, end = 0, None
    for s in sorted(spans, key=lambda s: s.start_ns):
        start = s.start_ns if end is None else max(s.start_ns, end)
        if s.end_ns > start:
            total += s.end_ns - start
        end = s.end_ns if end is None else max(end, s.end_ns)
    return total / 1e9


def numbers(trace: RequestTrace, unwritten: Sequence[tuple[int | None, int]] = ()) -> list[str]:
    """The request's numbers as ``name: value`` facts. ``unwritten``: the preemptions' token figures
    that found no room on their rows, listed here instead."""
    a = dict(trace.root.attributes)
    for span in trace.spans:  # a disaggregated request: the prefill instance's own values
        if span.name == sc.SPAN_INSTANCE_PREFILL:
            a.setdefault(sc.LLM_LATENCY_PREFILL, span.attributes.get(sc.LLM_LATENCY_PREFILL))
    preempted = [s for s in trace.spans if s.name == sc.SPAN_PREEMPTED]
    recompute = [s for s in trace.spans if s.name == sc.SPAN_RECOMPUTE]
    facts = [
        ("TTFT", fmt_time(a.get(sc.LLM_LATENCY_TTFT))),
        ("queue", fmt_time(a.get(sc.LLM_LATENCY_QUEUE))),
        ("prefill", fmt_time(a.get(sc.LLM_LATENCY_PREFILL))),
        # llm.latency.decode: first to last token (0 for one token); the llm.decode span runs from the
        # first token to the request's end, so the two differ by the last step: name which this is.
        ("decode (first to last token)", _decode_text(trace, a.get(sc.LLM_LATENCY_DECODE))),
        ("e2e", fmt_time(a.get(sc.LLM_LATENCY_E2E, trace.root.duration_s))),
        ("preemptions", str(trace.preemptions)),
        ("preempted for", fmt_time(_covered_s(preempted)) if preempted else "-"),
        ("recomputing", fmt_time(_covered_s(recompute)) if recompute else "-"),
        (
            "tokens in/out",
            f"{a.get(sc.GEN_AI_USAGE_INPUT_TOKENS, '-')}/{a.get(sc.GEN_AI_USAGE_OUTPUT_TOKENS, '-')}",
        ),
        ("finish", _finish_words(trace)),
    ]
    cached = a.get(sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS)
    if cached is not None:  # after tokens in/out
        facts.insert(len(facts) - 1, ("prompt tokens from the prefix cache", str(cached)))
    work = _recompute_work(trace)
    at = facts.index(("preemptions", str(trace.preemptions))) + 1
    if unwritten:  # after the preemptions, before their sums
        each = ", ".join(f"{'?' if again is None else again}/{cached}" for again, cached in unwritten)
        facts.insert(at, ("per preemption, tokens recomputed/cached", each))
    if work is not None:  # after the preemptions
        facts.insert(at, ("recomputes", work))
    stalled = _stalls_text(a)
    if stalled is not None:  # after the preemptions' figures, before the tokens
        at = [k for k, _ in facts].index("tokens in/out")
        facts.insert(at, ("stalls", stalled))
        longest = _longest_stall(trace)
        if longest is not None:
            facts.insert(at + 1, ("longest stall", longest))
    spent = engine_time_text(a)
    if spent is not None:  # after the stalls, before the tokens
        facts.insert([k for k, _ in facts].index("tokens in/out"), ("engine time", spent))
    if trace.steps:
        facts.append(("engine steps", str(trace.steps)))
    return [f"{k}: {v}" for k, v in facts]


def engine_time_text(a: dict[str, object]) -> str | None:
    """``12.4 ms, 3.1 ms of it recompute work``: the request's share of the engine's steps
    (``llm.engine.time``); None when the engine did not report its batches."""
    spent, again = a.get(sc.LLM_ENGINE_TIME), a.get(sc.LLM_ENGINE_TIME_RECOMPUTE)
    if not isinstance(spent, (int, float)):
        return None
    if isinstance(again, (int, float)) and again > 0:
        return f"{fmt_time(spent)}, {fmt_time(again)} of it recompute work"
    return fmt_time(spent)


def _longest_stall(trace: RequestTrace) -> str | None:
    """The request's longest ``llm.stall`` event in words, or None."""
    timed = [
        e for _, e in trace.events(sc.EVENT_STALL) if isinstance(e.get(sc.LLM_STALL_DURATION), (int, float))
    ]
    if not timed:
        return None
    return stall_words(max(timed, key=lambda e: e[sc.LLM_STALL_DURATION]))  # type: ignore[arg-type,return-value]


def stalled_by_cause(a: dict[str, object]) -> str:
    """``prefill 120 ms, preemption 18 ms``: the request's seconds stalled by cause (``llm.stalled.<cause>``
    on ``llm.request``), the longest first; empty when it has none."""
    prefix = sc.LLM_STALLED_PREFIX
    by_cause = [(k[len(prefix) :], v) for k, v in a.items() if k.startswith(prefix)]
    by_cause.sort(key=lambda item: -float(item[1]) if isinstance(item[1], (int, float)) else 0.0)
    return ", ".join(f"{cause} {fmt_time(v)}" for cause, v in by_cause)


def _stalls_text(a: dict[str, object]) -> str | None:
    """``llm.stalls`` with the seconds by cause; None when the engine did not report its batches."""
    count = a.get(sc.LLM_STALLS)
    if count is None:
        return None
    causes = stalled_by_cause(a)
    return f"{count} ({causes})" if causes else str(count)


def _decode_text(trace: RequestTrace, value: object) -> str:
    """The decode figure; for 0 beside a longer ``llm.decode`` span (a one-token answer), why they differ."""
    text = fmt_time(value)
    spans = [s for s in trace.spans if s.name == sc.SPAN_DECODE]
    if value == 0 and any(s.end_ns > s.start_ns for s in spans):
        text += " (one token; the llm.decode row runs on to the request's end)"
    return text


def _finish_words(trace: RequestTrace) -> str:
    """The finish reasons, each with what it means where the word alone would not say it."""
    reasons = trace.finish_reasons
    if not reasons:
        return "-"
    text = ",".join(f"{r} ({FINISH_WORDS[r]})" if r in FINISH_WORDS else r for r in reasons)
    # The spans it was in when it stopped (docs/lifecycle.md): the phase, then its open preemption.
    cut = sorted(
        (s for s in trace.spans if s.attributes.get(sc.LLM_CUT_SHORT) is True), key=lambda s: s.start_ns
    )
    if cut:
        text += ", cut short in " + " and ".join(s.name for s in cut)
    return text


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
