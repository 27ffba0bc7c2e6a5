"""A vLLM release outside the tested range: one warning naming the installed version and the range, then
the chosen default (instrumented), or nothing instrumented with ``OTEL_LLM_VERSION_CHECK=strict``.

The release outside the range is the real vLLM of the tier's newest virtualenv with its installed
metadata copied and relabelled (``tests/engine_version_probe.py``): its code is the installed release's,
its version, as every reader of package metadata sees it, is another. One release above the range and
one below, one in each mode; a release in the range is instrumented without a word on every release of
the tier (``test_vllm_integration.py``, the general-plugin test).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from drivers import run_or_fail

from otel_llm.integrations.versions import ENV_VERSION_CHECK, VLLM
from tests.vllm.conftest import VLLM_PYTHON, needs_vllm

pytestmark = needs_vllm

PROBE = Path(__file__).resolve().parents[1] / "engine_version_probe.py"
ABOVE, BELOW = f"{VLLM.below}.0", "0.29.0"  # the first release the range leaves out, one before it


def probe(tmp_path: Path, *options: str, **env: str) -> dict[str, Any]:
    """The probe's report, run in the newest virtualenv of the tier."""
    if not VLLM_PYTHON.exists():
        pytest.skip(f"{VLLM_PYTHON} not found: build it with tests/vllm/make_env.sh")
    out = tmp_path / "probe.json"
    environment = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    environment.update(env)
    command = [str(VLLM_PYTHON), str(PROBE), str(out), "vllm", *options]
    run_or_fail(command, environment, tmp_path, timeout_s=300)
    return json.loads(out.read_text())


def range_warnings(report: dict[str, Any]) -> list[str]:
    return [w for w in report["warnings"] if "outside the releases otel-llm is tested on" in w]


def test_the_tested_releases_are_in_the_range_and_the_probes_are_not() -> None:
    assert all(VLLM.contains(v) for v in VLLM.tested)
    assert not VLLM.contains(ABOVE) and not VLLM.contains(BELOW)


def test_above_the_range_one_warning_then_instrumented(tmp_path: Path) -> None:
    """The default: vLLM's plugin loader, then the application's own instrument() (two calls, as under
    opentelemetry-instrument with the plugin), one warning that names the version and the range."""
    version = ABOVE
    report = probe(tmp_path, f"--as-version={version}", "--plugin", "--twice")
    assert report["metadata_version"] == version
    (warning,) = range_warnings(report)
    assert f"vLLM {version} (vllm)" in warning and f"vllm {VLLM.text}" in warning
    assert "instrumented anyway" in warning and f"{ENV_VERSION_CHECK}=strict" in warning
    assert report["instrumented"] and report["patched"]


def test_strict_below_the_range_one_warning_and_nothing_patched(tmp_path: Path) -> None:
    """instrument() before vLLM is imported (the import hook's path), twice: one warning, no wrapper."""
    version = BELOW
    report = probe(tmp_path, f"--as-version={version}", "--twice", **{ENV_VERSION_CHECK: "strict"})
    assert report["metadata_version"] == version
    (warning,) = range_warnings(report)
    assert f"vLLM {version} (vllm)" in warning and f"vllm {VLLM.text}" in warning
    assert "not instrumented" in warning
    assert report["warnings"] == [warning]
    assert not report["instrumented"] and not report["patched"]
