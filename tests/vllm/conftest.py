"""Shared for the vLLM tests: one run of drive_scheduler.py per vLLM release and export mode, and views
of its results.

The scheduler tier runs on several vLLM releases in one session: by default the two ends of the tested
range (``otel_llm.integrations.versions.VLLM.tested``), each in its own virtualenv,
``.venv-vllm-VERSION``, which ``tests/vllm/make_env.sh VERSION`` builds. ``OTEL_LLM_VLLM_VERSIONS``
names other releases (``0.35.0``, or ``0.30.0,0.34.0``); ``OTEL_LLM_VLLM_PYTHON`` runs the tier on one
interpreter alone, which must have this checkout installed, editable, because vLLM finds the plugin
through the installed entry points. Every test that takes ``vllm_python`` or ``vllm_runs`` runs once per
release; its id starts with the release. ``drive_scheduler.py`` runs there as a real subprocess and
reports, per scenario, our spans and metrics next to vLLM's own FinishedRequestStats and the engine-core
timeline (events and token batches) vLLM produced in the same run.
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
from otel_llm.integrations.versions import VLLM

REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("drive_scheduler.py")
ENV_VERSIONS = "OTEL_LLM_VLLM_VERSIONS"
ENV_PYTHON = "OTEL_LLM_VLLM_PYTHON"


def scheduler_pythons() -> dict[str, Path]:
    """The interpreters the scheduler tier runs on, by vLLM release (``given`` for OTEL_LLM_VLLM_PYTHON)."""
    given = os.environ.get(ENV_PYTHON)
    if given:
        return {"given": Path(given)}
    listed = os.environ.get(ENV_VERSIONS, "").replace(",", " ").split()
    return {v: REPO / f".venv-vllm-{v}" / "bin" / "python" for v in listed or VLLM.tested}


VLLM_PYTHONS = scheduler_pythons()
VLLM_PYTHON = list(VLLM_PYTHONS.values())[-1]  # the newest listed, for a test that needs one vLLM
ABS = 1e-6  # seconds: float precision for values computed from the same monotonic timestamps
# The driver's scenarios (see its docstring); test_every_scenario_ran checks the list is complete.
SCENARIOS = ("mixed", "prefill_preemption", "speculative", "recompute", "stall", "steady")


def _build_hint(release: str, python: Path) -> str:
    if release == "given":
        return f"{ENV_PYTHON}={python} does not exist"
    return (
        f"vLLM {release}'s virtualenv not found at {python.parent.parent}: build it with "
        f"`bash tests/vllm/make_env.sh {release}` (about 1.3 GB beside a shared 4.7 GB torch tree, a few "
        f"minutes), or name other releases in {ENV_VERSIONS}"
    )


needs_vllm = pytest.mark.skipif(
    not any(p.exists() for p in VLLM_PYTHONS.values()),
    reason="; ".join(_build_hint(r, p) for r, p in VLLM_PYTHONS.items()),
)


@pytest.fixture(scope="session", params=list(VLLM_PYTHONS))
def vllm_release(request: pytest.FixtureRequest) -> str:
    """One vLLM release of the tier (its key in VLLM_PYTHONS); skips, saying how to build it, where its
    virtualenv is missing."""
    python = VLLM_PYTHONS[request.param]
    if not python.exists():
        pytest.skip(_build_hint(request.param, python))
    return request.param


@pytest.fixture(scope="session")
def vllm_python(vllm_release: str) -> Path:
    """The interpreter of that release's virtualenv."""
    return VLLM_PYTHONS[vllm_release]


@pytest.fixture(scope="session", params=["process", "in_process"])
def vllm_runs(
    request: pytest.FixtureRequest,
    vllm_release: str,
    vllm_python: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, dict[str, Any]]:
    """Every scenario's results, from one driver process (importing vLLM takes most of its time), once
    per vLLM release and export mode: ``process`` (the default; the tracker on ``configure()``'s
    providers, the spans and metrics read back from a real OTLP receiver) and ``in_process`` (the tracker
    on the driver's own providers). Every test that reads them runs in each."""
    out = tmp_path_factory.mktemp(f"vllm-{vllm_release}-{request.param}") / "run.json"
    proc = subprocess.run(
        [str(vllm_python), str(DRIVER), str(out), "--print", f"--export-mode={request.param}"],
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
