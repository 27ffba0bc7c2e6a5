"""The waterfall's rows and legend: every glyph drawn is in the legend (and nothing else is), whole or
zoomed, with step spans too; each preempted row carries the tokens its own rescheduling recomputed and
found cached, as the ``llm.recompute`` span that follows it in the file says, from a real tracker and
from the real torch engine."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from otel_llm import RequestTracker
from otel_llm import semconv as sc
from otel_llm.kit.cli import main
from tests.view_files import T0, file_spans, tracker_file

FIGURES = re.compile(r"(\d+) tokens? recomputed, (\d+) cached")
PROMPT = 20


def preempted_twice(tracker: RequestTracker) -> None:
    """A decode preempted twice, rescheduled with a different prefix-cache hit each time, after 0.2 s of
    admission; and a short request before it."""
    tracker.queued("short", ts=T0 - 1, arrival_ts=T0 - 1)
    tracker.finished("short", ts=T0 - 0.5)
    tracker.queued("r", prompt_tokens=PROMPT, ts=T0 + 0.2, arrival_ts=T0)
    tracker.scheduled(["r"], ts=T0 + 0.3)
    for k in range(3):
        tracker.tokens(["r"], ts=T0 + 0.4 + 0.1 * k)
    tracker.preempted(["r"], ts=T0 + 1)
    tracker.scheduled(["r"], cached_tokens=[16], ts=T0 + 2)
    tracker.tokens(["r"], ts=T0 + 2.5)
    tracker.tokens(["r"], ts=T0 + 2.6)
    tracker.preempted(["r"], ts=T0 + 3)
    tracker.scheduled(["r"], cached_tokens=[8], ts=T0 + 4)
    tracker.tokens(["r"], ts=T0 + 4.5)
    tracker.finished("r", reason="length", ts=T0 + 5)


@pytest.fixture
def preempted_file(tmp_path: Path) -> Path:
    return tracker_file(tmp_path, preempted_twice)


def view(capsys, *args: str) -> str:
    assert main(["view", *args]) == 0
    return capsys.readouterr().out


def layout(out: str) -> tuple[list[str], list[str], list[str]]:
    """(the bar part of each span row, the fact lines, the legend entries) of a waterfall."""
    lines = out.splitlines()
    (head,) = [i for i, line in enumerate(lines) if line.startswith("span ")]
    bars_from = lines[head].index("duration") + len("duration") + 2
    facts = next(i for i, line in enumerate(lines) if line.startswith("TTFT:"))
    legend = len(lines)  # the legend: the last lines, each entry a glyph and its words
    while not (lines[legend - 1][0].isalnum() or lines[legend - 1][0] == "("):
        legend -= 1
    entries = [e for line in lines[legend:] for e in line.split("  ") if e]
    return [line[bars_from:] for line in lines[head + 1 : facts]], lines[facts:legend], entries


def drawn_glyphs(bars: list[str]) -> set[str]:
    """The glyphs in the bars: not the blanks, nor the letters, digits and commas of the token figures."""
    return {c for bar in bars for c in bar if not (c.isspace() or c.isalnum() or c == ",")}


@pytest.mark.parametrize(
    "zoom",
    [[], ["--phase", "decode"], ["--phase", "recompute"], ["--window", "100ms:300ms"], ["--window", "2s:"]],
)
@pytest.mark.parametrize("detail", ["phases", "steps"])
def test_the_legend_names_every_glyph_drawn_and_no_other(
    capsys, tmp_path: Path, zoom: list[str], detail: str
) -> None:
    path = tracker_file(tmp_path, preempted_twice, trace_detail=detail)
    for width in ("60", "120"):
        out = view(capsys, str(path), "--request", "r", "--width", width, *zoom)
        bars, _, entries = layout(out)
        drawn = drawn_glyphs(bars)
        legend = {entry[0]: entry[2:] for entry in entries}
        assert all(entry[1] == " " and entry[2:].strip() for entry in entries), entries  # glyph, words
        assert drawn == set(legend), (zoom, detail, drawn ^ set(legend), out)
        if zoom:  # a zoom leaves spans outside it: their edge marks are drawn, so explained
            assert drawn & {"‹", "›"}, out
        if detail == "steps" and not zoom:  # llm.engine.step rows: named in the legend
            assert [glyph for glyph, words in legend.items() if sc.SPAN_ENGINE_STEP in words], legend


def recompute_figures(path: Path, trace_id: str) -> list[tuple[int, int]]:
    """From the file, in order of the preemptions: (llm.recompute.tokens, .cached_tokens) of the
    recompute span that starts where each llm.preempted span of the trace ends."""
    spans = [s for s in file_spans(path) if s["traceId"] == trace_id]
    recomputes = {s["startTimeUnixNano"]: s for s in spans if s["name"] == sc.SPAN_RECOMPUTE}
    figures = []
    for p in sorted(
        (s for s in spans if s["name"] == sc.SPAN_PREEMPTED), key=lambda s: int(s["startTimeUnixNano"])
    ):
        attrs = recomputes[p["endTimeUnixNano"]]["attrs"]
        figures.append((int(attrs[sc.LLM_RECOMPUTE_TOKENS]), int(attrs[sc.LLM_RECOMPUTE_CACHED_TOKENS])))
    return figures


def row_figures(out: str) -> list[tuple[int, int] | None]:
    """The figures written on each llm.preempted row, in row order (None: none on that row)."""
    rows = [line for line in out.splitlines() if line.lstrip().startswith(sc.SPAN_PREEMPTED + " ")]
    found = [FIGURES.search(row) for row in rows]
    return [(int(m.group(1)), int(m.group(2))) if m else None for m in found]


def trace_id_of(out: str) -> str:
    return out.split("trace ", 1)[1].split()[0]


def listed_figures(out: str) -> list[tuple[int, int]]:
    """The figures listed under the waterfall, for the preempted rows that had no room for them."""
    _, facts, _ = layout(out)
    listed = [f for f in "  ".join(facts).split("  ") if f.startswith("per preemption")]
    pairs = listed[0].split(": ", 1)[1].split(", ") if listed else []
    return [(int(a), int(b)) for a, b in (pair.split("/") for pair in pairs)]


def test_each_preempted_row_carries_its_own_recompute_figures(capsys, preempted_file: Path) -> None:
    for width in ("100", "160"):
        out = view(capsys, str(preempted_file), "--request", "r", "--width", width)
        expected = recompute_figures(preempted_file, trace_id_of(out))
        # The documented rule: prompt + output tokens before the preemption - tokens found cached.
        assert expected == [(PROMPT + 3 - 16, 16), (PROMPT + 5 - 8, 8)]
        assert row_figures(out) == expected and listed_figures(out) == [], out


def test_figures_without_room_on_their_row_go_under_the_waterfall(capsys, preempted_file: Path) -> None:
    # 60 columns leave 23 for the bars: no room beside either preemption's bar.
    out = view(capsys, str(preempted_file), "--request", "r", "--width", "60")
    expected = recompute_figures(preempted_file, trace_id_of(out))
    assert row_figures(out) == [None, None] and listed_figures(out) == expected, out


def test_a_zoom_on_a_preemption_lists_its_figures_under_the_waterfall(capsys, preempted_file: Path) -> None:
    # Zoomed on the first preemption (1 s to 2 s after the request's start): its bar fills the row.
    out = view(capsys, str(preempted_file), "--request", "r", "--window", "1s:2s", "--width", "100")
    first, second = recompute_figures(preempted_file, trace_id_of(out))
    assert row_figures(out) == [None, second], out  # the second preemption lies after the window: room
    assert listed_figures(out) == [first], out


def test_the_real_engine_s_preempted_rows_carry_its_figures(capsys, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="the reference engine needs the torch extra")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from otel_llm.export.otlp_json import OtlpJsonSpanExporter
    from otel_llm.kit.engine import EngineConfig, LLMEngine

    torch.set_num_threads(1)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(OtlpJsonSpanExporter(tmp_path)))
    tracker = RequestTracker(tracer_provider=provider, model="otel-llm-tiny")
    engine = LLMEngine(EngineConfig(num_kv_blocks=8), tracker=tracker)  # as examples/engine_demo.py
    prompts = ["Tell me about paged attention.", "What is a KV cache?", "Why preempt?", "Hello " * 10]
    engine.generate(prompts, max_tokens=40)
    provider.shutdown()
    assert engine.num_preemptions > 0
    path = tmp_path / "traces.jsonl"
    out = view(capsys, str(path), "--width", "120")  # the most preempted request
    expected = recompute_figures(path, trace_id_of(out))
    assert expected and row_figures(out) == expected, out


def failed_while_evicted(tracker: RequestTracker) -> None:
    """A decode preempted and never rescheduled: the engine fails it while it is evicted."""
    tracker.queued("r", prompt_tokens=PROMPT, ts=T0)
    tracker.scheduled(["r"], ts=T0 + 0.1)
    tracker.tokens(["r"], ts=T0 + 0.2)
    tracker.preempted(["r"], ts=T0 + 0.3)
    tracker.finished("r", reason="error", error="KV cache lost", ts=T0 + 0.8)


def test_the_finish_line_names_the_spans_a_request_was_cut_short_in(capsys, tmp_path: Path) -> None:
    out = view(capsys, str(tracker_file(tmp_path, failed_while_evicted)))
    (finish,) = [line for line in out.splitlines() if "finish:" in line]
    assert "finish: error, cut short in llm.decode and llm.preempted" in finish


def test_a_request_that_ended_as_it_should_names_no_span(capsys, preempted_file: Path) -> None:
    out = view(capsys, str(preempted_file), "--request", "r")
    assert "cut short" not in out
    assert "finish: length" in out


def test_a_start_nanoseconds_after_the_requests_reads_0() -> None:
    """A disaggregated request's instance span starts at the arrival as the prefill process's clock
    offset places it, the request span as the decode process's places it: 11 ns apart in a real run."""
    from otel_llm.kit.waterfall import SpanRecord, group_requests
    from otel_llm.kit.waterfall_render import render_lines

    t = 1_700_000_000_000_000_000
    root = SpanRecord("a" * 32, "1" * 16, None, sc.SPAN_REQUEST, t, t + 30_000_000, {sc.LLM_REQUEST_ID: "r"})
    part = SpanRecord("a" * 32, "2" * 16, "1" * 16, sc.SPAN_INSTANCE_PREFILL, t + 11, t + 10_000_000)
    queue = SpanRecord("a" * 32, "3" * 16, "2" * 16, sc.SPAN_QUEUE, t + 2_000_000, t + 3_000_000)
    (trace,) = group_requests([root, part, queue])
    text = ["".join(piece for piece, _ in line) for line in render_lines(trace, 100)]
    rows = {line.split()[0]: line.split()[1:3] for line in text if line.startswith(" ")}
    assert rows[sc.SPAN_INSTANCE_PREFILL][0] == "0", rows  # not "0.011 µs"
    assert rows[sc.SPAN_QUEUE][:2] == ["2", "ms"], rows  # a real start keeps its figure


def test_a_stall_in_words_counts_its_steps_in_good_english() -> None:
    """ "nothing in the 1 steps in the gap" read as a bug to a new user: one step is "the one step"."""
    from otel_llm import semconv as sc
    from otel_llm.kit.waterfall_render import stall_words

    def words(steps: int, cause: str = sc.STALL_UNKNOWN) -> str:
        attrs = {sc.LLM_STALL_TOKEN: 4, sc.LLM_STALL_CAUSE: cause, sc.LLM_STALL_DURATION: 0.004}
        return stall_words({**attrs, sc.LLM_STALL_STEPS: steps})

    assert words(1).endswith("nothing in the one step in the gap explains it")
    assert words(3).endswith("nothing in the 3 steps in the gap explains it")
    assert words(1, sc.STALL_SKIPPED).endswith("(the one step in the gap)")


def test_a_slow_step_in_words_says_how_long_it_ran_against_the_typical_gap() -> None:
    from otel_llm import semconv as sc
    from otel_llm.kit.waterfall_render import stall_words

    attrs = {
        sc.LLM_STALL_TOKEN: 11,
        sc.LLM_STALL_CAUSE: sc.STALL_SLOW_STEP,
        sc.LLM_STALL_DURATION: 0.0278,
        sc.LLM_STALL_STEPS: 1,
        sc.LLM_STALL_STEP_TIME: 0.0275,
        sc.LLM_STALL_TYPICAL_GAP: 0.0045,
    }
    assert stall_words(attrs) == (
        "token 11 waited 27.8 ms: the engine's step took 27.5 ms, 6.1x the typical 4.5 ms, "
        "with nothing in it to blame"
    )
    # A trace from a release without the step's time still reads.
    del attrs[sc.LLM_STALL_STEP_TIME]
    assert stall_words(attrs).endswith(": the engine's step was slow, with nothing in it to blame")
