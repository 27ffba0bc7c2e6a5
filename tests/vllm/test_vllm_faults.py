"""How the vLLM integration fails when one of vLLM's internals moved: full telemetry, or a loud stop.

drive_faults.py changes one target in the real vLLM (an output field, an enum member, an argument, a
patched method, the API server's module) before ``instrument()``, then drives four real requests
through vLLM's scheduler and output processor. Each case must end in one of two ways: every request
traced as without the change, or a stop that says so, with the failure counted in
``otel_llm.integration.errors`` and no trace that looks whole (a request in flight at the stop ends as
``abandoned``). Never some requests traced and no word. vLLM's classes are as they were after each.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.vllm.conftest import VLLM_PYTHON, needs_vllm

DRIVER = Path(__file__).with_name("drive_faults.py")
STOPPED = ("stopped the vLLM integration", "the vLLM integration does nothing")

pytestmark = needs_vllm


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    out = tmp_path_factory.mktemp("vllm-faults") / "faults.json"
    proc = subprocess.run(
        [str(VLLM_PYTHON), str(DRIVER), str(out)], cwd=out.parent, capture_output=True, text=True, timeout=300
    )
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        pytest.fail(f"drive_faults.py exited {proc.returncode}; its output is above")
    return json.loads(out.read_text())


def test_unchanged_vllm_traces_every_request_and_counts_nothing(cases: dict[str, dict[str, Any]]) -> None:
    run = cases["none"]
    assert sorted(run["requests"]) == run["vllm_requests"]
    assert sorted(run["requests"].values()) == ["abort", "length", "length", "stop"]
    assert run["warnings"] == [] and run["errors_added"] == {}
    assert run["instrumented_at_end"] and run["restored"]


@pytest.mark.parametrize(
    "case",
    [
        "output_field",
        "output_field_mid_run",
        "output_field_declared",
        "enum_member",
        "argument",
        "patched_method",
        "stats_method",
        "serve_module",
    ],
)
def test_a_moved_internal_ends_in_full_telemetry_or_a_loud_counted_stop(
    cases: dict[str, dict[str, Any]], case: str
) -> None:
    run, whole = cases[case], cases["none"]["requests"]
    assert run["errors_added"], "the failure is not counted"
    assert sum(run["errors"].values()) >= sum(run["errors_added"].values())  # exported as a metric too
    assert run["warnings"], "nothing said"
    assert run["restored"], "a patched attribute is not vLLM's original after uninstrument()"
    stops = [w for w in run["warnings"] if any(s in w for s in STOPPED)]
    if run["requests"] == whole:  # full telemetry: what was lost (the engine's own state) is said once
        assert not stops and len(run["warnings"]) == 1
        return
    assert len(stops) == 1, run["warnings"]
    assert not run["instrumented_at_end"]
    # A request that ended before the failure is whole (its reason as without the change); one in
    # flight at the stop ends as abandoned; one after it is not traced.
    looking_whole = {
        rid: reason for rid, reason in run["requests"].items() if reason not in ("abandoned", whole[rid])
    }
    assert not looking_whole, f"traced as if whole after a failure: {looking_whole}"


def test_a_stop_with_requests_in_flight_ends_them_as_abandoned(cases: dict[str, dict[str, Any]]) -> None:
    """The failure comes at step 6, with requests open: those end as abandoned; those that had finished
    keep their traces, as without the change."""
    run, whole = cases["output_field_mid_run"], cases["none"]["requests"]
    abandoned = sorted(rid for rid, reason in run["requests"].items() if reason == "abandoned")
    finished = {rid: reason for rid, reason in run["requests"].items() if reason != "abandoned"}
    assert abandoned and sorted([*abandoned, *finished]) == sorted(whole)
    assert all(whole[rid] == reason for rid, reason in finished.items())
    assert run["errors_added"] == {"OutputProcessor.process_outputs": 1}


def test_each_case_changes_what_it_says(cases: dict[str, dict[str, Any]]) -> None:
    """The warnings name the target each case removed or renamed (so each case tests what it claims)."""
    named = {
        "output_field_declared": "EngineCoreOutput.events",
        "enum_member": "EngineCoreEventType.PREEMPTED",
        "argument": "Scheduler.__init__(log_stats)",
        "patched_method": "OutputProcessor.process_outputs",
        "stats_method": "update_scheduler_stats",
        "serve_module": "vllm.entrypoints.launchers.api_server.entry",
        "output_field": "OutputProcessor.process_outputs",
    }
    for case, name in named.items():
        assert any(name in w for w in cases[case]["warnings"]), (case, cases[case]["warnings"])
