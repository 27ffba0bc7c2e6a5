"""`python -m benchmarks.vllm_cost --quick` still runs end to end (its numbers mean nothing)."""

from __future__ import annotations

import subprocess
import sys

from engine_tier import REPO, needs_engine

pytestmark = needs_engine


def test_vllm_cost_quick_run_reports_both_measures(tmp_path) -> None:
    output = tmp_path / "vllm.md"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.vllm_cost", "--quick", "--output", str(output)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    text = output.read_text()
    assert "| with otel_llm |" in text and "| without otel_llm |" in text
    assert "engine (vLLM installed, unused)" in text
