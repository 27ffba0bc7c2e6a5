"""``benchmarks.export_cost`` in its quick mode: every variant measured, every span delivered, a full section.

The spans go through the real standard OTLP exporters to real receivers in child processes. Times are
not asserted (quick-mode numbers mean little); the rows, the delivery counts and the section's shape are.
"""

from __future__ import annotations

import math
from pathlib import Path

from benchmarks import export_cost
from benchmarks.export_report import TITLE

ROOT = Path(__file__).resolve().parent.parent


def test_quick_run_measures_every_variant_and_reports_them() -> None:
    result = export_cost.measure(True)

    assert result["protobuf"] in ("upb", "cpp", "python")
    assert result["failures"] == 0
    assert result["received"] == result["sent"]
    assert all(count > 0 for count in result["sent"].values())
    # Phase spans of real requests, preempted ones included.
    assert {"llm.request", "llm.queue", "llm.prefill", "llm.decode", "llm.preempted", "llm.recompute"} <= set(
        result["names"]
    )
    assert result["preempted"] > 0

    keys = {(r["what"], r["protocol"], r["batch"], r["compression"]) for r in result["rows"]}
    expected = {("encode", "-", size, "none") for size in export_cost.BATCH_SIZES}
    expected |= {
        ("export", protocol, size, compression)
        for protocol in export_cost.PROTOCOLS
        for size in export_cost.BATCH_SIZES
        for compression in export_cost.COMPRESSIONS
    }
    expected |= {("encode-kind", name, export_cost.DEFAULT_BATCH, "none") for name in result["names"]}
    expected.add(("build", "-", 0, "-"))
    assert keys == expected
    for row in result["rows"]:
        for field in ("thread_us", "process_us"):
            assert math.isfinite(row[field]) and row[field] > 0, row
        assert ("beyond_us" in row) == (row["what"] == "export"), row

    text = "\n".join(export_cost.lines(result))
    assert text.startswith(TITLE)
    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + len(expected)  # header, then one row per variant
    assert f"`{result['protobuf']}`" in text
    for needle in ("`export()`, gRPC", "`export()`, HTTP/protobuf", "OTLP encoding only", "gzip"):
        assert needle in text
    assert "nan" not in text.split(TITLE, 1)[1]
    assert str(ROOT) not in text  # no machine paths in a committed report
