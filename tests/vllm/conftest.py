"""Shared for the vLLM tests: one run of drive_scheduler.py per session, and views of its results.

vLLM and its pinned torch live in their own virtualenv (``tests/vllm/make_env.sh`` builds ``.venv-vllm``;
``OTEL_LLM_VLLM_PYTHON`` points at another interpreter, which must have this checkout installed, editable,
because vLLM finds the plugin through the installed entry points). ``drive_scheduler.py`` runs there as a
real subprocess and reports, per scenario, our spans and metrics next to vLLM's own FinishedRequestStats
and the engine-core timeline (events and token batches) vLLM produced in the same run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from otel_llm import semconv as sc

REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("drive_scheduler.py")
VLLM_PYTHON = Path(os.environ.get("OTEL_LLM_VLLM_PYTHON", REPO / ".venv-vllm" / "bin" / "python"))
ABS = 1e-6  # seconds: float precision for values computed from the same monotonic timestamps
# The driver's scenarios (see its docstring); test_every_scenario_ran checks the list is complete.
SCENARIOS = ("mixed", "prefill_preemption", "speculative", "recompute", "stall", "steady")

needs_vllm = pytest.mark.skipif(
    not VLLM_PYTHON.exists(),
    reason=f"vLLM virtualenv not found at {VLLM_PYTHON}: build it with `bash tests/vllm/make_env.sh` "
    "(about 1.3 GB beside a shared 4.7 GB torch tree, a few minutes) or set OTEL_LLM_VLLM_PYTHON",
)


@pytest.fixture(scope="session", params=["process", "in_process"])
def vllm_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, Any]]:
    """Every scenario's results, from one driver process (importing vLLM takes most of its time), once
    per export mode: ``process`` (the default; the tracker on ``configure()``'s providers, the spans and
    metrics read back from a real OTLP receiver) and ``in_process`` (the tracker on the driver's own
    providers). Every test that reads them runs in both."""
    out = tmp_path_factory.mktemp(f"vllm-{request.param}") / "run.json"
    proc = subprocess.run(
        [str(VLLM_PYTHON), str(DRIVER), str(out), "--print", f"--export-mode={request.param}"],
        cwd=out.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        pytest.fail(f"drive_scheduler.py exited {proc.returncode}; its output is above")
    # vLLM's event sequences (--print): shown with the captured output of a failing test.
    sys.stderr.write("".join(line for line in proc.stderr.splitlines(True) if line.startswith(SCENARIOS)))
    return json.loads(out.read_text())["scenarios"]


@pytest.fixture(params=SCENARIOS)
def any_run(request: pytest.FixtureRequest, vllm_runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One scenario's results; tests that take it run once per scenario."""
    return vllm_runs[request.param]


def roots(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found = [s for s in run["spans"] if s["name"] == sc.SPAN_REQUEST]
    by_id = {s["attributes"][sc.LLM_REQUEST_ID]: s for s in found}
    assert len(by_id) == len(found), "two llm.request spans for one request"
    return by_id


def trace_of(run: dict[str, Any], root: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in run["spans"] if s["trace_id"] == root["trace_id"]]


def vllm_stats(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["request_id"]: f for f in run["vllm"]}


def metric(run: dict[str, Any], name: str, **attributes: Any) -> list[dict[str, Any]]:
    return [
        m
        for m in run["metrics"]
        if m["name"] == name and all(m["attributes"].get(k) == v for k, v in attributes.items())
    ]


def seconds(span: dict[str, Any]) -> float:
    """A span's duration in seconds (its start and end are nanoseconds)."""
    return (span["end"] - span["start"]) / 1e9


class Preemption:
    """One preemption in vLLM's engine-core timeline of a request; monotonic seconds.

    ``preempted`` P, ``rescheduled`` R (the next SCHEDULED, or None), ``next_tokens`` T (the first token
    batch after R, or None), ``before_first_token``: P came before the request's first token batch,
    ``recompute_end``: where its recompute ends, T or, for a recompute cut short, the next PREEMPTED.
    """

    def __init__(self, entries: list[list[Any]], index: int) -> None:
        self.preempted = entries[index][1]
        later = entries[index + 1 :]
        self.rescheduled = next((ts for kind, ts, *_ in later if kind == "SCHEDULED"), None)
        after = [
            ts for kind, ts, *_ in later if kind == "TOKENS" and ts >= (self.rescheduled or float("inf"))
        ]
        self.next_tokens = after[0] if after else None
        cut = [
            ts for kind, ts, *_ in later if kind == "PREEMPTED" and ts >= (self.rescheduled or float("inf"))
        ]
        ends = [ts for ts in (self.next_tokens, cut[0] if cut else None) if ts is not None]
        self.recompute_end = min(ends) if ends else None
        firsts = [ts for kind, ts, *_ in entries if kind == "TOKENS"]
        self.before_first_token = not firsts or self.preempted < firsts[0]


def vllm_preemptions(run: dict[str, Any], request_id: str) -> list[Preemption]:
    """The request's preemptions as vLLM's engine core reported them, in time order."""
    entries = sorted(run["vllm_timeline"].get(request_id, []), key=lambda e: e[1])
    return [Preemption(entries, k) for k, entry in enumerate(entries) if entry[0] == "PREEMPTED"]
