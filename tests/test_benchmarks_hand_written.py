"""A full benchmark run writes BENCHMARKS.md whole, yet keeps the hand-written section at its end.

The docs link to figures read off the tables by hand ("Read per step and per request", below the
marker line of ``benchmarks/hand_written.py``). Here the real harness writes a report over a file that
has such a section (``--quick --only collect``: seconds, its numbers unused), and the section must be
there after it, word for word, while the old generated part is gone.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from benchmarks.hand_written import MARKER

ROOT = Path(__file__).resolve().parent.parent
TAIL = f"{MARKER}\n\n## Read by hand\n\n- a figure read off section 6: 4.9 ms.\n"


def write_report(output: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--only", "collect", "--output", str(output)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return output.read_text(encoding="utf-8")


def test_a_new_report_keeps_the_hand_written_end_of_the_old_one(tmp_path: Path) -> None:
    report = tmp_path / "BENCHMARKS.md"
    report.write_text(f"# Benchmarks\n\nan old table row\n\n{TAIL}", encoding="utf-8")
    text = write_report(report)
    assert "an old table row" not in text  # the generated part is new
    assert "## Machine" in text and "### 6. " in text
    assert text.endswith(TAIL) and text.count(MARKER) == 1


def test_a_report_without_the_marker_is_replaced_whole(tmp_path: Path) -> None:
    report = tmp_path / "BENCHMARKS.md"
    report.write_text("# Benchmarks\n\n## Read by hand\n\nno marker above me\n", encoding="utf-8")
    text = write_report(report)
    assert "no marker above me" not in text and MARKER not in text


def test_the_committed_report_has_its_hand_written_section_below_the_marker() -> None:
    text = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    assert text.count(MARKER) == 1
    # docs/hooks.md, docs/telemetry.md, docs/operations.md and docs/configuration.md link to it by name
    assert "## Read per step and per request" in text.split(MARKER, 1)[1]


def test_the_vllm_report_keeps_its_hand_written_end_too(tmp_path: Path) -> None:
    """BENCHMARKS-vllm.md is written whole by benchmarks.vllm_cost (which needs the vLLM engine
    virtualenv to measure); its writer is called here on a generated text, as the benchmark calls it."""
    from benchmarks.vllm_cost import write_report as write_vllm_report

    report = tmp_path / "BENCHMARKS-vllm.md"
    report.write_text(f"# vLLM\n\nan old ratio\n\n{TAIL}", encoding="utf-8")
    write_vllm_report("# vLLM\n\na new ratio\n", report)
    text = report.read_text(encoding="utf-8")
    assert "an old ratio" not in text and "a new ratio" in text
    assert text.endswith(TAIL) and text.count(MARKER) == 1


def test_the_committed_vllm_report_has_the_router_hop_below_the_marker() -> None:
    text = (ROOT / "BENCHMARKS-vllm.md").read_text(encoding="utf-8")
    assert text.count(MARKER) == 1
    # docs/fleet.md, "What the router hop costs", links to it by name
    assert "## The router hop, measured by hand" in text.split(MARKER, 1)[1]
