"""The SGLang server benchmark's committed results agree with each other and with BENCHMARKS.md.

``python -m benchmarks.sglang_server_cost`` writes BENCHMARKS-sglang.md and BENCHMARKS-sglang.json; the
export process's targets table in BENCHMARKS.md renders its SGLang row from the JSON. These fail when
one file is regenerated (or edited) without the others, or when the summary in the JSON is not what its
own raw rounds give.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import export_targets, sglang_server_report

REPO = Path(__file__).resolve().parents[1]
RESULT = sglang_server_report.load(REPO / "BENCHMARKS-sglang.json")
pytestmark = pytest.mark.skipif(RESULT is None, reason="BENCHMARKS-sglang.json is not committed")


def _sglang_line(lines: list[str]) -> str:
    found = [line for line in lines if line.startswith(f"| {sglang_server_report.TARGET_WHAT} |")]
    assert len(found) == 1, found
    return found[0]


def test_benchmarks_md_row_is_the_json_rendered() -> None:
    committed = (REPO / "BENCHMARKS.md").read_text(encoding="utf-8").splitlines()
    assert _sglang_line(committed) == _sglang_line(export_targets.render([]))


def test_the_json_summary_is_its_raw_rounds_summarized() -> None:
    assert RESULT is not None
    again = sglang_server_report.summarize(RESULT)
    for key in ("rows", "ratios", "verdict", "met"):
        assert again[key] == RESULT[key], key


def test_the_report_is_the_json_rendered() -> None:
    assert RESULT is not None
    text = (REPO / "BENCHMARKS-sglang.md").read_text(encoding="utf-8")
    assert text == sglang_server_report.markdown(RESULT, RESULT)
    assert f"**{RESULT['verdict']}**" in text


def test_a_missing_result_is_reported_not_measured(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(export_targets, "SGLANG_RESULT", tmp_path / "absent.json")
    line = _sglang_line(export_targets.render([]))
    assert "| not measured | not measured |" in line and "absent.json is missing" in line
