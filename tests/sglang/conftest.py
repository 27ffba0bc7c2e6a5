"""Shared for the SGLang tests: one run of drive_engine.py per session, and views of its results.

SGLang and its pinned torch live in their own virtualenv (``tests/sglang/make_env.sh`` builds
``.venv-sglang``; ``OTEL_LLM_SGLANG_PYTHON`` points at another interpreter, which must have this checkout
installed, editable, because SGLang finds the plugin through the installed entry points). The engine is
SGLang's real one; two things in that virtualenv are test stand-ins, and the tests say so: a torch
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

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
SGLANG_PYTHON = Path(os.environ.get("OTEL_LLM_SGLANG_PYTHON", REPO / ".venv-sglang" / "bin" / "python"))
# Compared with SGLang's numbers; "forced_in_process" is "forced" in the other export mode; "traced" has
# its own test.
SCENARIOS = ("forced", "natural", "forced_in_process")
RUNS = (*SCENARIOS, "traced", "early_eos")  # the last two have their own tests

needs_sglang = pytest.mark.skipif(
    not SGLANG_PYTHON.exists(),
    reason=f"SGLang virtualenv not found at {SGLANG_PYTHON}: build it with `bash tests/sglang/make_env.sh` "
    "(about 1 GB beside a shared 4.7 GB torch tree, a few minutes) or set OTEL_LLM_SGLANG_PYTHON",
)


def sglang_env() -> dict[str, str]:
    """The environment SGLang's CPU engine needs (see the recipe in tests/sglang/make_env.sh)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update({"SGLANG_USE_CPU_ENGINE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    return env


@pytest.fixture(scope="session")
def engine_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every offline scenario, one driver process each (SGLang's Prometheus metrics allow one engine
    with metrics per process)."""
    runs = {}
    for name in RUNS:
        out = tmp_path_factory.mktemp("sglang") / f"{name}.json"
        run_or_fail(
            [str(SGLANG_PYTHON), str(HERE / "drive_engine.py"), str(out), name],
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
