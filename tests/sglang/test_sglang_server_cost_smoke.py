"""``benchmarks.sglang_server_cost`` in its quick mode: four real SGLang servers, every row reported.

Times are not asserted (quick-mode numbers on a tiny model mean little). What is: every variant has a
row, each server exported what its tracing setting says (none for ``bare``), only otel-llm's server has
otel-llm's export process and only the async server SGLang's exporters, and the targets-table row's
verdict agrees with the raw rounds, recomputed here from the CPU readings themselves. Starting four
servers takes a few minutes on 2 cores.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.sglang.conftest import REPO, needs_sglang

pytestmark = needs_sglang

VARIANTS = ("bare", "sglang-trace", "sglang-trace-async", "otel-llm")
SERVING = ("main", "scheduler", "detokenizer")


def _serving_work_ns(turn: dict[str, Any]) -> float:
    """The serving processes' CPU in one turn over their idle rate, from the raw readings."""
    return sum(max(0.0, turn["cpu_ns"][c] - turn["idle_ns"].get(c, 0.0)) for c in SERVING)


def test_quick_run_reports_every_variant(tmp_path: Path) -> None:
    report, raw_path = tmp_path / "report.md", tmp_path / "report.json"
    command = [sys.executable, "-m", "benchmarks.sglang_server_cost", "--quick"]
    command += ["--output", str(report), "--json", str(raw_path)]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]

    result = json.loads(raw_path.read_text())
    rows = {row["variant"]: row for row in result["rows"]}
    assert tuple(rows) == VARIANTS
    for row in rows.values():
        numbers = [value for key, value in row.items() if key.endswith("_us")]
        assert numbers and all(math.isfinite(value) for value in numbers), row
        assert row["serving_us"] > 0, row
    assert rows["bare"]["spans_total"] == 0
    for name in VARIANTS[1:]:
        assert rows[name]["spans_total"] > 0, name
    trees = result["processes"]
    for name in VARIANTS:
        assert ("otel_llm_export" in trees[name]) == (name == "otel-llm"), trees
        assert ("sglang_exporter" in trees[name]) == (name == "sglang-trace-async"), trees
        assert trees[name].get("scheduler") == 1 and trees[name].get("main") == 1, trees

    # The verdict from the raw rounds: otel-llm's added serving CPU below each SGLang variant's.
    bare = [_serving_work_ns(t) for t in result["variants"]["bare"]]

    def added(name: str) -> float:
        return statistics.median(_serving_work_ns(t) - b for t, b in zip(result["variants"][name], bare))

    ours = added("otel-llm")
    assert result["met"] == all(ours < added(peer) for peer in ("sglang-trace", "sglang-trace-async"))

    from benchmarks import sglang_server_report

    what, _now, target, met, measured, _why = sglang_server_report.target_row(result)
    assert met == result["met"] and "SGLANG_TRACE_ASYNC=1" in what and "below both" in target
    assert f"µs: otel-llm {ours / result['requests'] / 1e3:,.0f} (" in measured

    text = report.read_text()
    for name in VARIANTS:
        assert f"| `{name}` |" in text
    assert "otel-llm below both in the serving processes: " in text
    assert str(REPO) not in text and "/tmp" not in text  # no machine paths in a committed report
