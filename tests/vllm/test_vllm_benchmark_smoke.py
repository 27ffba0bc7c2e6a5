"""`python -m benchmarks.vllm_cost --quick` runs end to end: six variants, each its own vLLM process,
and a report with the variant table, the targets and the start-up section (its numbers mean nothing)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from engine_tier import REPO, needs_engine

pytestmark = needs_engine

VARIANT_ROWS = (
    "| bare (",
    "| vLLM's own stats",
    "| vLLM's own tracing",
    "| otel-llm, phases",
    "| otel-llm, tail sampling 5 %",
    "| otel-llm, detail `request`",
)
TARGETS = (
    "otel-llm's added frontend CPU ÷ vLLM's own tracing's added CPU, phases",
    "same, detail `request`",
    "tokens per second with otel-llm",
)
NUMBER = re.compile(r"^-?[\d,]+(\.\d+)?$")


def _row(text: str, start: str) -> list[str]:
    rows = [line for line in text.splitlines() if line.startswith(start)]
    assert len(rows) == 1, f"expected one row starting {start!r}, found {rows}"
    return [cell.strip() for cell in rows[0].strip("|").split("|")]


def test_vllm_cost_quick_run_reports_six_variants_and_targets(tmp_path, record_property) -> None:
    output, raw = tmp_path / "vllm.md", tmp_path / "vllm.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.vllm_cost",
            "--quick",
            "--output",
            str(output),
            "--json",
            str(raw),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    text = output.read_text()
    # The regression guard's figure: the frontend ratio of the small workload, printed (with -s or -rP)
    # and kept in the test report; no timing is asserted, only that it was computed.
    (ratio,) = [line for line in proc.stderr.splitlines() if "frontend ratio" in line]
    print(ratio)
    record_property("frontend_ratio", ratio.split(": ", 1)[1])
    assert re.search(r"quick (-?\d+\.\d+|n/a) / (-?\d+\.\d+|n/a)$", ratio), ratio
    assert "at commit " in text and "How busy the machine was: load average" in text

    # The variant table: six rows, each with eight figures; the export process's CPU (column 8) is
    # there for the variants with otel-llm, which export through it by default, and zero for the others.
    for start in VARIANT_ROWS:
        cells = _row(text, start)
        assert len(cells) == 9 and all(NUMBER.match(c) for c in cells[1:]), cells
        export_cpu = float(cells[7].replace(",", ""))
        assert (export_cpu > 0) == start.startswith("| otel-llm"), cells
    # The targets table: each row has a measured value and a verdict.
    assert "| measure | now | target | measured | verdict |" in text
    for start in TARGETS:
        cells = _row(text, f"| {start}")
        assert cells[3] and (cells[4].startswith(("met", "not met")) or "not measurable" in cells[4]), cells
    beside = _row(text, "| beside it: the export process's CPU")
    assert all(NUMBER.match(v.strip()) for v in beside[3].split("/")), beside
    assert "main thread: process_outputs: outputs" in text  # the phases variant's breakdown
    assert "engine (vLLM installed, unused)" in text
    assert "## otel_llm in vLLM's engine core: each step's added CPU" in text
    for readmitted in ("0", "1", "4"):
        cells = _row(text, f"| {readmitted} | ")
        assert len(cells) == 5 and cells[1].endswith(" ns"), cells
        assert cells[2].endswith(" µs") and cells[4].endswith(" µs"), cells  # figures; and the step line

    # What reached the receiver: every variant exported what it should, and only that.
    [workload] = json.loads(raw.read_text())["workloads"]
    requests = workload["workload"]["prompts"] * len(workload["rounds"]["bare"])
    spans = workload["spans"]
    assert not spans["bare"] and not spans["vllm-stats"]
    assert spans["vllm-tracing"].get("llm_request") == requests
    assert spans["otel-phases"]["llm.request"] == requests  # every trace kept
    assert set(spans["otel-request"]) == {"llm.request"} and spans["otel-request"]["llm.request"] == requests
    # The quick workload's KV cache preempts; the preemption spans need the plugin in the engine core.
    assert spans["otel-phases"].get("llm.preempted", 0) > 0
    # Tail sampling keeps every preempted request, and at most every request.
    assert 0 < spans["otel-tail"]["llm.request"] <= requests
    for rounds in workload["rounds"].values():
        assert all(
            r["tokens"] == workload["workload"]["prompts"] * workload["workload"]["max_tokens"]
            for r in rounds
        )
