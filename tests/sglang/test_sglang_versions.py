"""An SGLang release outside the tested range: one warning naming the installed version and the range,
then the chosen default (instrumented), or nothing instrumented with ``OTEL_LLM_VERSION_CHECK=strict``.

The release outside the range is the real SGLang of the newest virtualenv with its installed metadata
copied and relabelled (``tests/engine_version_probe.py``): SGLang's code is the installed release's, its
version, as every reader of package metadata sees it, is another.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from drivers import run_or_fail

from otel_llm.integrations.versions import ENV_VERSION_CHECK, SGLANG
from tests.sglang.conftest import SGLANG_PYTHON, needs_sglang, sglang_env

pytestmark = needs_sglang

PROBE = Path(__file__).resolve().parents[1] / "engine_version_probe.py"
ABOVE, BELOW = SGLANG.below, "0.5.21"  # the first release the range leaves out, one before it


def probe(tmp_path: Path, *options: str, **env: str) -> dict[str, Any]:
    out = tmp_path / "probe.json"
    run_or_fail(
        [str(SGLANG_PYTHON), str(PROBE), str(out), "sglang", *options],
        {**sglang_env(), **env},
        tmp_path,
        timeout_s=300,
    )
    return json.loads(out.read_text())


def range_warnings(report: dict[str, Any]) -> list[str]:
    return [w for w in report["warnings"] if "outside the releases otel-llm is tested on" in w]


def test_the_probes_are_outside_the_range() -> None:
    assert not SGLANG.contains(ABOVE) and not SGLANG.contains(BELOW)


def test_above_the_range_one_warning_then_instrumented(tmp_path: Path) -> None:
    """instrument() twice before SGLang is imported (its import hook's path): one warning."""
    report = probe(tmp_path, f"--as-version={ABOVE}", "--twice")
    assert report["metadata_version"] == ABOVE
    (warning,) = range_warnings(report)
    assert f"SGLang {ABOVE} (sglang)" in warning and f"sglang {SGLANG.text}" in warning
    assert "instrumented anyway" in warning
    assert report["instrumented"] and report["patched"]


def test_strict_below_the_range_one_warning_and_nothing_patched(tmp_path: Path) -> None:
    report = probe(tmp_path, f"--as-version={BELOW}", "--twice", **{ENV_VERSION_CHECK: "strict"})
    assert report["metadata_version"] == BELOW
    (warning,) = range_warnings(report)
    assert f"SGLang {BELOW} (sglang)" in warning and "not instrumented" in warning
    assert not report["instrumented"] and not report["patched"]
