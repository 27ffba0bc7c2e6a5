"""Shared for the SGLang tests: one run of drive_engine.py per SGLang release and scenario, and views of
its results.

SGLang and its pinned torch live in their own virtualenv (``tests/sglang/make_env.sh`` builds
``.venv-sglang`` for the newest tested release and ``.venv-sglang-VERSION`` for another). The offline
engine tests run on every release of the tested range's ends (``otel_llm.integrations.versions.SGLANG``;
``OTEL_LLM_SGLANG_VERSIONS`` names others), their ids starting with the release; the server tests, on
the newest. ``OTEL_LLM_SGLANG_PYTHON`` runs all of them on one interpreter alone, which must have this
checkout installed, editable, because SGLang finds the plugin through the installed entry points. The
engine is SGLang's real one; two things in that virtualenv are test stand-ins, and the tests say so: a torch
``sgl_kernel.assign_req_to_token_pool_cpu`` (PyPI has only CUDA builds of sgl_kernel) and the torchvision
operator schemas a CUDA torchvision wheel needs to import on a CPU-only torch (see
tests/sglang/standins/; on PyPI's default, CUDA-enabled torch it steps aside).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from drivers import run_or_fail

from otel_llm import semconv as sc
from otel_llm.integrations.versions import SGLANG

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def sglang_pythons() -> dict[str, Path]:
    """The interpreters the offline engine tests run on, by SGLang release (``given``: the variable's)."""
    given = os.environ.get("OTEL_LLM_SGLANG_PYTHON")
    if given:
        return {"given": Path(given)}
    listed = os.environ.get("OTEL_LLM_SGLANG_VERSIONS", "").replace(",", " ").split()
    newest = SGLANG.tested[-1]  # the build script's default, in the plain .venv-sglang
    return {
        v: REPO / (".venv-sglang" if v == newest else f".venv-sglang-{v}") / "bin" / "python"
        for v in listed or SGLANG.tested
    }


SGLANG_PYTHONS = sglang_pythons()
SGLANG_PYTHON = list(SGLANG_PYTHONS.values())[-1]  # the newest listed: the server tests' SGLang
# Compared with SGLang's numbers; "forced_in_process" is "forced" in the other export mode; "traced" has
# its own test.
SCENARIOS = ("forced", "natural", "forced_in_process")
RUNS = (*SCENARIOS, "traced", "early_eos")  # the last two have their own tests

needs_sglang = pytest.mark.skipif(
    not SGLANG_PYTHON.exists(),
    reason=f"SGLang virtualenv not found at {SGLANG_PYTHON}: build it with `bash tests/sglang/make_env.sh` "
    "(about 1 GB beside a shared 4.7 GB torch tree, a few minutes) or set OTEL_LLM_SGLANG_PYTHON",
)  # the newest release's; an older one's missing virtualenv skips its own tests (sglang_python)


def sglang_env() -> dict[str, str]:
    """The environment SGLang's CPU engine needs (see the recipe in tests/sglang/make_env.sh)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update({"SGLANG_USE_CPU_ENGINE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    return env


@pytest.fixture(scope="session", params=list(SGLANG_PYTHONS))
def sglang_python(request: pytest.FixtureRequest) -> Path:
    """One release's interpreter for the offline engine tests; skips, saying how to build it, where its
    virtualenv is missing."""
    python = SGLANG_PYTHONS[request.param]
    if not python.exists():
        version = "" if python.parent.parent.name == ".venv-sglang" else f" {request.param}"
        pytest.skip(f"{python} not found: build it with `bash tests/sglang/make_env.sh{version}`")
    return python


@pytest.fixture(scope="session")
def engine_runs(sglang_python: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every offline scenario on one release, one driver process each (SGLang's Prometheus metrics allow
    one engine with metrics per process)."""
    runs = {}
    for name in RUNS:
        out = tmp_path_factory.mktemp("sglang") / f"{name}.json"
        run_or_fail(
            [str(sglang_python), str(HERE / "drive_engine.py"), str(out), name],
            sglang_env(),
            out.parent,
            timeout_s=300,
        )
        runs.update(json.loads(out.read_text())["scenarios"])
    return runs


@pytest.fixture(params=SCENARIOS)
def run(request: pytest.FixtureRequest, engine_runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return engine_runs[request.param]


def roots(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found = [s for s in run["spans"] if s["name"] == sc.SPAN_REQUEST]
    by_id = {s["attributes"][sc.LLM_REQUEST_ID]: s for s in found}
    assert len(by_id) == len(found), "two llm.request spans for one request"
    return by_id


def children(run: dict[str, Any], parent: dict[str, Any], name: str | None = None) -> list[dict[str, Any]]:
    found = [s for s in run["spans"] if s["parent_span_id"] == parent["span_id"]]
    return sorted((s for s in found if name is None or s["name"] == name), key=lambda s: s["start"])


def seconds(span: dict[str, Any]) -> float:
    return (span["end"] - span["start"]) / 1e9


def metric_points(run: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """The data points of metric ``name`` in the last export that carried it."""
    found = [m["data"] for m in run["metrics"] if m["name"] == name]
    if not found:
        return []
    data = found[-1]
    body = data.get("sum") or data.get("histogram") or data.get("gauge") or {}
    return body.get("data_points", [])
