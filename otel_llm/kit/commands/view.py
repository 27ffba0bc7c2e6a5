"""``otel-llm view FILE``: a terminal waterfall of one request from OTLP JSON traces files.

The drawing is ``otel_llm.kit.waterfall_render``'s (every span a bar at any width from 60 columns, a legend
of the glyphs drawn). ``--phase`` zooms on one phase (e.g. ``queue``, ``decode``) and ``--window`` on a
stretch of time; spans outside it show ``‹`` / ``›`` at the edge they lie beyond. Files or folders that
hold several runs (``otel_llm.kit.trace_runs`` says what a run is) show one run, the newest unless ``--run N``
names another (``--runs`` lists them), and say on stderr which one and how to pick another.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from otel_llm import semconv as sc
from otel_llm.kit.trace_runs import TRACES_FILE, Run, split_runs, trace_files, where
from otel_llm.kit.waterfall import RequestTrace, SpanRecord, group_requests, load_otlp_json, pick_request
from otel_llm.kit.waterfall_render import (
    MIN_WIDTH,
    STYLES,
    emit,
    engine_time_text,
    finish_text,
    fmt_duration,
    fmt_time,
    render_lines,
    stall_words,
    stalled_by_cause,
    terminal_width,
)

# The drawing's names, imported from here by the demos too (they draw the waterfall they ran).
__all__ = ["STYLES", "emit", "fmt_duration", "load_all", "register", "render_lines", "run", "terminal_width"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "view",
        help="print the waterfall of one request from an OTLP JSON traces file",
        description="Print the waterfall of one request from OTLP JSON traces files. Without --request, "
        "--trace-id or --slowest it shows the most preempted request (the longest of those); --list "
        "prints every request in the files to pick one. Files or folders holding several runs (run "
        "folders, or runs told apart by service.instance.id) show the newest run; --runs lists them and "
        "--run N picks one (or pass that run's folder).",
    )
    p.add_argument(
        "file",
        nargs="*",
        help="OTLP JSON lines traces files, or folders holding them (a disaggregated run writes one per "
        "worker: pass its folder to see both instances of a request); none: the newest run folder in "
        "OTEL_LLM_OUTPUT_DIR, else ./otel-llm-output",
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
    which.add_argument(
        "--why",
        metavar="ID",
        help="the stalls of request ID in words instead of its waterfall: which token waited how long, "
        "and what the engine's steps did meanwhile (engines that report their batches)",
    )
    which.add_argument(
        "--runs",
        action="store_true",
        help="list the runs in the files instead (number, start, requests, folder), oldest first",
    )
    p.add_argument(
        "--run",
        metavar="N",
        type=_run_number,
        help="show run N of --runs (default: the newest, the last one)",
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


def _run_number(text: str) -> int:
    """argparse type of ``--run``: a run's number in ``--runs``, 1 or more."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a run number: pass N of --runs (1, 2, ...)")
    return int(text)


def newest_run_folder() -> Path:
    """With no file named: the run folder whose ``traces.jsonl`` was written last, in the folder runs
    write into by default (``OTEL_LLM_OUTPUT_DIR``, else ``./otel-llm-output``). ValueError when none."""
    from otel_llm.setup import DEFAULT_OUTPUT_DIR, ENV_OUTPUT_DIR

    base = Path(os.environ.get(ENV_OUTPUT_DIR, "").strip() or DEFAULT_OUTPUT_DIR)
    found = (
        list(base.glob(f"*/{TRACES_FILE}")) + list(base.glob(f"*/*/{TRACES_FILE}")) if base.is_dir() else []
    )
    if not found:
        raise ValueError(
            f"no FILE given, and no run folder with a {TRACES_FILE} in {base}/: pass a traces file or "
            "folder (otel-llm demo writes one)"
        )
    newest = max(found, key=lambda f: f.stat().st_mtime)
    folder = newest.parent if newest.parent.parent == base else newest.parent.parent  # a worker's file
    print(
        f"otel-llm view: the newest run in {base}/: {folder} (name a file or folder for another)",
        file=sys.stderr,
    )
    return folder


def run(args: argparse.Namespace) -> int:
    try:
        files = trace_files(args.file or [str(newest_run_folder())])
        runs = split_runs(files)
        if not runs:
            shown = ", ".join(map(str, files))
            raise ValueError(f"{shown}: no llm.request spans; is this a traces file written by otel_llm?")
        if args.runs:
            print("\n".join(run_lines(runs)))
            return 0
        chosen = pick_run(runs, args.run)
        requests = group_requests(chosen.spans)
        if args.list:
            print("\n".join(list_lines(requests)))
            return 0
        asked = args.why if args.why is not None else args.request
        trace = pick_request(requests, request_id=asked, slowest=args.slowest, trace_id=args.trace_id)
        repeated = sum(1 for t in requests if t.request_id == trace.request_id)
        if asked is not None and repeated > 1:
            # Files appended to by several runs that set no service.instance.id: the ids repeat.
            print(
                f"otel-llm view: request {trace.request_id} appears {repeated} times here; showing the "
                "latest (--list shows their trace ids, --trace-id HEX picks one)",
                file=sys.stderr,
            )
        if args.why is not None:
            print("\n".join(why_lines(trace)))
            return 0
        window = zoom_window(trace, args.phase, args.window)
    except BrokenPipeError:
        raise  # the reader of the output left, not a problem with the files (otel_llm.kit.cli says nothing)
    except (OSError, ValueError) as exc:
        print(f"otel-llm view: {exc}", file=sys.stderr)
        return 2
    width = args.width if args.width is not None else terminal_width()
    if width < MIN_WIDTH:
        print(f"otel-llm view: --width {width} is too narrow; pass {MIN_WIDTH} or more", file=sys.stderr)
        return 2
    emit(render_lines(trace, width, window))
    return 0


def why_lines(trace: RequestTrace) -> list[str]:
    """``--why``: the request's stalls in words, in time order, under one line of totals by cause."""
    rid = trace.request_id
    count = trace.root.attributes.get(sc.LLM_STALLS)
    if count is None:
        return [
            f"request {rid}: no stall figures; the engine did not report its batches "
            "(RequestTracker.batch, docs/hooks.md)"
        ]
    spent = engine_time_text(trace.root.attributes)
    cost = [f"  engine time: {spent}"] if spent is not None else []
    if not count:
        none = f"request {rid}: no stalls (no gap between its tokens of 3 typical gaps and 2 ms or more)"
        return [none, *cost]
    events = trace.events(sc.EVENT_STALL)
    lines = [
        f"request {rid}: {count} stall{'s' if count != 1 else ''} ({stalled_by_cause(trace.root.attributes)})"
    ]
    lines += [f"  {stall_words(attrs)}" for _, attrs in events]
    if len(events) < int(count):
        lines.append(f"  ({int(count) - len(events)} shorter ones are counted above, not listed: 16 at most)")
    return lines + cost


def pick_run(runs: Sequence[Run], number: int | None) -> Run:
    """Run ``number`` (1: the oldest) of ``runs``, else the newest; says on stderr which it is when there
    are several, and how to pick another."""
    if number is not None and number > len(runs):
        only = "there is 1 run" if len(runs) == 1 else f"there are {len(runs)} runs (1 to {len(runs)})"
        raise ValueError(f"--run {number}: {only} in these files; --runs lists them")
    index = len(runs) - 1 if number is None else number - 1
    if len(runs) > 1:
        shown = f"run {index + 1} (started {runs[index].started}): {where(runs)[index]}"
        if number is None:
            note = f"{len(runs)} runs here; showing the newest, {shown}; --runs lists them, --run N picks one"
        else:
            note = f"showing {shown}, of {len(runs)} runs here (--runs lists them)"
        print(f"otel-llm view: {note}", file=sys.stderr)
    return runs[index]


def run_lines(runs: Sequence[Run]) -> list[str]:
    """One line per run (a header first), oldest first: what ``--run N`` picks from."""
    rows = [("run", "started", "requests", "where")]
    for n, (r, place) in enumerate(zip(runs, where(runs)), 1):
        rows.append((str(n), r.started, str(len(r.roots)), place))
    return _columns(rows, right={0, 2})


def load_all(paths: Sequence[str]) -> list[SpanRecord]:
    """The spans of every file named, of every run; a folder stands for every ``traces.jsonl`` below it."""
    records: list[SpanRecord] = []
    for file in trace_files(paths):
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
                fmt_time(a.get(sc.LLM_LATENCY_TTFT)),
                fmt_time(a.get(sc.LLM_LATENCY_E2E, t.root.duration_s)),
                str(t.preemptions),
                finish_text(t),
                t.root.trace_id,
            )
        )
    return _columns(rows, right={1, 2, 3})  # the numbers, aligned on their ends


def _columns(rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    """``rows`` as aligned columns two spaces apart; the columns in ``right`` aligned on their ends."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))
        ).rstrip()
        for row in rows
    ]


# --- zoom -----------------------------------------------------------------------------------------

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
